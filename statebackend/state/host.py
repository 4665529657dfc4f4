"""What a state object needs from the backend that created it, as a Protocol.

The states (value, list, map, reducing, timers, TTL) are built by
:class:`statebackend.state.backend.KeyedStateBackend` and call back into it: the current
key, the write and read caches of a column family, the TTL clock. Typing that back edge
with the backend class itself made the eight modules of this package import each other in
a cycle; they name this protocol instead, which only the backend implements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..model.manifest import StateDescriptor
    from ..rocksdb.instance import RocksDBInstance

__all__ = ["StateHost"]


class StateHost(Protocol):
    """The backend side of a state: what :mod:`statebackend.state` modules call."""

    _instance: RocksDBInstance
    _current_key: bytes | None
    _meta: dict[str, StateDescriptor]
    _states: dict[str, Any]
    _ttl_dirty: dict[bytes, bytes | None]
    _n_writes: int
    max_dirty_entries: int

    def _clock(self) -> int: ...

    def _bind(self, cf: str) -> tuple[Any, dict[bytes, bytes | None],
                                      dict[bytes, bytes | None]]: ...

    def _bind_groups(self, cf: str) -> dict[bytes, set[bytes]]: ...

    def _note_write(self, n: int = 1) -> None: ...

    def flush(self) -> None: ...

    def set_current_key(self, key: bytes | None) -> None: ...
