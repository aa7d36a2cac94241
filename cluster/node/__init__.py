"""The node side: run.py's engine, slots, pull loop, heartbeat, transport; no master code."""
