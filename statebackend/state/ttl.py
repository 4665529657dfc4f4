"""TTL with Spark's semantics, and the purge of expired entries.

Every write to a TTL state stamps the value (or the list element, or the map entry) with
``expiry = clock() + ttl_ms``; a value whose expiry is ``<= clock()`` is never returned.
Reads filter, so correctness never depends on purging; purging reclaims space.

Each write also records ``key group + expiry + state + RocksDB key`` in the ``_ttl`` index
column family. :func:`purge_expired` scans, per key group, only the index entries whose
expiry has passed, so its work is bounded by what expired, not by the state size. An index
entry may be stale (the value was rewritten later with a new expiry, or cleared): the purge
checks the entry's current expiry before removing anything, then drops the index entry.
"""

from __future__ import annotations

from ..keys.layout import encode_ts, split_ttl_index_key
from .host import StateHost
from .timers import key_groups

__all__ = ["TTL_CF", "purge_expired", "validate_ttl"]

TTL_CF = "_ttl"


def validate_ttl(name: str, ttl_ms: int | None) -> int | None:
    """``ttl_ms`` as an int, or None; refuses non-positive durations as Spark does."""
    from ..errors import StateError

    if ttl_ms is None:
        return None
    if isinstance(ttl_ms, bool) or not hasattr(ttl_ms, "__index__") or int(ttl_ms) <= 0:
        raise StateError(f"state {name!r}: ttl_ms must be a positive number of milliseconds "
                         f"or None, got {ttl_ms!r}")
    return int(ttl_ms)


def purge_expired(backend: StateHost) -> int:
    """Remove the entries of TTL states whose expiry is ``<= clock()``.

    Flushes first (the index scan reads RocksDB). Index entries of states that are known
    but not declared in this session are kept, so they are purged once the state is
    declared again; those of deleted states are dropped.

    Returns
    -------
    int
        The number of values, list elements and map entries removed.
    """
    backend.flush()
    now = backend._clock()
    inst = backend._instance
    end = encode_ts(now + 1)
    removed = 0
    due: list[bytes] = []
    for kg in list(key_groups(inst, TTL_CF)):
        due.extend(k for k, _ in inst.scan_range(TTL_CF, kg, kg + end))
    for k in due:
        name, rocks_key, _ = split_ttl_index_key(k)
        state = backend._states.get(name)
        if state is None:
            if name in backend._meta:
                continue  # declared again later: purge then
        elif state.ttl_ms is not None:
            removed += state._purge(rocks_key, now)  # type: ignore[attr-defined]
        backend._ttl_dirty[k] = None
        backend._note_write()
    return removed
