"""How runs enter the queues: user droppings, clusterpush, cron auto runs, git commits."""
