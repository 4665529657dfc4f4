"""Restores that need more than one checkpoint: rescaling from another parallelism."""
