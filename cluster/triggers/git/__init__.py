"""Commit runs: the git commands, the ledger, polling, export, the hook."""
