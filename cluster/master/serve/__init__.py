"""Serving a run: the TCP listener, the checks and handling of each node request, a sweep's
results with their files, and the confirm phase."""
