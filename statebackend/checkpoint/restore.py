"""Downloading a partition checkpoint from durable storage, with typed errors.

A missing or corrupt durable file raises :class:`CorruptStateError` naming the checkpoint,
partition and file; the target directory is then removed, so no caller ever sees an empty
or partial state.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from ..errors import CorruptStateError, StorageError, UnsafePathError
from ..model.carry import carried_origin
from ..model.manifest import (
    FileEntry,
    PartitionManifest,
    SliceRef,
    changelog_id,
    check_component,
    check_relative,
)
from ..rocksdb.instance import RocksDBInstance
from ..storage.base import DurableStore, Transfer
from ..storage.checksum import bytes_crc32
from .changelog import check_chain, replay, span

if TYPE_CHECKING:
    from .slices import Coverage


def validate_manifest(manifest: PartitionManifest, operator_id: str | None = None) -> None:
    """Refuse a manifest with a path outside the root, duplicate names, or another operator.

    Raises
    ------
    UnsafePathError
        A file name or durable path escapes its root.
    CorruptStateError
        Duplicate names, or the manifest belongs to another operator.
    """
    seen: set[str] = set()
    for f in manifest.files:
        try:
            check_component(f.name)
            check_relative(f.path)
        except UnsafePathError as exc:
            raise UnsafePathError(f"checkpoint {manifest.checkpoint_id} partition "
                                  f"{manifest.partition}: {exc}") from exc
        if f.name in seen:
            raise CorruptStateError(f"{manifest.path}: file {f.name} listed twice",
                                    checkpoint_id=manifest.checkpoint_id,
                                    partition=manifest.partition, path=f.path)
        seen.add(f.name)
    if operator_id is not None and manifest.operator_id != operator_id:
        raise CorruptStateError(f"{manifest.path}: manifest of operator "
                                f"{manifest.operator_id!r}, expected {operator_id!r}",
                                checkpoint_id=manifest.checkpoint_id,
                                partition=manifest.partition, path=manifest.path)


def download_checkpoint(store: DurableStore, manifest: PartitionManifest,
                        target_dir: str) -> tuple[int, int]:
    """Download the RocksDB files of ``manifest`` into ``target_dir``, verifying size and CRC32.

    A changelog manifest's changelogs are not downloaded here: open the directory, then
    :func:`replay_changelogs` (or use :func:`open_checkpoint`, which does both).

    Parameters
    ----------
    store : DurableStore
        Rooted at the operator root.
    manifest : PartitionManifest
        What to download.
    target_dir : str
        An empty local directory; removed if the download fails.

    Returns
    -------
    tuple of (int, int)
        Bytes and files downloaded.

    Raises
    ------
    CorruptStateError
        A durable file is missing, truncated or fails its checksum.
    """
    validate_manifest(manifest)
    items = [(f.path, os.path.join(target_dir, f.name), f.size, f.checksum)
             for f in manifest.db_files]
    try:
        transfers = store.get_files(items)
    except (StorageError, FileNotFoundError) as exc:
        shutil.rmtree(target_dir, ignore_errors=True)
        raise _download_failed(store, manifest, exc,
                               getattr(exc, "path", None) or _which_file(store, manifest)
                               ) from exc
    return sum(t.size for t in transfers), len(transfers)


def downloaded_each(store: DurableStore, manifest: PartitionManifest,
                    files: list[tuple[FileEntry, str]]) -> Iterator[Transfer]:
    """Download ``(entry, local path)`` pairs of ``manifest``, verifying size and CRC32;
    each file's :class:`Transfer` as soon as it and those before it are in
    (:meth:`DurableStore.get_files_each`): all of them on their way at once, so the
    store's threads never wait for what the caller does with the first.

    Raises
    ------
    CorruptStateError
        A durable file is missing, truncated or fails its checksum.
    """
    try:
        yield from store.get_files_each(
            [(f.path, local, f.size, f.checksum) for f, local in files])
    except (StorageError, FileNotFoundError) as exc:
        raise _download_failed(store, manifest, exc, getattr(exc, "path", None)) from exc


def _download_failed(store: DurableStore, manifest: PartitionManifest, exc: BaseException,
                     bad: str | None) -> CorruptStateError:
    return CorruptStateError(
        f"checkpoint {manifest.checkpoint_id} partition {manifest.partition} "
        f"(attempt {manifest.attempt}): durable file {bad or '?'} is missing or corrupt "
        f"({exc}); the committed state cannot be restored from {store.root}",
        checkpoint_id=manifest.checkpoint_id, partition=manifest.partition, path=bad)


def fetch_changelog(store: DurableStore, manifest: PartitionManifest, f: FileEntry,
                    local_dir: str | None = None) -> tuple[bytes, bool]:
    """The bytes of changelog ``f`` of ``manifest``: the local copy under ``local_dir`` when
    it has the right size and CRC32, else durable storage (verified the same way); and
    whether it was downloaded.

    Raises
    ------
    CorruptStateError
        The durable file is missing or fails its checksum.
    """
    data = _local_changelog(f, local_dir)
    if data is not None:
        return data, False
    try:
        downloaded: bytes | None = store.get_bytes(f.path)
    except (StorageError, FileNotFoundError) as exc:
        raise _missing(store, manifest, f, exc) from exc
    return _checked(store, manifest, f, downloaded), True


def _local_changelog(f: FileEntry, local_dir: str | None) -> bytes | None:
    """The local copy of changelog ``f`` when it has the right size and CRC32."""
    if local_dir is None:
        return None
    try:
        with open(os.path.join(local_dir, local_changelog_name(f)), "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data if len(data) == f.size and bytes_crc32(data) == f.checksum else None


def _missing(store: DurableStore, manifest: PartitionManifest, f: FileEntry,
             exc: BaseException | None = None) -> CorruptStateError:
    return CorruptStateError(
        f"checkpoint {manifest.checkpoint_id} partition {manifest.partition}: changelog "
        f"{f.path} is missing ({exc or 'not found'}); the committed state cannot be restored "
        f"from {store.root}", checkpoint_id=manifest.checkpoint_id,
        partition=manifest.partition, path=f.path)


def _checked(store: DurableStore, manifest: PartitionManifest, f: FileEntry,
             data: bytes | None) -> bytes:
    """``data`` read from durable storage for changelog ``f``, verified (None: missing)."""
    if data is None:
        raise _missing(store, manifest, f)
    if len(data) != f.size or bytes_crc32(data) != f.checksum:
        raise CorruptStateError(
            f"checkpoint {manifest.checkpoint_id} partition {manifest.partition}: changelog "
            f"{f.path} has {len(data)} bytes / {bytes_crc32(data)}, the manifest says "
            f"{f.size} / {f.checksum}", checkpoint_id=manifest.checkpoint_id,
            partition=manifest.partition, path=f.path)
    return data


def local_changelog_name(f: FileEntry) -> str:
    """Name of a changelog's local copy: ``chk-<n>-<attempt>.sbcl`` (from its durable path)."""
    parts = f.path.split("/")
    return f"chk-{changelog_id(f.name)}-{check_component(parts[-2])}.sbcl"


READ_AHEAD_FILES = 4
READ_AHEAD_BYTES = 256 << 20
"""Changelogs a restore reads at once (the store's parallel reads), at most this many and
this many bytes together (a single larger one alone): it never holds the whole chain."""


PIECES_AHEAD_FILES = 64
"""Changelog pieces of rolling slices (small, one request each) a restore reads at once."""


PIECES_BESIDE_UNITS = 8
"""Pieces read at once while the units still download: the units are the restore's
critical path, and a client's connections are few (aiobotocore's pool holds 10, the
benchmark's link 16), so 64 reads at once took connections from the units' downloads
(1 GiB, 4 download threads: 7.6 -> 5.8 s with 8)."""


PIECES_AHEAD_BYTES = 64 << 20
"""At most this many bytes of pieces in one window (three windows in memory at once: one
replayed, one waiting, one read)."""


def _windows(files: list[FileEntry], most: int | Callable[[], int],
             most_bytes: int | None = None) -> Iterator[list[FileEntry]]:
    """``files`` in windows of at most ``most`` files (asked again for each window when
    a callable) and ``most_bytes`` bytes."""
    most_bytes = READ_AHEAD_BYTES if most_bytes is None else most_bytes
    window: list[FileEntry] = []
    size = 0  # of the window's files
    for f in files:
        if window and (len(window) == (most() if callable(most) else most)
                       or size + f.size > most_bytes):
            yield window
            window, size = [], 0
        window.append(f)
        size += f.size
    if window:
        yield window


def _fetched_ahead(store: DurableStore, manifest: PartitionManifest, local_dir: str | None,
                   files: Sequence[FileEntry] | None = None,
                   most: int | Callable[[], int] = READ_AHEAD_FILES,
                   most_bytes: int | None = None
                   ) -> Iterator[tuple[FileEntry, bytes, bool]]:
    """``(file, data, downloaded)`` for each changelog of ``manifest`` (or each of
    ``files``) in order: local copies first, the others of a window of at most ``most``
    read together (:meth:`DurableStore.get_bytes_many`), so a chain pays one request
    latency per window, not per file."""
    for window in _windows(list(manifest.changelog_files if files is None else files),
                           most, most_bytes):
        local = [_local_changelog(f, local_dir) for f in window]
        remote = [f for f, data in zip(window, local) if data is None]
        try:
            fetched = iter(store.get_bytes_many([f.path for f in remote]))
        except StorageError as exc:
            raise _missing(store, manifest, remote[0], exc) from exc
        for f, data in zip(window, local):
            if data is not None:
                yield f, data, False
            else:
                yield f, _checked(store, manifest, f, next(fetched)), True


class _Ahead(Iterator):
    """The items of ``items`` produced by a thread of its own, at most ``depth`` ahead of
    the consumer: reads overlap the work done with earlier items and, started before it,
    other work (a restore reads its pieces while its units download). The producer's
    exception is raised where it stopped; :meth:`close` (always: a consumer may never
    start) stops the producer."""

    _END = object()

    def __init__(self, items: Iterable, depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(items,), daemon=True,
                                        name="sb-restore-ahead")
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, items: Iterable) -> None:
        try:
            for x in items:
                if not self._put((x, None)):
                    return
            self._put((self._END, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._put((None, exc))

    def __next__(self):
        while True:  # a consumer in another thread ends when close() is called
            if self._done:
                raise StopIteration
            try:
                x, exc = self._queue.get(timeout=0.05)
                break
            except queue.Empty:
                continue
        if exc is not None or x is self._END:
            self._done = True
            if exc is not None:
                raise exc
            raise StopIteration
        return x

    def close(self) -> None:
        self._done = True
        self._stop.set()


def replay_changelogs(instance: RocksDBInstance, store: DurableStore,
                      manifest: PartitionManifest, local_dir: str | None = None) -> int:
    """Replay the changelogs of ``manifest`` in order onto ``instance`` (opened from its
    :attr:`~PartitionManifest.db_files`); returns how many of their bytes were downloaded
    (the others were local copies).

    Raises
    ------
    CorruptStateError
        A changelog is missing, corrupt, leaves a gap, or is another partition's
        (:meth:`~PartitionManifest.foreign_changelogs`), naming it.
    """
    for f in manifest.foreign_changelogs():
        raise CorruptStateError(
            f"manifest {manifest.path} lists a {manifest.misplaced(f)}: its entries are "
            f"not this partition's state (the manifest was edited); restore from another "
            f"retained checkpoint",
            checkpoint_id=manifest.checkpoint_id, partition=manifest.partition, path=f.path)
    if manifest.slices:
        return _replay_rolling(instance, store, manifest, local_dir)
    recording, instance.changelog = instance.changelog, None
    total = 0
    # the chain is checked file by file as it is replayed (never all held at once)
    # a carried-over manifest holds the state (and the changelogs) of the checkpoint it
    # carries (statebackend.model.carry): its chain ends there
    origin = carried_origin(manifest) or manifest
    start = -1 if origin.materialized_id is None else origin.materialized_id
    try:
        total += _replay_chain(store, manifest, local_dir, start, origin.checkpoint_id,
                               lambda data, _n, path: replay(instance, data, where=path))
    finally:
        instance.changelog = recording
    return total


def _replay_chain(store: DurableStore, manifest: PartitionManifest, local_dir: str | None,
                  start: int, end: int, apply: Callable[[bytes, int, str], None]) -> int:
    """Fetch the manifest's changelogs in order (reading ahead), check each link of the
    chain from ``start`` to ``end`` as it arrives, and ``apply(data, changelog id, path)``;
    returns the bytes downloaded. A corruption error names the manifest's checkpoint and
    partition."""
    where = f"manifest {manifest.path}"
    total = 0
    # the next window is read while this one is replayed
    fetched = _Ahead(_fetched_ahead(store, manifest, local_dir), READ_AHEAD_FILES)
    try:
        for f, data, downloaded in fetched:
            n = changelog_id(f.name)
            check_chain([(f.path, n, span(data, f.path))], start, n, where)
            start = n
            apply(data, n, f.path)
            total += len(data) if downloaded else 0
        check_chain([], start, end, where)
    except CorruptStateError as exc:
        if exc.checkpoint_id is None:
            exc.checkpoint_id, exc.partition = manifest.checkpoint_id, manifest.partition
        raise
    finally:
        fetched.close()
    return total


def _replay_rolling(instance: RocksDBInstance, store: DurableStore,
                    manifest: PartitionManifest, local_dir: str | None) -> int:
    """:func:`replay_changelogs` of a manifest with rolling slices
    (:mod:`~statebackend.checkpoint.slices`): its units in place, then its whole changelogs
    and the pieces of later ones (:mod:`~statebackend.checkpoint.deltas`) where a key
    group's unit is older than them."""
    from . import deltas as dl
    from . import slices as sl

    recording, instance.changelog = instance.changelog, None
    origin = carried_origin(manifest) or manifest
    cover = sl.covering((manifest.key_group_start, manifest.key_group_end), manifest.slices,
                        origin.materialized_id)
    floor = -1 if origin.materialized_id is None else origin.materialized_id
    units = sorted((u for u in manifest.slices if u.checkpoint_id > floor
                    and not u.is_delta), key=lambda u: (u.checkpoint_id, u.first_kg))
    whole_end = max([cover.start] + [changelog_id(f.name) for f in manifest.changelog_files])
    _reached, problems = dl.delta_problems(manifest, whole_end, origin.checkpoint_id)
    where = (manifest.checkpoint_id, manifest.partition)
    if problems:
        raise _unrestorable(manifest, *problems[0])
    pieces = sorted((d for d in manifest.slices if d.is_delta),
                    key=lambda d: (d.checkpoint_id, d.first_kg))
    piece_files = [fs[0] for fs in sl.unit_files(manifest, pieces)]
    scratch = tempfile.mkdtemp(prefix=".slices-", dir=os.path.dirname(instance.path) or ".")
    local = sl.fetch_unit_paths(manifest, units, scratch)
    # the pieces: small and many, read many at once (each costs the store's latency, not
    # its bandwidth; fewer while the units download), in batch order, by a thread of
    # their own from now on (the next window read while one merges), and merged into
    # SST files (dl.Merged) by another: all while the units download
    units_in = threading.Event()
    read = _Ahead(_fetched_ahead(
        store, manifest, None, piece_files,
        lambda: PIECES_AHEAD_FILES if units_in.is_set() else PIECES_BESIDE_UNITS,
        PIECES_AHEAD_BYTES), PIECES_BESIDE_UNITS)
    fetched = _Ahead(dl.merged_ahead(pieces, read, cover, directory=scratch),
                     PIECES_AHEAD_FILES)
    try:
        # every unit in place first; the changelogs then only touch the key groups whose
        # unit is older than them
        total = _ingest_downloaded(instance, store, manifest, local, clear=floor >= 0)
        units_in.set()
        total += _replay_chain(
            store, manifest, local_dir, cover.start,
            whole_end if pieces else origin.checkpoint_id,
            lambda data, n, path: sl.replay_filtered(instance, data, n, cover, units, path))
        total += _replay_pieces(instance, fetched, cover, units, where)
    finally:
        fetched.close()
        read.close()
        instance.changelog = recording
        shutil.rmtree(scratch, ignore_errors=True)
    return total


UNIT_GROUPS = 4
"""A rolling restore puts its units in place in this many groups, each as soon as its
files are in, while the store's threads go on with the next groups' files."""


def _ingest_downloaded(instance: RocksDBInstance, store: DurableStore,
                       manifest: PartitionManifest,
                       local: Sequence[tuple[SliceRef, Sequence[tuple[FileEntry, str]]]],
                       clear: bool) -> int:
    """Download the units' files (``(unit, [(entry, local path)])`` in batch order) and
    ingest them (:func:`~.slices.ingest_units`) group by group, each group as soon as its
    files are in while the later groups' files download (one group when units overlap:
    they go in one by one, in order); the bytes downloaded. A unit's file of other key
    groups, or a state outside the partition's, is refused naming the manifest."""
    from . import slices as sl

    n = UNIT_GROUPS if not sl.units_overlap([u for u, _x in local]) else 1
    groups = [g for g in (list(local[i * len(local) // n: (i + 1) * len(local) // n])
                          for i in range(n)) if g]
    # all files on their way at once, group after group; a group's largest first, so
    # the last group's download ends on small files, not one lane busy
    files = [x for g in groups for x in sorted((x for _u, xs in g for x in xs),
                                                 key=lambda x: -x[0].size)]
    arriving = downloaded_each(store, manifest, files)
    total = 0
    try:
        for group in groups:
            total += sum(next(arriving).size for _u, xs in group for _x in xs)
            with _naming(manifest):
                sl.ingest_units(instance, [(u, [p for _f, p in xs]) for u, xs in group],
                                clear=clear)
    finally:
        arriving.close()
    with _naming(manifest):
        sl.check_range(instance, (manifest.key_group_start, manifest.key_group_end))
    return total


@contextlib.contextmanager
def _naming(manifest: PartitionManifest) -> Iterator[None]:
    """A corruption found in the state put in place is the manifest's: name it."""
    try:
        yield
    except CorruptStateError as exc:
        exc.checkpoint_id, exc.partition = manifest.checkpoint_id, manifest.partition
        exc.path = manifest.path
        raise


def _replay_pieces(instance: RocksDBInstance, fetched: Iterator[tuple], cover: Coverage,
                   units: Sequence[SliceRef], where: tuple[int, int]) -> int:
    """Apply what :func:`~.deltas.merged_ahead` yields, in order: each merge of pieces at
    once (its SST files ingested), each piece of another kind replayed; returns their
    bytes."""
    from . import deltas as dl

    total = 0
    dropped: set[tuple[int, str]] = set()  # (batch, column family) a piece dropped
    try:
        for item in fetched:
            if item[0] == "merged":
                item[1].apply(instance)
                total += item[1].bytes
            else:
                _kind, d, f, data = item
                dl.replay_piece(instance, d, data, f.path, cover, units, dropped)
                total += len(data)
    except CorruptStateError as exc:
        exc.checkpoint_id, exc.partition = where
        raise
    return total


def _unrestorable(manifest: PartitionManifest, path: str, what: str) -> CorruptStateError:
    return CorruptStateError(f"checkpoint {manifest.checkpoint_id} partition "
                             f"{manifest.partition} ({manifest.path}): {what}; the committed "
                             f"state cannot be restored", checkpoint_id=manifest.checkpoint_id,
                             partition=manifest.partition, path=path)


def open_checkpoint(store: DurableStore, manifest: PartitionManifest, target_dir: str,
                    open_instance: Callable[[str], RocksDBInstance] = RocksDBInstance
                    ) -> RocksDBInstance:
    """Download ``manifest`` into ``target_dir``, open it and replay its changelogs: the
    exact state of the checkpoint, in either mode."""
    download_checkpoint(store, manifest, target_dir)
    inst = open_instance(target_dir)
    try:
        replay_changelogs(inst, store, manifest)
    except BaseException:
        inst.close()
        raise
    return inst


def _which_file(store: DurableStore, manifest: PartitionManifest) -> str | None:
    """The first file whose durable size is wrong or absent (to name it in the error)."""
    try:
        for f in manifest.db_files:
            if store.size(f.path) != f.size:
                return f.path
    except Exception:  # noqa: BLE001 - only improves the message
        return None
    # Sizes are right, so a checksum failed; report the largest file as the likely one.
    return None
