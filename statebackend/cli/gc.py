"""``gc``: retention and garbage collection as the coordinator does them, or a dry run."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import Any, TextIO

from ..errors import CheckpointNotFoundError, StorageError
from ..progress import ProgressFn
from ..storage.base import DurableStore, StoreFileNotFoundError, Transfer
from .common import EXIT_OK, _count, _progress, _records, common_args


class RecordingStore(DurableStore):
    """A store that records what is deleted; with ``dry_run`` it only pretends.

    Reads go to ``inner``. With ``dry_run`` (the default), writes and deletes change only
    an in-memory overlay, so running the real
    :class:`~statebackend.coordinator.CheckpointCoordinator` over it gives exactly the
    deletions a real run would make now, with nothing changed. Either way ``deleted``
    lists the paths deleted (relative to the store root) and ``deleted_bytes`` their size;
    ``progress`` is told of every record or manifest read and every file deleted.
    """

    def __init__(self, inner: DurableStore, dry_run: bool = True,
                 progress: ProgressFn | None = None) -> None:
        self.inner = inner
        self.root = inner.root
        self.dry_run = dry_run
        self.progress = progress
        self.reads = 0
        self.deleted: list[str] = []
        self.deleted_bytes = 0
        self._gone: set[str] = set()
        self._written: dict[str, bytes] = {}

    def put_file(self, local_path: str, path: str) -> Transfer:
        raise StorageError("garbage collection uploads nothing")

    def get_file(self, path: str, local_path: str, *, size: int | None = None,
                 checksum: str | None = None) -> Transfer:
        if path in self._gone:
            raise StoreFileNotFoundError(path)
        return self.inner.get_file(path, local_path, size=size, checksum=checksum)

    def put_bytes_atomic(self, path: str, data: bytes) -> None:
        if not self.dry_run:
            self.inner.put_bytes_atomic(path, data)
            return
        self._written[path] = data
        self._gone.discard(path)

    def get_bytes(self, path: str) -> bytes:
        if path in self._gone:
            raise StoreFileNotFoundError(path)
        if path in self._written:
            return self._written[path]
        data = self.inner.get_bytes(path)
        self.reads += 1
        if self.progress is not None:
            self.progress(self.reads, unit="records and manifests read")
        return data

    def exists(self, path: str) -> bool:
        return self.size(path) is not None

    def size(self, path: str) -> int | None:
        if path in self._gone:
            return None
        if path in self._written:
            return len(self._written[path])
        return self.inner.size(path)

    def delete(self, paths: Iterable[str]) -> None:
        paths = list(paths)
        stored = [p for p in paths if p not in self._gone and p not in self._written]
        size_of = dict(zip(stored, self.inner.sizes(stored)))  # in parallel where it can
        size_of.update((p, len(self._written[p])) for p in paths if p in self._written)
        found = [(p, size_of[p]) for p in paths
                 if p not in self._gone and size_of.get(p) is not None]
        if not self.dry_run:
            self.inner.delete(paths)
        else:
            for p in paths:
                self._gone.add(p)
                self._written.pop(p, None)
        self.deleted.extend(p for p, _ in found)
        self.deleted_bytes += sum(n for _, n in found)
        if found and self.progress is not None:
            self.progress(len(self.deleted), None, self.deleted_bytes, unit="files deleted")

    def list_dir(self, path: str) -> list[str]:
        listed = {p for p in self.inner.list_dir(path) if p not in self._gone}
        listed |= {p for p in self._written if p.startswith(path.rstrip("/") + "/")}
        return sorted(listed)


def run_gc(store: DurableStore, op: str, num_retained: int, *, dry_run: bool = True,
           progress: ProgressFn | None = None) -> tuple[list[str], list[int]]:
    """Apply retention and garbage collection as the coordinator does (``dry_run``: only
    compute what it would delete now, changing nothing; ``progress``: see
    :class:`RecordingStore`; how much there is to do is not known in advance).

    It runs the coordinator itself (its rebuild finishes pending work and collects), so
    the answer is the coordinator's, not a re-implementation of it.

    Returns
    -------
    tuple of (list of str, list of int)
        Paths (relative to the store root) deleted, and the checkpoints dropped.
    """
    from ..coordinator import CheckpointCoordinator

    records = _records(store, op)
    if not records:
        raise CheckpointNotFoundError(f"operator {op!r} has no completed checkpoint under "
                                      f"{store.root}")
    latest = records[max(records)]
    rec = RecordingStore(store, dry_run=dry_run, progress=progress)
    coord = CheckpointCoordinator(rec, op, parallelism=latest.parallelism,
                                  max_parallelism=latest.max_parallelism,
                                  num_retained=num_retained, own_retention=True)
    coord.collect_garbage()  # idempotent: a second pass finds what the first one unblocked
    coord.close()
    dropped = sorted(set(records) - set(_records(rec, op)))
    return sorted(set(rec.deleted)), dropped

def cmd_gc(args: argparse.Namespace, out: TextIO) -> int:
    store = args.open_store()
    op = args.operator
    with _progress(args, "gc", "files read") as bar:
        paths, dropped = run_gc(store, op, args.num_retained, dry_run=args.dry_run,
                                progress=bar)
    if args.json:
        out.write(json.dumps({"dry_run": args.dry_run, "checkpoints": dropped,
                              "files": paths}) + "\n")
        return EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    out.write(f"{verb} {len(paths)} file(s); checkpoints dropped by retention "
              f"(num_retained={args.num_retained}): {dropped or 'none'}\n")
    for p in paths:
        out.write(f"  {p}\n")
    return EXIT_OK


def add_gc(sub: Any) -> None:
    p = sub.add_parser("gc", help="delete what retention drops (--dry-run: only show it)")
    common_args(p)
    p.add_argument("--dry-run", action="store_true", help="show, delete nothing")
    p.add_argument("--num-retained", type=_count(1), default=3, metavar="N",
                   help="completed checkpoints to keep (the job's num_retained; default 3)")
    p.set_defaults(func=cmd_gc)

