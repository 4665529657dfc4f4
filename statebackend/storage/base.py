"""The storage seam: durable storage rooted at one URL.

Every path given to a :class:`DurableStore` is relative to its root and is checked to stay
under it. Implementations retry transient failures and raise
:class:`statebackend.errors.StorageError` (or a subclass) when they give up.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import FencingUnsupportedError, StorageError
from .accounting import RequestCounts


class StoreFileNotFoundError(StorageError, FileNotFoundError):
    """A file asked of a :class:`DurableStore` does not exist.

    Both a :class:`~statebackend.errors.StorageError` and a builtin ``FileNotFoundError``,
    so callers may catch either.
    """


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

    # --- additive API with portable defaults -----------------------------------------
    # Implementations override these with parallel or cheaper versions; the defaults keep
    # minimal stores (test doubles) usable.

    def put_files(self, pairs: Iterable[tuple[str, str]], *,
                  background: bool = False) -> list[Transfer]:
        """Upload ``(local_path, path)`` pairs; results in input order.

        All transfers have finished (or been cancelled) when this returns or raises.
        ``background``: uploads no batch waits for (a background materialization), on
        threads of their own where the store has a pool, so that a batch's uploads never
        queue behind them.
        """
        return [self.put_file(local, path) for local, path in pairs]

    def get_files(self, items: Iterable[Sequence[object]]) -> list[Transfer]:
        """Download ``(path, local_path[, size[, checksum]])`` items; results in input order."""
        return list(self.get_files_each(items))

    def get_files_each(self, items: Iterable[Sequence[object]]) -> Iterator[Transfer]:
        """:meth:`get_files`, each :class:`Transfer` handed back (in input order) as soon
        as it and those before it are in, while the store brings the rest down (all
        queued at once where the store transfers in parallel). Closing the iterator early
        cancels what has not begun and waits for what has."""
        for item in items:
            path, local, size, checksum = _expand_get(item)
            yield self.get_file(path, local, size=size, checksum=checksum)

    def get_bytes_many(self, paths: Sequence[str],
                       then: Callable[[str, bytes | None], Any] | None = None) -> list[Any]:
        """Read small files whole, in parallel where the store can; None for a missing one.

        Results are in input order. ``then(path, data)``, when given, runs on each result in
        the reading thread (parsing overlaps the other reads) and its value is returned."""
        out: list[Any] = []
        for p in paths:
            try:
                data: bytes | None = self.get_bytes(p)
            except FileNotFoundError:
                data = None
            out.append(data if then is None else then(p, data))
        return out

    def sizes(self, paths: Sequence[str]) -> list[int | None]:
        """:meth:`size` of each path, in parallel where the store can; in input order."""
        return [self.size(p) for p in paths]

    @property
    def supports_exclusive_create(self) -> bool:
        """Whether :meth:`create_exclusive` is a real compare-and-set on this store."""
        return False

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` only if no file is there: a compare-and-set
        the store itself arbitrates (``O_EXCL``/``link`` locally, ``If-None-Match: *`` on
        S3). Returns True when this call created it, False when it existed (after a lost
        answer and a retry that may be our own earlier try: compare the content).

        Raises
        ------
        FencingUnsupportedError
            The store offers no such primitive.
        """
        raise FencingUnsupportedError(
            f"{type(self).__name__} at {self.root} offers no atomic create-if-absent, so "
            f"one writer per state location cannot be enforced; use a local directory, "
            f"memory:// or s3://, or pass StateBackendOptions(fencing=False) to run without "
            f"fencing (then never let two queries write one location)")

    def child(self, prefix: str) -> DurableStore:
        """A store rooted at ``<root>/<prefix>`` (sharing connections when possible)."""
        raise NotImplementedError(f"{type(self).__name__} does not support child stores")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release pools and connections."""

    def request_counts(self) -> RequestCounts | None:
        """Object-store requests made so far in this process (None: not counted here).

        Callers take the difference of two readings around a piece of work."""
        return None


def _expand_get(item: Sequence[object]) -> tuple[str, str, int | None, str | None]:
    """Normalise a ``get_files`` item to ``(path, local_path, size, checksum)``."""
    if not 2 <= len(item) <= 4:
        raise ValueError(f"get_files item {item!r}: expected (path, local_path[, size[, checksum]])")
    padded = list(item) + [None] * (4 - len(item))
    path, local, size, checksum = padded
    return str(path), str(local), (None if size is None else int(size)), (  # type: ignore[call-overload]
        None if checksum is None else str(checksum))
