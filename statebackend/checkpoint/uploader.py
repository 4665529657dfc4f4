"""The asynchronous part of a checkpoint: upload what is new, then publish the manifest.

Rules kept here:

* invariant 2: every upload goes under ``chk-<n>/p<p>/<attempt>/``, a directory no other
  attempt writes, and the store refuses to overwrite; an attempt directory that already
  holds files is refused outright;
* invariant 3: the manifest is published last, with one atomic write, after every file it
  references is durable;
* invariant 4: an SST is reused only when the base manifest (the checkpoint this state
  was restored from) lists it as durable with the same name and size.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import CheckpointError, CommitFailedError, StorageError
from ..model.manifest import (
    MANIFEST_NAME,
    FileEntry,
    PartitionManifest,
    StateDescriptor,
    attempt_dir,
    check_relative,
)
from ..storage.base import DurableStore
from ..storage.checksum import file_crc32
from .publish import ManifestFacts, publish_checkpoint
from .snapshot import LocalSnapshot
from .task_metrics import CheckpointMetrics

log = logging.getLogger(__name__)


def plan_reuse(snapshot: LocalSnapshot, base: PartitionManifest | None,
               incremental: bool) -> dict[str, FileEntry]:
    """SST name -> base entry for every file of ``snapshot`` that need not be uploaded."""
    if base is None or not incremental:
        return {}
    if base.operator_id != snapshot.operator_id:
        raise CheckpointError(f"base manifest {base.path} belongs to operator "
                              f"{base.operator_id!r}, not {snapshot.operator_id!r}")
    if base.checkpoint_id >= snapshot.checkpoint_id:
        raise CheckpointError(f"base checkpoint {base.checkpoint_id} is not older than "
                              f"checkpoint {snapshot.checkpoint_id}")
    durable = base.shared_files()
    # A changelog checkpoint's snapshot files come from a materialization another
    # worker's directory may have taken: there a name does not identify a file, so the
    # first incremental checkpoint after one compares checksums too.
    exact = base.mode != "incremental"
    reuse = {}
    for f in snapshot.files:
        entry = durable.get(f.name)
        # Same name and same size within one RocksDB lineage means the same immutable
        # file; a size difference means another lineage, so upload ours.
        if f.shared and entry is not None and entry.size == f.size and (
                not exact or file_crc32(os.path.join(snapshot.directory, f.name))[1]
                == entry.checksum):
            reuse[f.name] = entry
    return reuse


def upload_snapshot(store: DurableStore, snapshot: LocalSnapshot, *,
                    base: PartitionManifest | None, key_group_range: tuple[int, int],
                    max_parallelism: int, states: Sequence[StateDescriptor] = (),
                    incremental: bool = True, extra_metrics: Mapping[str, Any] | None = None,
                    writer_epoch: int | None = None, facts: ManifestFacts | None = None,
                    ) -> tuple[PartitionManifest, CheckpointMetrics]:
    """Upload ``snapshot`` into ``store`` (rooted at the operator root) and publish its manifest.

    Parameters
    ----------
    store : DurableStore
        Rooted at ``<backend root>/<operator_id>``.
    snapshot : LocalSnapshot
        From :func:`statebackend.checkpoint.snapshot.take_snapshot`.
    base : PartitionManifest or None
        The manifest the state was restored from; None uploads everything.
    key_group_range, max_parallelism
        ``(first, last)`` key groups of the partition (inclusive), of how many.
    states : sequence of StateDescriptor
        The declared states, recorded in the manifest.
    incremental : bool
        False uploads every file every time.
    extra_metrics : mapping, optional
        The caller's metrics, recorded in the manifest.
    writer_epoch : int, optional
        The writer epoch the task holds: publication first proves it still owns the
        location (:mod:`statebackend.checkpoint.fencing`).
    facts : ManifestFacts, optional
        The caller's typed manifest fields (key types, event time, watermark).

    Returns
    -------
    tuple of (PartitionManifest, CheckpointMetrics)

    Raises
    ------
    CommitFailedError
        This attempt's directory already holds files (a name was reused).
    StorageError
        An upload or the publication failed; no manifest is published then.
    """
    t0 = time.perf_counter()
    counts0 = store.request_counts()
    n, p, attempt = snapshot.checkpoint_id, snapshot.partition, snapshot.attempt
    manifest = PartitionManifest(
        operator_id=snapshot.operator_id, partition=p, checkpoint_id=n, attempt=attempt,
        key_group_start=key_group_range[0], key_group_end=key_group_range[1],
        max_parallelism=max_parallelism,
        files=upload_new_files(store, snapshot, plan_reuse(snapshot, base, incremental)),
        base_checkpoint_id=None if base is None else base.checkpoint_id,
        states=tuple(states), created_at_ms=int(time.time() * 1000),
        writer_epoch=writer_epoch)
    manifest, metrics = publish_checkpoint(
        store, manifest, sync_duration_s=snapshot.sync_duration_s, async_start=t0,
        counts0=counts0, extra_metrics=extra_metrics, facts=facts)
    log.info("checkpoint %d partition %d attempt %s: uploaded %d file(s), %d bytes; reused %d",
             n, p, attempt, metrics.files_uploaded, metrics.bytes_uploaded,
             metrics.files_reused)
    return manifest, metrics


def upload_new_files(store: DurableStore, snapshot: LocalSnapshot,
                     reuse: Mapping[str, FileEntry]) -> tuple[FileEntry, ...]:
    """Upload the files of ``snapshot`` not in ``reuse`` (name -> base entry) under the
    attempt's directory; the durable entry of every file of the snapshot, in order.

    Raises
    ------
    CommitFailedError
        This attempt's directory already holds files (a name was reused).
    StorageError
        An upload failed, or a file changed while uploading.
    """
    n, p, attempt = snapshot.checkpoint_id, snapshot.partition, snapshot.attempt
    adir = attempt_dir(n, p, attempt)
    pairs = [(os.path.join(snapshot.directory, f.name), check_relative(f"{adir}/{f.name}"))
             for f in snapshot.files if f.name not in reuse]

    def reused_name(what: str) -> CommitFailedError:
        return CommitFailedError(
            f"checkpoint {n} partition {p}: attempt {attempt!r} already {what} under {adir}; "
            f"durable files are never overwritten, so retry under a fresh attempt name")

    # No listing of the attempt directory first (a LIST per checkpoint): every upload
    # refuses an existing name, which is how a reused attempt name shows up.
    if not pairs:
        existing = store.list_dir(adir)  # nothing to upload (rare): the manifest would overwrite
        if existing:
            raise reused_name("published a manifest" if f"{adir}/{MANIFEST_NAME}" in existing
                              else f"left {len(existing)} file(s)")
    try:
        transfers = {t.path: t for t in store.put_files(pairs)}
    except StorageError as exc:
        if isinstance(exc.__cause__, FileExistsError):
            raise reused_name("wrote files") from exc
        raise
    entries = []
    for f in snapshot.files:
        if f.name in reuse:
            b = reuse[f.name]
            entries.append(FileEntry(f.name, b.path, b.size, b.checksum, shared=True,
                                     uploaded=False))
            continue
        t = transfers[f"{adir}/{f.name}"]
        if t.size != f.size:
            raise StorageError(f"checkpoint {n} partition {p}: {f.name} changed while "
                               f"uploading ({f.size} -> {t.size} bytes)")
        entries.append(FileEntry(f.name, t.path, t.size, t.checksum, shared=f.shared,
                                 uploaded=True))
    return tuple(entries)
