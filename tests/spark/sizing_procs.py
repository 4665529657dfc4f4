"""The map_in_pandas function of the Spark-level level-sizing test, and the small thresholds
its workers use.

Level sizing starts at 256 MiB of bottom level and a load is compacted before its
snapshot from 64 MiB of level 0: sizes no test of seconds reaches. Importing this module
(the driver does, and every Python worker does when it unpickles :func:`vector_count`)
lowers both thresholds, only for instances whose directory contains :data:`MARKER`, so
the workers Spark reuses for other tests keep the real thresholds.
"""

from __future__ import annotations

import functools

import processors as P

from statebackend.rocksdb import instance as rocks_instance
from statebackend.rocksdb import options as rocks_options

MARKER = "sizing-spark-marker"
SIZED_FROM = 16 << 10
BULK_LOAD_MIN_BYTES = 3 << 20  # above a memtable's first arena block (1 MiB)


def _scoped(name: str, module, constant: str, value: int) -> None:
    method = getattr(rocks_instance.RocksDBInstance, name)
    if getattr(method, "_sizing_scoped", False):
        return

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if MARKER not in self.path:
            return method(self, *args, **kwargs)
        old = getattr(module, constant)
        setattr(module, constant, value)
        try:
            return method(self, *args, **kwargs)
        finally:
            setattr(module, constant, old)

    wrapper._sizing_scoped = True  # type: ignore[attr-defined]
    setattr(rocks_instance.RocksDBInstance, name, wrapper)


_scoped("size_levels", rocks_options, "SIZED_FROM", SIZED_FROM)
_scoped("compact_bulk_load", rocks_instance, "BULK_LOAD_MIN_BYTES", BULK_LOAD_MIN_BYTES)


def vector_count(frames, state):
    """The shared running count (:func:`processors.vector_count`), defined here so that a
    worker unpickling it imports this module and its thresholds."""
    yield from P.vector_count(frames, state)
