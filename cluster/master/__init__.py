"""The master side, in rooms by what a line in each may do (upper rooms may import lower):

* :mod:`~cluster.master.run`, :mod:`~cluster.master.daemon`, :mod:`~cluster.master.gate`
  -- processes: one clustermaster invocation and the run it serves; the supervisor and the
  heartbeat listener; the forced command of a restricted node login.
* :mod:`~cluster.master.serve`, :mod:`~cluster.master.end` -- the two phases of a run:
  answering the nodes' requests while it runs; its end, each step once.  Neither imports
  the other.
* :mod:`~cluster.master.state` -- one run's state in memory: who holds which job, what is
  done, and its live status.
* :mod:`~cluster.master.cache` -- results reused from earlier runs, and checked.
* :mod:`~cluster.master.model` -- a run's jobs and results as data, and pure decisions on
  them (order, placement, limits, leases).
* :mod:`~cluster.master.files` -- the formats of the files in the master home and a run's
  folder that the console, the command lines and every room above read.

``pyproject.toml``'s import-linter contracts keep this order (docs/architecture.md).
"""
