"""Process plumbing shared by master and node: clock, files, processes, daemons."""
