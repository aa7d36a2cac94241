"""Watching and steering the cluster: the status model read from the master home, the
status page's HTTP server, the admin commands and the terminal view (docs/operating.md,
"Watching and steering the cluster")."""
