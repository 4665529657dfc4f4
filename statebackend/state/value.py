"""Value state: one tuple per grouping key (PySpark's ``ValueState``)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CorruptStateError, StateError
from ..keys import kernels as _kernels
from ..keys.values import RowCodec
from .base import EXPIRY, MISSING, KeyedState, no_current_key
from .host import StateHost

__all__ = ["BlockState", "MAX_BLOCKS", "ValueState", "decode_block", "dense_unique",
           "is_block_count"]

_unpack_exp = EXPIRY.unpack_from


class ValueState(KeyedState):
    """A single value per grouping key.

    RocksDB key: the grouping key. RocksDB value: the encoded tuple, prefixed by its
    expiry (epoch ms) when the state has a TTL.
    """

    kind = "value"

    def __init__(self, backend: StateHost, name: str, codec: RowCodec,
                 ttl_ms: int | None) -> None:
        super().__init__(backend, name, ttl_ms)
        self.codec = codec
        self._encode = codec.encode
        self._decode = codec.decode

    # --- PySpark's ValueState --------------------------------------------------------------

    def exists(self) -> bool:
        """Whether the current key has a (non-expired) value."""
        return self._live(self._read(self._key())) is not None

    def get(self) -> tuple[Any, ...] | None:
        """The value of the current key, or None when it has none (or it expired)."""
        # Inlined cache lookups: this is the per-row hot path.
        key = self._backend._current_key
        if key is None:
            raise no_current_key(self.name)
        raw = self._dirty.get(key, MISSING)
        if raw is MISSING:
            raw = self._clean.get(key, MISSING)
            if raw is MISSING:
                raw = self._cf.get(key)
                self._clean[key] = raw
        if raw is None:
            return None
        if self.ttl_ms is not None:
            raw = self._live(raw)
            if raw is None:
                return None
        return self._decode(raw)

    def update(self, new_value: Any) -> None:
        """Set the value of the current key (resets its TTL).

        Raises
        ------
        SchemaError
            When ``new_value`` does not match the schema.
        """
        key = self._backend._current_key
        if key is None:
            raise no_current_key(self.name)
        raw = self._encode(new_value)
        if self.ttl_ms is not None:
            expiry = self._backend._clock() + self.ttl_ms
            raw = self._stamp(expiry) + raw
            self._index_ttl(key, expiry)
        self._dirty[key] = raw
        b = self._backend
        b._n_writes += 1
        if b._n_writes >= b.max_dirty_entries:
            b.flush()

    def clear(self) -> None:
        """Remove the value of the current key."""
        self._write(self._key(), None)

    # --- batch-at-a-time -------------------------------------------------------------------

    def get_many(self, keys: Sequence[bytes]) -> list[tuple[Any, ...] | None]:
        """Values of ``keys`` (independent of the current key), one multi-get for misses."""
        decode = self._decode
        return [None if r is None else decode(r) for r in self.get_many_raw(keys)]

    def get_many_raw(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Encoded values of ``keys`` without their expiry; None when absent or expired.

        For callers that decode whole columns at once (see :class:`~.codec.FixedColumns`).
        """
        dirty, clean = self._dirty, self._clean
        if not dirty and not clean:
            # Nothing cached yet (the first read of a batch): straight to RocksDB.
            raws = self._cf.get(keys if keys.__class__ is list else list(keys))
            clean.update(zip(keys, raws))
            return raws if self.ttl_ms is None else self._unexpired(raws)
        # Comprehensions, not a loop with branches: this runs once per key of a batch.
        raws = [dirty.get(k, MISSING) for k in keys]
        missing = [i for i, r in enumerate(raws) if r is MISSING]
        if missing:
            cget = clean.get
            for i in missing:
                raws[i] = cget(keys[i], MISSING)
            missing = [i for i in missing if raws[i] is MISSING]
        if missing:
            wanted = [keys[i] for i in missing]
            fetched = self._cf.get(wanted)
            for i, raw in zip(missing, fetched):
                raws[i] = raw
            clean.update(zip(wanted, fetched))
        return raws if self.ttl_ms is None else self._unexpired(raws)

    def _unexpired(self, raws: list[bytes | None]) -> list[bytes | None]:
        """Stored entries without their expiry prefix; None for absent or expired ones."""
        now = self._backend._clock()
        xo, po = self._xo, self._po
        return [None if r is None or _unpack_exp(r, xo)[0] <= now else r[po:] for r in raws]

    def put_many(self, keys: Sequence[bytes], values: Sequence[Any]) -> None:
        """Set ``keys[i]`` to ``values[i]`` (independent of the current key)."""
        if len(keys) != len(values):
            raise StateError(f"state {self.name!r}: put_many got {len(keys)} keys and "
                             f"{len(values)} values")
        encode = self._encode
        # Validate everything before writing anything.
        self.put_many_raw(keys, [encode(v) for v in values])

    def put_many_raw(self, keys: Sequence[bytes], payloads: Sequence[bytes]) -> None:
        """Set ``keys[i]`` to the already encoded ``payloads[i]`` (TTL prefix added here)."""
        if len(keys) != len(payloads):
            raise StateError(f"state {self.name!r}: put_many got {len(keys)} keys and "
                             f"{len(payloads)} values")
        dirty = self._dirty
        if self.ttl_ms is not None:
            expiry = self._backend._clock() + self.ttl_ms
            prefix = self._stamp(expiry)
            payloads = [prefix + e for e in payloads]
            for k in keys:
                self._index_ttl(k, expiry)
        if dirty.__class__ is dict:
            dirty.update(zip(keys, payloads))
        else:  # a dropped state's stand-in raises on item assignment (but not on update)
            for k, e in zip(keys, payloads):
                dirty[k] = e
        self._note_writes(len(keys))

    def delete_many(self, keys: Sequence[bytes]) -> None:
        """Remove the values of ``keys``."""
        dirty = self._dirty
        if dirty.__class__ is dict:
            dirty.update(dict.fromkeys(keys))
        else:  # a dropped state's stand-in raises on item assignment (but not on update)
            for k in keys:
                dirty[k] = None
        self._note_writes(len(keys))

    # --- helpers ---------------------------------------------------------------------------

    def _note_writes(self, n: int) -> None:
        b = self._backend
        b._n_writes += n
        if b._n_writes >= b.max_dirty_entries:
            b.flush()

    def _purge(self, key: bytes, now: int) -> int:
        """TTL purge of one entry: 1 when it was expired and removed."""
        raw = self._read(key)
        if raw is not None and _unpack_exp(raw, self._xo)[0] <= now:
            self._write(key, None)
            return 1
        return 0


MAX_BLOCKS = 0xFFFF
_BLOCK_KEY = struct.Struct(">HH")


def is_block_count(blocks: Any) -> bool:
    """Whether ``blocks`` is a valid number of value blocks per key group (an int, not a
    bool, in 1..MAX_BLOCKS)."""
    return isinstance(blocks, int) and not isinstance(blocks, bool) and 1 <= blocks <= MAX_BLOCKS


def dense_unique(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` (int64 slots) without sorting when the ids
    span a small range, as a partition's block ids do (its key groups x blocks)."""
    if not len(ids):
        return ids, ids.copy()
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo > 4 * len(ids) + 65_536:
        distinct, slots = np.unique(ids, return_inverse=True)
        return distinct, slots.astype(np.int64, copy=False).reshape(-1)
    offset = ids - lo
    present = np.zeros(hi - lo + 1, dtype=bool)
    present[offset] = True
    rank = np.cumsum(present, dtype=np.int64) - 1
    return np.flatnonzero(present) + lo, rank[offset]


def decode_block(state: str, block_key: bytes, raw: bytes) -> dict[bytes, bytes]:
    """The entries of one stored value block of ``state``.

    Raises
    ------
    CorruptStateError
        When the block does not decode.
    """
    try:
        return _kernels.unpack_block(raw)
    except ValueError as exc:
        where = (f"block {int.from_bytes(block_key[2:], 'big')} of key group "
                 f"{int.from_bytes(block_key[:2], 'big')}" if len(block_key) == 4
                 else f"block {block_key!r}")
        raise CorruptStateError(f"state {state!r}: value {where} is corrupt ({exc})") from exc


class BlockState(ValueState):
    """The values of many grouping keys packed into a fixed number of RocksDB entries per
    key group: one Python-to-RocksDB call per block instead of one per key.

    RocksDB key: 2-byte key group, then the 2-byte block number within it
    (``block_ids`` in :mod:`statebackend.keys.kernels` picks it from a hash of the grouping
    key). RocksDB value: a value block, ``grouping key -> encoded value`` for every key of
    that block. Blocks live inside their key group, so checkpoints, savepoints and
    rescaling (which move whole key groups) treat them like any other entry.

    The trade: a write rewrites the whole block of each key it touches. That pays when a
    batch touches a large share of the keys (vectorised operators); when it touches a few
    keys of a large state, per-key entries (:class:`ValueState`) upload far less per
    checkpoint. No TTL.

    Entries are never turned into Python objects except the values asked for: the
    kernels (:mod:`statebackend.keys.kernels`) search and merge the stored bytes.
    """

    kind = "blocks"

    def __init__(self, backend: StateHost, name: str, codec: RowCodec,
                 blocks: int) -> None:
        super().__init__(backend, name, codec, None)
        self.blocks = blocks
        self._key_memo: dict[int, bytes] = {}

    # The per-key API of ValueState would read a grouping key as a block key: refuse it.
    # (get_many_raw / put_many_raw / delete_many stay: they address whole blocks.)
    def _per_key(self, *_args: Any, **_kw: Any) -> Any:
        raise StateError(f"state {self.name!r} keeps its values in blocks: use get_entries / "
                         f"put_entries (or KeyedColumnState), not the per-key API")

    get = update = clear = exists = get_many = put_many = _per_key  # type: ignore[assignment]

    def _block_keys(self, ids: list[int]) -> list[bytes]:
        """RocksDB keys of blocks ``ids`` (memoised: a partition has few blocks)."""
        memo = self._key_memo
        for b in ids:
            if b not in memo:
                memo[b] = _BLOCK_KEY.pack(*divmod(b, self.blocks))
        return [memo[b] for b in ids]

    def _blocks_of(self, keys: list[bytes]) -> tuple[list[bytes], list[bytes | None], np.ndarray]:
        """``(RocksDB keys of the blocks of keys, their stored blocks, each key's index
        among them)``; reads go through the value cache, so a batch's put after its get
        reads nothing again."""
        ids = np.empty(len(keys), dtype=np.int64)
        _kernels.block_ids(keys, ids, self.blocks)
        distinct, slots = dense_unique(ids)
        block_keys = self._block_keys(distinct.tolist())
        return block_keys, self.get_many_raw(block_keys), slots

    def get_entries(self, keys: list[bytes]) -> list[bytes | None]:
        """Encoded values of grouping ``keys`` (None when absent), in order."""
        block_keys, blobs, slots = self._blocks_of(keys)
        try:
            out = _kernels.blocks_get(blobs, slots, keys)
        except ValueError as exc:
            raise self._corrupt(block_keys, blobs, exc) from exc
        if self._versions is not None:  # entries of earlier schema versions, converted
            out = list(map(self._versions.normalize, out))
        return out

    def put_entries(self, keys: list[bytes], payloads: Sequence[bytes | None]) -> None:
        """Set ``keys[i]`` to ``payloads[i]`` (None removes it; the last of equal keys
        wins); rewrites each touched block."""
        if len(keys) != len(payloads):
            raise StateError(f"state {self.name!r}: got {len(keys)} keys and "
                             f"{len(payloads)} values")
        block_keys, blobs, slots = self._blocks_of(keys)
        try:
            new = _kernels.blocks_put(blobs, slots, keys, list(payloads))
        except ValueError as exc:
            raise self._corrupt(block_keys, blobs, exc) from exc
        full = [i for i, b in enumerate(new) if b is not None]
        if len(full) == len(new):
            self.put_many_raw(block_keys, new)  # type: ignore[arg-type]
            return
        if full:
            self.put_many_raw([block_keys[i] for i in full], [b for b in new if b is not None])
        self.delete_many([k for k, b in zip(block_keys, new) if b is None])

    def delete_entries(self, keys: list[bytes]) -> None:
        """Remove grouping ``keys`` (rewrites each touched block)."""
        self.put_entries(keys, [None] * len(keys))

    def _corrupt(self, block_keys: list[bytes], blobs: list[bytes | None],
                 exc: ValueError) -> CorruptStateError:
        """The error naming the corrupt block (the kernel only says that one is)."""
        for bk, raw in zip(block_keys, blobs):
            if raw is not None:
                try:
                    decode_block(self.name, bk, raw)
                except CorruptStateError as named:
                    return named
        return CorruptStateError(f"state {self.name!r}: a value block is corrupt ({exc})")

