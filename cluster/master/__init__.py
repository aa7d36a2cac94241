"""The master side: clustermaster's phases, run state, server, journal, finish."""
