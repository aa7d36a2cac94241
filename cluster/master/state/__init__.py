"""One run's state as the master holds it: which node holds which job, what is done, and
the live status the console shows."""
