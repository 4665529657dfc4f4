"""Checking retained checkpoints as a restore would, without restoring anything.

``statebackend verify`` runs every check of :data:`CHECKS` (and, with ``--deep``,
:data:`DEEP_CHECKS`) over each retained checkpoint, loaded once as a
:class:`LoadedCheckpoint`. A check is a plain function ``check(ctx, checkpoint)`` that
yields :class:`Problem` values; to check something new, write one and append it (or pass
your own list to :func:`verify_checkpoints`). A check reads through ``ctx`` so that a file
shared by several checkpoints is read once.

What the checks prove, in the order a restore depends on them:

* loading (not a check of the list, as every reader does it): a record names partitions
  ``0..P-1`` with manifests of its own checkpoint (it does not parse otherwise), and each
  manifest matches the digest the record keeps and describes that operator, checkpoint,
  partition, ``max_parallelism`` and key-group range
  (:meth:`~statebackend.model.manifest.CompletedCheckpoint.check_manifest`, so the
  ranges tile ``[0, max_parallelism)``); what fails is reported as unreadable;
* ``files_intact``: every file a manifest references (also those reused from older
  checkpoints) exists with its recorded size and CRC32;
* ``rocksdb_file_set``: the SST files RocksDB's own ``MANIFEST-<n>`` lists are exactly
  those the partition manifest references, with the sizes it records for them, ``CURRENT`` names that MANIFEST, and the
  ``OPTIONS`` file is there (RocksDB refuses to open without them);
* ``slices_listed`` (rolling slices): every unit's files are listed;
* ``changelogs_continuous`` (changelog mode): the changelogs replay without a gap from the
  materialization up to the checkpoint itself, and each is in the directory its lineage
  wrote it in (:meth:`~statebackend.model.manifest.PartitionManifest.foreign_changelogs`:
  the partition's own, or an old layout's partition the manifest's
  ``changelog_sources`` name for its batch after a rescale);
* for the location as a whole (:func:`location_problems`, when every checkpoint is
  verified): ``_checkpoints/LATEST.json`` parses, and neither it nor the ``_metrics/``
  files name a completed checkpoint newer than the newest record (a rollback, which
  readers refuse); ``_writers/`` has a file for every epoch the records name;
* ``opens`` (deep): each partition downloaded, opened by RocksDB, its changelogs replayed,
  and every entry read back, each key inside the partition's key-group range.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import CheckpointNotFoundError, CorruptStateError, StateBackendError, StorageError
from .model.manifest import (
    CHECKPOINTS_DIR,
    LATEST_PATH,
    CompletedCheckpoint,
    FileEntry,
    PartitionManifest,
    changelog_id,
    checkpoint_dir,
    completed_record_path,
    parse_latest,
)
from .progress import ProgressFn
from .storage.base import DurableStore
from .storage.checksum import crc32_stream
from .storage.records import METRICS_DIR, newest_metrics

__all__ = ["CHECKS", "DEEP_CHECKS", "Check", "LoadedCheckpoint", "Problem", "VerifyContext",
           "load_checkpoint", "read_records", "verify_checkpoints"]

_RECORD = re.compile(r"^chk-(\d+)\.json$")


@dataclass(frozen=True)
class Problem:
    """One thing ``verify`` found wrong."""

    checkpoint_id: int | None  # None: the location as a whole (writers, LATEST.json)
    partition: int | None
    path: str  # relative to the operator root
    what: str  # missing | size ... | checksum ... | manifest ... | rocksdb ... | changelog ...

    def __str__(self) -> str:
        where = ("location" if self.checkpoint_id is None
                 else f"checkpoint {self.checkpoint_id}") + (
            f" partition {self.partition}" if self.partition is not None else "")
        return f"{where}: {self.path}: {self.what}"


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A completed checkpoint's record and the manifests it names that could be read
    (``unreadable``: partition -> why not; reported once, by the loader)."""

    record: CompletedCheckpoint
    manifests: dict[int, PartitionManifest]
    unreadable: dict[int, str] = field(default_factory=dict)

    @property
    def checkpoint_id(self) -> int:
        return self.record.checkpoint_id


@dataclass
class VerifyContext:
    """What checks share: the store, the choices of this run, and what was already read."""

    store: DurableStore
    operator_id: str
    checksums: bool = True
    progress: ProgressFn | None = None
    total_files: int = 0
    total_bytes: int = 0
    # durable path -> None (intact) or what is wrong with it; each file is checked once
    files: dict[str, str | None] = field(default_factory=dict)
    files_done: int = 0
    bytes_done: int = 0

    def abs(self, path: str) -> str:
        return f"{self.operator_id}/{path}"

    def file_problems(self, entries: Sequence[FileEntry]) -> dict[str, str | None]:
        """Check ``entries`` not checked yet (sizes in parallel, then checksums); the
        verdict of each entry's path."""
        todo = sorted({f.path: f for f in entries if f.path not in self.files}.items())
        sizes = self.store.sizes([self.abs(p) for p, _ in todo]) if todo else []
        for (path, f), got in zip(todo, sizes):
            if got is None:
                self.files[path] = "missing"
            elif got != f.size:
                self.files[path] = f"size {got} bytes, recorded {f.size}"
            elif self.checksums:
                try:
                    crc = self.checksum(path)
                except (OSError, StorageError) as exc:
                    self.files[path] = f"unreadable ({exc})"
                else:
                    self.files[path] = (None if crc == f.checksum
                                        else f"checksum {crc}, recorded {f.checksum}")
            else:
                self.files[path] = None
            self.files_done += 1
            self.bytes_done += f.size
            if self.progress is not None:
                self.progress(self.files_done, self.total_files, self.bytes_done,
                              self.total_bytes)
        return {f.path: self.files[f.path] for f in entries}

    def checksum(self, path: str) -> str:
        store = self.store
        fs = getattr(store, "fs", None)
        full = getattr(store, "full_path", None)
        if fs is not None and full is not None:
            # Stream once, without the store's retries: a wrong checksum is an answer here.
            with fs.open(full(self.abs(path)), "rb") as fh:
                return crc32_stream(fh)[1]
        with tempfile.TemporaryDirectory() as d:
            return store.get_file(self.abs(path), os.path.join(d, "f")).checksum

    def read(self, path: str) -> bytes:
        return self.store.get_bytes(self.abs(path))


Check = Callable[[VerifyContext, LoadedCheckpoint], Iterable[Problem]]


# --- the checks -----------------------------------------------------------------------


def files_intact(ctx: VerifyContext, c: LoadedCheckpoint) -> Iterator[Problem]:
    """Every referenced file exists with its size (and CRC32 unless sizes only). A file
    shared by several checkpoints is reported with the first one that references it."""
    for p, m in sorted(c.manifests.items()):
        fresh = [f for f in m.files if f.path not in ctx.files]
        verdicts = ctx.file_problems(fresh)
        for f in fresh:
            why = verdicts[f.path]
            if why is not None:
                yield Problem(c.checkpoint_id, p, f.path, why)


def rocksdb_file_set(ctx: VerifyContext, c: LoadedCheckpoint) -> Iterator[Problem]:
    """The partition manifest's SSTs are exactly those RocksDB's MANIFEST lists."""
    from .rocksdb.version_edits import live_sst_sizes, sst_name

    for p, m in sorted(c.manifests.items()):
        files = {f.name: f for f in m.db_files}
        if not files:
            continue  # changelog mode before any materialization: no snapshot to open
        n = c.checkpoint_id
        current = files.get("CURRENT")
        if current is None:
            yield Problem(n, p, m.path, "rocksdb: no CURRENT file listed (RocksDB cannot "
                                        "open the snapshot)")
            continue
        if not any(name.startswith("OPTIONS-") for name in files):
            yield Problem(n, p, m.path, "rocksdb: no OPTIONS file listed")
        if ctx.file_problems([current])[current.path] is not None:
            continue  # already reported as a damaged file
        try:
            manifest_name = ctx.read(current.path).decode("ascii").strip()
        except (UnicodeDecodeError, OSError, StorageError) as exc:
            yield Problem(n, p, current.path, f"rocksdb: CURRENT unreadable ({exc})")
            continue
        rocks = files.get(manifest_name)
        if rocks is None:
            yield Problem(n, p, m.path, f"rocksdb: CURRENT names {manifest_name!r}, which "
                                        f"the manifest does not list")
            continue
        if ctx.file_problems([rocks])[rocks.path] is not None:
            continue
        try:
            live = {sst_name(x): size for x, size in live_sst_sizes(ctx.read(rocks.path)).items()}
        except (ValueError, OSError, StorageError) as exc:
            yield Problem(n, p, rocks.path, f"rocksdb: cannot list the SST files of "
                                            f"{manifest_name} ({exc}); 'verify --deep' "
                                            f"opens the snapshot instead")
            continue
        listed = {name for name in files if name.endswith(".sst")}
        for name in sorted(live.keys() - listed):
            yield Problem(n, p, m.path, f"rocksdb: {manifest_name} needs {name}, which the "
                                        f"manifest does not list (RocksDB will not open)")
        for name in sorted(listed - live.keys()):
            yield Problem(n, p, files[name].path, f"rocksdb: listed but not part of "
                                                  f"{manifest_name} (a manifest of another "
                                                  f"snapshot?)")
        for name in sorted(listed & live.keys()):
            if files[name].size != live[name]:
                # RocksDB refuses to open a snapshot whose file has another size
                yield Problem(n, p, files[name].path, f"rocksdb: {manifest_name} records "
                              f"{live[name]} bytes for {name}, the manifest lists "
                              f"{files[name].size} (another snapshot's or partition's file)")


def changelogs_continuous(ctx: VerifyContext, c: LoadedCheckpoint) -> Iterator[Problem]:
    """Changelog mode: changelogs follow the materialization without a gap and end with
    the checkpoint's own batch (or the checkpoint is itself the materialization)."""
    for p, m in sorted(c.manifests.items()):
        if m.mode != "changelog":
            continue
        for f in m.foreign_changelogs():
            yield Problem(c.checkpoint_id, p, f.path,
                          f"{m.misplaced(f)}: a changelog is replayed only onto its own "
                          f"partition's state")
        covered = m.materialized_id
        if m.slices:  # rolling slices: the changelogs after the oldest unit
            from .checkpoint.slices import covering

            covered = covering((m.key_group_start, m.key_group_end), m.slices,
                               m.materialized_id).start
        for f in m.changelog_files:
            got = changelog_id(f.name)
            if covered is not None and got != covered + 1:
                what = "repeats" if got <= covered else "leaves a gap after"
                yield Problem(c.checkpoint_id, p, f.path,
                              f"changelog: batch {got} {what} batch {covered} (replay needs "
                              f"{covered + 1})")
            covered = got
        if m.slices and covered is not None:  # and the pieces of later changelogs
            from .checkpoint.deltas import delta_problems

            covered, probs = delta_problems(m, covered, c.checkpoint_id)
            for path, what in probs:
                yield Problem(c.checkpoint_id, p, path, what)
        if covered != c.checkpoint_id:
            yield Problem(c.checkpoint_id, p, m.path,
                          f"changelog: the state ends at batch {covered}, not at checkpoint "
                          f"{c.checkpoint_id} (a changelog is missing)")


def slices_listed(ctx: VerifyContext, c: LoadedCheckpoint) -> Iterator[Problem]:
    """Rolling slices: every file of every unit is listed (a restore refuses a unit whose
    file the manifest lacks)."""
    for p, m in sorted(c.manifests.items()):
        have = m.slice_files
        for u in m.slices:
            for name in u.file_names():
                if name not in have:
                    yield Problem(c.checkpoint_id, p, m.path,
                                  f"slices: the unit of batch {u.checkpoint_id} needs {name}, "
                                  f"which the manifest does not list")


def opens(ctx: VerifyContext, c: LoadedCheckpoint) -> Iterator[Problem]:
    """Deep: download, open with RocksDB, replay changelogs, read every entry back and
    check that each key lies in the partition's key-group range."""
    from .checkpoint.restore import open_checkpoint
    from .keys.layout import KG_LEN
    from .savepoint.writer import GLOBAL_COLUMN_FAMILIES
    from .storage.manifests import operator_store

    ostore = operator_store(ctx.store, ctx.operator_id)
    for p, m in sorted(c.manifests.items()):
        if any(ctx.files.get(f.path) for f in m.files):
            continue  # a damaged file is reported already; RocksDB would only repeat it
        tmp = tempfile.mkdtemp(prefix=f"sb-verify-p{p}-")
        try:
            with open_checkpoint(ostore, m, os.path.join(tmp, "db")) as inst:
                for cf in inst.column_family_names():
                    keyed = cf not in GLOBAL_COLUMN_FAMILIES  # _meta: state declarations
                    for key, _value in inst.scan_range(cf, b"", None):
                        if not keyed:
                            continue
                        kg = int.from_bytes(key[:KG_LEN], "big")
                        if len(key) < KG_LEN or not m.key_group_start <= kg <= m.key_group_end:
                            yield Problem(c.checkpoint_id, p, m.path,
                                          f"deep: column family {cf!r} holds key "
                                          f"{key[:16]!r}... of key group {kg}, outside "
                                          f"{m.key_group_start}-{m.key_group_end}")
                            break
        except Exception as exc:  # noqa: BLE001 - RocksDB raises plain Exception
            yield Problem(c.checkpoint_id, p, m.path, f"deep: does not open or read back "
                                                      f"({type(exc).__name__}: {exc})")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


CHECKS: list[Check] = [files_intact, rocksdb_file_set,
                       changelogs_continuous, slices_listed]
"""The checks of every ``verify``, in order."""

DEEP_CHECKS: list[Check] = [opens]
"""Added by ``verify --deep``: they download and open the state."""


# --- running them ---------------------------------------------------------------------


def read_records(store: DurableStore, op: str,
                 broken: dict[int, Problem] | None = None) -> dict[int, CompletedCheckpoint]:
    """The completed-checkpoint records of operator ``op``, by id (read-only: no
    coordinator, which would delete). ``broken``: where a record that does not parse (or
    does not tile its partitions) goes as a problem, instead of raising."""
    out = {}
    for rel in store.list_dir(f"{op}/{CHECKPOINTS_DIR}"):
        m = _RECORD.match(rel.rsplit("/", 1)[-1])
        if m and rel == f"{op}/{completed_record_path(int(m.group(1)))}":
            try:
                out[int(m.group(1))] = CompletedCheckpoint.from_json(store.get_bytes(rel),
                                                                     where=rel)
            except FileNotFoundError:
                continue  # discarded by a running coordinator between listing and reading
            except CorruptStateError as exc:
                if broken is None:
                    raise
                n = int(m.group(1))
                broken[n] = Problem(n, exc.partition, rel[len(op) + 1:], f"record unreadable "
                                                                        f"({exc})")
    return dict(sorted(out.items()))


def location_problems(store: DurableStore, op: str,
                      records: dict[int, CompletedCheckpoint],
                      broken: dict[int, Problem]) -> list[Problem]:
    """What a restore or a restart checks beyond each checkpoint: ``LATEST.json`` against
    the records (a newest record gone is a rollback a reader refuses, a pointer that does
    not parse is refused too), and ``_writers/`` against the records' writer epochs."""
    from .checkpoint.fencing import writer_gaps

    out = []
    newest = max([*records, *broken], default=None)
    try:
        ptr = parse_latest(store.get_bytes(f"{op}/{LATEST_PATH}"))
    except FileNotFoundError:
        ptr = None
        if newest is not None and records and records[max(records)].writer is not None:
            # records written with fencing always come with the pointer
            out.append(Problem(None, None, LATEST_PATH,
                               f"missing, while records up to checkpoint {newest} exist; "
                               f"the next start writes it again"))
    except CorruptStateError as exc:
        ptr = None
        out.append(Problem(None, None, LATEST_PATH, f"unreadable ({exc})"))
    done, evidence = (ptr.checkpoint_id if ptr else None), f"{LATEST_PATH} says so"
    metrics = newest_metrics(store, f"{op}/")
    if metrics is not None and (done is None or metrics >= done):
        done, evidence = metrics, f"its metrics {METRICS_DIR}/chk-{metrics}.jsonl were written"
    if done is not None and done > (-1 if newest is None else newest):
        rel = completed_record_path(done)
        published = bool(store.list_dir(f"{op}/{checkpoint_dir(done)}"))
        why = (f"the record of checkpoint {done}, the newest completed one ({evidence}), is "
               f"missing")
        if published:
            why += (": a rollback, which readers refuse; the next start completes it again "
                    "from its published manifests if they are all intact")
        elif evidence.startswith(LATEST_PATH):
            why += (", and nothing of that checkpoint is stored: a damaged pointer, which "
                    "readers refuse; the next start writes it again from the newest record")
        else:
            why += (" with all its files: the state after checkpoint "
                    f"{newest} is lost; readers and the next start refuse it")
        out.append(Problem(done, None, rel, why))
    for path, what in writer_gaps(store, f"{op}/"):
        out.append(Problem(None, None, path, what))
    return out


def load_checkpoint(ctx: VerifyContext, record: CompletedCheckpoint) -> LoadedCheckpoint:
    """The record with the manifests it names (in parallel; one by one only to tell which
    manifest is bad)."""
    from .storage.manifests import read_recorded_manifests

    op = ctx.operator_id
    items = sorted(record.manifests.items())
    try:
        got = read_recorded_manifests(ctx.store, record, operator_id=op)
        ms: list[Any] = [got[p] for p, _ in items]
    except StateBackendError:
        ms = []
        for p, _rel in items:
            try:
                ms.append(read_recorded_manifests(ctx.store, record, [p], operator_id=op)[p])
            except StateBackendError as exc:
                ms.append(exc)
    good = {p: m for (p, _), m in zip(items, ms) if isinstance(m, PartitionManifest)}
    bad = {p: str(m) for (p, _), m in zip(items, ms) if not isinstance(m, PartitionManifest)}
    return LoadedCheckpoint(record, good, bad)


def verify_checkpoints(store: DurableStore, op: str, checkpoint_ids: Sequence[int] | None = None,
                       *, checksums: bool = True, deep: bool = False,
                       progress: ProgressFn | None = None,
                       checks: Sequence[Check] | None = None
                       ) -> tuple[list[Problem], int, int]:
    """Run ``checks`` (default :data:`CHECKS`, plus :data:`DEEP_CHECKS` when ``deep``)
    over the chosen retained checkpoints (default: all). ``checksums=False`` checks sizes
    only. ``progress(files, total_files, bytes, total_bytes)`` is called after each file.

    Returns
    -------
    tuple of (list of Problem, int, int)
        The problems, the number of distinct files referenced and their recorded bytes.

    Raises
    ------
    CheckpointNotFoundError
        The operator has no completed checkpoint, or a chosen one is not retained.
    """
    broken: dict[int, Problem] = {}
    records = read_records(store, op, broken)
    problems: list[Problem] = []
    if checkpoint_ids is None:
        problems += location_problems(store, op, records, broken)
    if not records and not broken and not problems:
        raise CheckpointNotFoundError(f"operator {op!r} has no completed checkpoint under "
                                      f"{store.root}")
    ids = sorted({*records, *broken}) if checkpoint_ids is None else list(checkpoint_ids)
    problems += [broken[n] for n in ids if n in broken]
    ids = [n for n in ids if n not in broken]
    for n in ids:
        if n not in records:
            raise CheckpointNotFoundError(f"checkpoint {n} of {op!r} is not a retained "
                                          f"completed checkpoint; retained: {sorted(records)}")
    ctx = VerifyContext(store, op, checksums=checksums, progress=progress)
    loaded = [load_checkpoint(ctx, records[n]) for n in ids]
    every = {f.path: f for c in loaded for m in c.manifests.values() for f in m.files}
    ctx.total_files, ctx.total_bytes = len(every), sum(f.size for f in every.values())
    if checks is None:
        checks = [*CHECKS, *(DEEP_CHECKS if deep else [])]
    for c in loaded:
        for p, why in sorted(c.unreadable.items()):
            problems.append(Problem(c.checkpoint_id, p, c.record.manifests[p],
                                    f"manifest unreadable ({why})"))
        for check in checks:
            problems.extend(check(ctx, c))
    return problems, ctx.total_files, ctx.total_bytes
