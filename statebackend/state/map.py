"""Map state: user key -> value per grouping key (PySpark's ``MapState``).

One RocksDB entry per user key: ``grouping key + encoded user key + u32 len(grouping
key)`` (see :mod:`.layout`). Iteration merges a prefix scan of RocksDB with this key's
entries in the write cache (found through a per-key index of dirty entries), so it sees
unflushed writes without flushing. Iteration order is the byte order of encoded user keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..keys.layout import length_suffix
from ..keys.values import RowCodec
from .base import EXPIRY, KeyedState
from .host import StateHost

__all__ = ["MapState"]

_unpack_exp = EXPIRY.unpack_from


class MapState(KeyedState):
    """A map from user-key tuples to value tuples per grouping key."""

    kind = "map"

    def __init__(self, backend: StateHost, name: str, key_codec: RowCodec,
                 value_codec: RowCodec, ttl_ms: int | None) -> None:
        super().__init__(backend, name, ttl_ms)
        self.key_codec = key_codec
        self.value_codec = value_codec
        self._groups = backend._bind_groups(name)

    # --- PySpark's MapState ----------------------------------------------------------------

    def exists(self) -> bool:
        """Whether the current key has at least one (non-expired) entry."""
        return next(self._entries(), None) is not None

    def getValue(self, key: Any) -> tuple[Any, ...] | None:  # noqa: N802 - PySpark's name
        """The value of user key ``key``, or None."""
        raw = self._live(self._read(self._entry_key(key)))
        return None if raw is None else self.value_codec.decode(raw)

    def containsKey(self, key: Any) -> bool:  # noqa: N802 - PySpark's name
        """Whether user key ``key`` has a (non-expired) value."""
        return self._live(self._read(self._entry_key(key))) is not None

    def updateValue(self, key: Any, value: Any) -> None:  # noqa: N802 - PySpark's name
        """Set the value of user key ``key`` (resets that entry's TTL)."""
        rk = self._entry_key(key)
        raw = self.value_codec.encode(value)
        if self.ttl_ms is not None:
            expiry = self._backend._clock() + self.ttl_ms
            raw = self._stamp(expiry) + raw
            self._index_ttl(rk, expiry)
        self._set(rk, raw)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """``(user key, value)`` pairs of the current key, as of this call."""
        kd, vd = self.key_codec.decode, self.value_codec.decode
        n = len(self._key())
        return iter([(kd(k[n:-4]), vd(v)) for k, v in self._entries()])

    def keys(self) -> Iterator[tuple[Any, ...]]:
        """User keys of the current key, as of this call."""
        kd = self.key_codec.decode
        n = len(self._key())
        return iter([kd(k[n:-4]) for k, _ in self._entries()])

    def values(self) -> Iterator[tuple[Any, ...]]:
        """Values of the current key, as of this call."""
        vd = self.value_codec.decode
        return iter([vd(v) for _, v in self._entries()])

    def removeKey(self, key: Any) -> None:  # noqa: N802 - PySpark's name
        """Remove user key ``key``."""
        self._set(self._entry_key(key), None)

    def clear(self) -> None:
        """Remove every entry of the current key."""
        for k in self._all_keys():
            self._set(k, None)

    # --- helpers ---------------------------------------------------------------------------

    def _entry_key(self, user_key: Any) -> bytes:
        gk = self._key()
        return gk + self.key_codec.encode(user_key) + length_suffix(gk)

    def _set(self, rk: bytes, raw: bytes | None) -> None:
        gk = self._backend._current_key
        assert gk is not None
        group = self._groups.get(gk)
        if group is None:
            group = self._groups[gk] = set()
        group.add(rk)
        self._write(rk, raw)

    def _merged(self) -> dict[bytes, bytes | None]:
        """RocksDB entries of the current key overlaid with its dirty entries."""
        gk = self._key()
        suffix = length_suffix(gk)
        merged: dict[bytes, bytes | None] = {
            k: v for k, v in self._backend._instance.scan_prefix(self.name, gk)
            if k.endswith(suffix)}  # a longer grouping key's entries end differently
        if self._versions is not None:
            normalize = self._versions.normalize
            merged = {k: normalize(v) for k, v in merged.items()}
        dirty = self._dirty
        for k in self._groups.get(gk, ()):
            merged[k] = dirty[k]
        return merged

    def _all_keys(self) -> list[bytes]:
        return [k for k, v in self._merged().items() if v is not None]

    def _entries(self) -> Iterator[tuple[bytes, bytes]]:
        """Live ``(RocksDB key, value payload)`` pairs of the current key, in key order."""
        merged = self._merged()
        now = self._backend._clock() if self.ttl_ms is not None else 0
        xo, po = self._xo, self._po
        for k in sorted(merged):
            v = merged[k]
            if v is None:
                continue
            if self.ttl_ms is not None:
                if _unpack_exp(v, xo)[0] <= now:
                    continue
                v = v[po:]
            yield k, v

    def _purge(self, key: bytes, now: int) -> int:
        raw = self._read(key)
        if raw is not None and _unpack_exp(raw, self._xo)[0] <= now:
            # The tombstone must be indexed under its grouping key for merged scans.
            gk = key[:int.from_bytes(key[-4:], "big")]
            self._groups.setdefault(gk, set()).add(key)
            self._write(key, None)
            return 1
        return 0
