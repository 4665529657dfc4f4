"""List state: a list of tuples per grouping key (PySpark's ``ListState``).

The whole list is one RocksDB value, a concatenation of ``varint length + element``;
with a TTL every element is ``expiry (8 bytes) + encoded tuple``, so elements expire one
by one. One value per key is what lets :meth:`KeyedStateBackend.prefetch` multi-get lists,
and appends are a bytes concatenation in the write cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import StateError
from ..keys.values import RowCodec, decode_varint, encode_varint
from .base import EXPIRY, KeyedState
from .host import StateHost

__all__ = ["ListState"]

_unpack_exp = EXPIRY.unpack_from


def _elements(raw: bytes) -> Iterator[bytes]:
    pos, end = 0, len(raw)
    while pos < end:
        n = raw[pos]
        pos += 1
        if n >= 128:
            n, pos = decode_varint(raw, pos - 1)
        yield raw[pos:pos + n]
        pos += n


class ListState(KeyedState):
    """A list of tuples per grouping key."""

    kind = "list"
    _elements = True

    def __init__(self, backend: StateHost, name: str, codec: RowCodec,
                 ttl_ms: int | None) -> None:
        super().__init__(backend, name, ttl_ms)
        self.codec = codec

    def exists(self) -> bool:
        """Whether the current key's list has at least one (non-expired) element."""
        raw = self._read(self._key())
        if raw is None:
            return False
        if self.ttl_ms is None:
            return True
        now, xo = self._backend._clock(), self._xo
        return any(_unpack_exp(e, xo)[0] > now for e in _elements(raw))

    def get(self) -> Iterator[tuple[Any, ...]]:
        """An iterator over the current key's elements, in insertion order.

        The elements are read when ``get`` is called: later changes do not affect it.
        """
        raw = self._read(self._key())
        if raw is None:
            return iter(())
        decode = self.codec.decode
        if self.ttl_ms is None:
            return iter([decode(e) for e in _elements(raw)])
        now, xo, po = self._backend._clock(), self._xo, self._po
        return iter([decode(e[po:]) for e in _elements(raw) if _unpack_exp(e, xo)[0] > now])

    def put(self, new_state: Iterable[Any]) -> None:
        """Replace the current key's list (every element's TTL restarts).

        Raises
        ------
        StateError
            When ``new_state`` is empty (as Spark; use :meth:`clear` to remove the list).
        SchemaError
            When an element does not match the schema.
        """
        key = self._key()
        self._write(key, self._encode_all(key, new_state, "put"))

    def appendValue(self, new_state: Any) -> None:  # noqa: N802 - PySpark's name
        """Append one element to the current key's list."""
        key = self._key()
        tail = self._encode_all(key, (new_state,), "appendValue")
        old = self._read(key)
        self._write(key, tail if old is None else old + tail)

    def appendList(self, new_state: Iterable[Any]) -> None:  # noqa: N802 - PySpark's name
        """Append elements to the current key's list.

        Raises
        ------
        StateError
            When ``new_state`` is empty (as Spark).
        """
        key = self._key()
        tail = self._encode_all(key, new_state, "appendList")
        old = self._read(key)
        self._write(key, tail if old is None else old + tail)

    def clear(self) -> None:
        """Remove the current key's list."""
        self._write(self._key(), None)

    # --- helpers ---------------------------------------------------------------------------

    def _encode_all(self, key: bytes, values: Iterable[Any], op: str) -> bytes:
        if values is None or isinstance(values, (str, bytes, dict)):
            raise StateError(f"list state {self.name!r}: {op} expects a list of tuples, "
                             f"got {type(values).__name__}")
        encode = self.codec.encode
        parts: list[bytes] = []
        prefix = b""
        if self.ttl_ms is not None:
            expiry = self._backend._clock() + self.ttl_ms
            prefix = self._stamp(expiry)
        for v in values:
            e = prefix + encode(v)
            parts.append(encode_varint(len(e)))
            parts.append(e)
        if not parts:
            raise StateError(f"list state {self.name!r}: {op} got an empty list; Spark "
                             f"refuses empty list values (use clear() to remove the list)")
        if self.ttl_ms is not None:
            self._index_ttl(key, expiry)
        return b"".join(parts)

    def _purge(self, key: bytes, now: int) -> int:
        """Drop the expired elements of ``key``'s list; the number dropped."""
        raw = self._read(key)
        if raw is None:
            return 0
        kept: list[bytes] = []
        dropped = 0
        xo = self._xo
        for e in _elements(raw):
            if _unpack_exp(e, xo)[0] <= now:
                dropped += 1
            else:
                kept.append(encode_varint(len(e)))
                kept.append(e)
        if dropped:
            self._write(key, b"".join(kept) if kept else None)
        return dropped
