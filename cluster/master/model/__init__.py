"""A run's jobs and results as data, and the pure decisions on them: the job list and its
order, placement, limits, leases, the tail's speculative copies, unbuilt programs."""
