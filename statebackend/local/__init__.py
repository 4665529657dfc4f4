"""The local side of one partition's state: working directory, clean marker, secondary
copies (disk.py) and instances kept open between batches (resident.py)."""
