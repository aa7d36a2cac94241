"""What crosses a process boundary between master and node: pure formats."""
