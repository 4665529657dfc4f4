"""What every keyed state shares: its column family, its caches and the current key."""

from __future__ import annotations

import struct
from functools import partial
from typing import Any, ClassVar

from ..errors import StateError
from ..keys.layout import ttl_index_key
from .evolution import TAG_EXPIRY, Versions
from .host import StateHost

__all__ = ["KeyedState", "MISSING", "EXPIRY", "no_current_key"]

#: Marks "not in this cache" (None means "known absent").
MISSING: Any = object()
#: A TTL state value is prefixed with its expiry (epoch ms, int64 LE).
EXPIRY = struct.Struct("<q")


def no_current_key(state: str) -> StateError:
    return StateError(f"state {state!r} was used without a current key: call "
                      f"backend.set_current_key(key) first")


class _Dropped(dict):  # type: ignore[type-arg]
    """Stands in for the caches and handle of a deleted state: any use raises."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def _fail(self, *_: Any, **__: Any) -> Any:
        raise StateError(f"state {self._name!r} was deleted (delete_state); declare it again "
                         f"to use it")

    get = __getitem__ = __setitem__ = __contains__ = setdefault = _fail  # type: ignore[assignment]


class KeyedState:
    """Base of the state types: binds a column family, its write cache and read cache.

    Reads consult the write cache (dirty entries), then the read cache (entries fetched
    before, or prefetched), then RocksDB; a miss is remembered in the read cache.
    """

    kind: ClassVar[str] = ""
    #: Whether each stored value is a list of elements (each with its own schema id).
    _elements: ClassVar[bool] = False

    def __init__(self, backend: StateHost, name: str, ttl_ms: int | None) -> None:
        self._backend = backend
        self.name = name
        self._name_b = name.encode("utf-8")
        self.ttl_ms = ttl_ms
        self._cf, self._dirty, self._clean = backend._bind(name)
        d = backend._meta[name]
        # Where a TTL value's expiry and payload start: after the u16 schema id.
        self._xo, self._po = 2, 10
        #: ``expiry -> prefix`` of a TTL value (schema id and expiry).
        self._stamp = partial(TAG_EXPIRY.pack, d.schema_id)
        #: Set when the state has earlier schema versions: reads return every value in
        #: the current layout (values of other versions are converted as they are read).
        self._versions: Versions | None = None
        if d.history:
            self._versions = Versions(d)
            if self.kind != "blocks":
                self._cf = self._versions.view(self._cf, self._elements)

    # --- plumbing shared by subclasses ---------------------------------------------------

    def _live(self, raw: bytes | None) -> bytes | None:
        """The payload of a single-entry value without its expiry prefix, or None when absent
        or expired (value-like states and map entries store ``expiry + payload`` under TTL)."""
        if raw is None or self.ttl_ms is None:
            return raw
        if EXPIRY.unpack_from(raw, self._xo)[0] <= self._backend._clock():
            return None
        return raw[self._po:]

    def _key(self) -> bytes:
        key = self._backend._current_key
        if key is None:
            raise no_current_key(self.name)
        return key

    def _read(self, key: bytes) -> bytes | None:
        raw = self._dirty.get(key, MISSING)
        if raw is MISSING:
            raw = self._clean.get(key, MISSING)
            if raw is MISSING:
                raw = self._cf.get(key)
                self._clean[key] = raw
        return raw  # type: ignore[no-any-return]

    def _write(self, key: bytes, raw: bytes | None) -> None:
        self._dirty[key] = raw
        b = self._backend
        b._n_writes += 1
        if b._n_writes >= b.max_dirty_entries:
            b.flush()

    def _index_ttl(self, key: bytes, expiry: int) -> None:
        self._backend._ttl_dirty[ttl_index_key(self._name_b, key, expiry)] = b""

    def _drop(self) -> None:
        self._cf = self._dirty = self._clean = _Dropped(self.name)

    def __repr__(self) -> str:
        ttl = f", ttl_ms={self.ttl_ms}" if self.ttl_ms is not None else ""
        return f"{type(self).__name__}({self.name!r}{ttl})"
