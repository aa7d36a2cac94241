"""One clustermaster invocation: the PID-file dance, the choice of run, and the run it
serves from start to end."""
