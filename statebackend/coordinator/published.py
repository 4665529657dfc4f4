"""The published manifests a coordinator has read: parsed once, with the digest of their
bytes (the record of their checkpoint keeps it), and the listing of the latest checkpoint's
directory taken when it completed (garbage collection's protected set is made from it
instead of listing again at every collection).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from ..errors import CorruptStateError, UnsafePathError
from ..model.manifest import PartitionManifest, manifest_digest
from ..storage.base import DurableStore
from .records import _parse_or_error

log = logging.getLogger("statebackend.coordinator.coordinator")


class PublishedManifests:
    """Manifests published under ``<operator_id>/chk-<n>/`` as read by one coordinator.

    Not thread-safe on its own: the coordinator calls it under its lock (the reads of
    :meth:`read_many` run in the store's threads, each writing its own digest).
    """

    def __init__(self, store: DurableStore, operator_id: str) -> None:
        self.store = store
        self.operator_id = operator_id
        self._by_checkpoint: dict[int, dict[str, PartitionManifest]] = {}
        self._digests: dict[str, str] = {}  # manifest path -> digest of the bytes read
        self._listings: dict[int, frozenset[str]] = {}

    def clear(self) -> None:
        """Forget everything (the records were read again)."""
        self._by_checkpoint.clear()
        self._digests.clear()
        self._listings.clear()

    def _abs(self, rel: str) -> str:
        return f"{self.operator_id}/{rel}"

    # --- reading ----------------------------------------------------------------------

    def read_many(self, checkpoint_id: int, rels: Iterable[str]) -> None:
        """Read (in parallel) the manifests among ``rels`` not read before."""
        cache = self._by_checkpoint.setdefault(checkpoint_id, {})
        todo = [rel for rel in rels if rel not in cache]
        if len(todo) > 1:
            # parsed in the reading threads, while other reads still wait for the store
            parsed = self.store.get_bytes_many([self._abs(r) for r in todo],
                                               then=self._digest_and_parse)
            for rel, m in zip(todo, parsed):
                self._keep(checkpoint_id, rel, m)

    def read(self, checkpoint_id: int, rel: str) -> PartitionManifest | None:
        """The manifest at ``rel`` (None: gone, unreadable, or not this operator's)."""
        cache = self._by_checkpoint.setdefault(checkpoint_id, {})
        if rel in cache:
            return cache[rel]
        try:
            raw = self.store.get_bytes(self._abs(rel))
        except FileNotFoundError:
            raw = None
        return self._keep(checkpoint_id, rel, self._digest_and_parse(self._abs(rel), raw))

    def _digest_and_parse(self, path: str, raw: bytes | None
                          ) -> PartitionManifest | Exception | None:
        """In a reading thread: remember the digest of a manifest's bytes, then parse it."""
        rel = path[len(self.operator_id) + 1:]
        if raw is not None:
            self._digests[rel] = manifest_digest(raw)
        return _parse_or_error(raw, rel)

    def _keep(self, checkpoint_id: int, rel: str,
              raw: bytes | PartitionManifest | Exception | None) -> PartitionManifest | None:
        if raw is None:
            return None  # deleted (aborted) between the listing and the read
        try:
            m = _parse_or_error(raw, rel)
            if isinstance(m, Exception):
                raise m
        except (CorruptStateError, UnsafePathError) as exc:
            log.warning("ignoring unreadable manifest %s: %s", rel, exc)
            return None
        if m.path != rel or m.operator_id != self.operator_id:
            log.warning("ignoring manifest at %s: it describes operator %r path %s",
                        rel, m.operator_id, m.path)
            return None
        self._by_checkpoint.setdefault(checkpoint_id, {})[rel] = m
        return m

    # --- what was read ----------------------------------------------------------------

    def digest(self, rel: str) -> str | None:
        """The digest of the bytes read at ``rel`` (None: not read)."""
        return self._digests.get(rel)

    def of(self, checkpoint_id: int) -> dict[str, PartitionManifest]:
        """Path -> manifest of those read for ``checkpoint_id``."""
        return dict(self._by_checkpoint.get(checkpoint_id, {}))

    def completed(self, checkpoint_id: int, listing: frozenset[str]) -> None:
        """Checkpoint ``checkpoint_id`` completed with ``listing`` of its directory: what
        was read of older ones is not needed any more."""
        for n in [n for n in self._by_checkpoint if n < checkpoint_id]:
            for rel in self._by_checkpoint.pop(n):
                self._digests.pop(rel, None)
        self._listings = {checkpoint_id: listing}

    def forget(self, checkpoint_id: int) -> None:
        """An aborted checkpoint: its manifests are gone."""
        self._by_checkpoint.pop(checkpoint_id, None)

    def listing(self, checkpoint_id: int, list_dir: Callable[[], list[str]]
                ) -> frozenset[str]:
        """The listing of ``chk-<checkpoint_id>/`` taken when it completed, or
        ``list_dir()`` once (after a rebuild)."""
        got = self._listings.get(checkpoint_id)
        if got is None:
            got = self._listings[checkpoint_id] = frozenset(list_dir())
        return got
