"""The node gate: what a restricted node's ssh login on the master may do and reach."""
