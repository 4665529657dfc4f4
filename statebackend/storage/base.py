"""The storage seam: durable storage rooted at one URL.

Every path given to a :class:`DurableStore` is relative to its root and is checked to stay
under it. Implementations retry transient failures and raise
:class:`statebackend.errors.StorageError` (or a subclass) when they give up.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Transfer:
    """What one upload or download moved."""

    path: str  # relative to the store root
    size: int
    checksum: str  # "crc32:<8 hex>"


class DurableStore(ABC):
    """Durable storage rooted at ``root``; all paths are relative POSIX paths."""

    root: str

    @abstractmethod
    def put_file(self, local_path: str, path: str) -> Transfer:
        """Upload a local file to ``path`` (never overwriting), then verify its size."""

    @abstractmethod
    def get_file(self, path: str, local_path: str, *, size: int | None = None,
                 checksum: str | None = None) -> Transfer:
        """Download ``path`` to ``local_path``; verify size and checksum when given."""

    @abstractmethod
    def put_bytes_atomic(self, path: str, data: bytes) -> None:
        """Publish small content so that a reader sees all of it or nothing."""

    @abstractmethod
    def get_bytes(self, path: str) -> bytes:
        """Read a small file whole; :class:`FileNotFoundError` subclass when absent."""

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def size(self, path: str) -> int | None:
        """Size in bytes, or None when the file does not exist."""

    @abstractmethod
    def delete(self, paths: Iterable[str]) -> None:
        """Delete files; missing ones are fine (idempotent)."""

    @abstractmethod
    def list_dir(self, path: str) -> list[str]:
        """Relative paths of the files directly or recursively under one directory.

        Used only for bounded sweeps (one checkpoint's or one attempt's directory), never
        for the whole store. A missing directory gives an empty list.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release pools and connections."""
