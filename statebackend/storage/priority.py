"""Critical-path uploads first: background uploads of a process yield to them.

A micro-batch's output waits for its checkpoint's uploads (manifest first, then output:
exactly-once), while changelog mode's materializations upload off the critical path, in
a thread of the same worker process, often hundreds of MB at a time. Sharing the link
evenly with them would make every batch that overlaps a materialization slower. So the
checkpoint marks its uploads with :func:`critical_path`, and a background upload calls
:func:`yield_to_critical_path` before each file: it starts no new file while a
critical-path upload of the process runs (the file already under way finishes, sharing
the link). Only this process's uploads are ordered; Python workers are separate
processes, each with its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_COND = threading.Condition()
_ACTIVE = 0


@contextmanager
def critical_path() -> Iterator[None]:
    """Mark the uploads of the block as on a micro-batch's critical path."""
    global _ACTIVE
    with _COND:
        _ACTIVE += 1
    try:
        yield
    finally:
        with _COND:
            _ACTIVE -= 1
            if _ACTIVE == 0:
                _COND.notify_all()


def yield_to_critical_path(max_wait_s: float = 60.0) -> float:
    """Wait while a critical-path upload of this process runs (at most ``max_wait_s``, so
    a stuck checkpoint cannot starve background work for ever). Returns the seconds
    waited."""
    t0 = time.monotonic()
    with _COND:
        _COND.wait_for(lambda: _ACTIVE == 0, timeout=max_wait_s)
    return time.monotonic() - t0


def critical_uploads() -> int:
    """How many critical-path upload blocks of this process are running now."""
    with _COND:
        return _ACTIVE
