"""The result cache: results of earlier runs reused when nothing that made them changed,
and a sample of them checked."""
