"""The daemons beside the runs: the supervisor loop that starts clustermasters, and the
heartbeat listener with what its answers offer."""
