"""The end of a run, step by step and each step once: its table, report, stream tables,
cache and archived sweep results.  Never serves a request."""
