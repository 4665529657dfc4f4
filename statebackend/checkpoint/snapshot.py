"""The synchronous part of a checkpoint: a native RocksDB checkpoint into a local directory."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..model.manifest import check_component
from ..rocksdb.instance import RocksDBInstance

# RocksDB's own files that never belong in a checkpoint (lock, info logs).
_NOT_STATE = ("LOCK", "LOG", "IDENTITY")


@dataclass(frozen=True)
class LocalFile:
    name: str
    size: int
    shared: bool  # an SST: immutable, reusable by later checkpoints


@dataclass(frozen=True)
class LocalSnapshot:
    """A native checkpoint directory of one partition, ready for the async upload.

    Attributes
    ----------
    directory : str
        Holds hard links to the live SSTs and copies of the private files.
    sequence_number : int or None
        RocksDB's sequence number at the snapshot (ties the working directory to it).
    """

    operator_id: str
    partition: int
    checkpoint_id: int
    attempt: str
    directory: str
    files: tuple[LocalFile, ...]
    sync_duration_s: float
    sequence_number: int | None = None
    working_dir: str | None = None  # the instance's directory when the snapshot was taken

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def is_shared(name: str) -> bool:
    return name.endswith(".sst")


def take_snapshot(instance: RocksDBInstance, directory: str, *, operator_id: str,
                  partition: int, checkpoint_id: int, attempt: str) -> LocalSnapshot:
    """Flush ``instance`` and hard-link its live files into ``directory`` (replaced if present).

    Parameters
    ----------
    instance : RocksDBInstance
        The open instance.
    directory : str
        Target directory; its parent is created.

    Returns
    -------
    LocalSnapshot
    """
    check_component(attempt)
    t0 = time.perf_counter()
    instance.flush()
    seq = int(instance.db.latest_sequence_number())
    instance.create_native_checkpoint(directory)
    files = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name in _NOT_STATE or name.startswith("LOG.old") or not os.path.isfile(path):
            continue
        check_component(name)
        files.append(LocalFile(name, os.stat(path).st_size, is_shared(name)))
    return LocalSnapshot(operator_id=operator_id, partition=partition,
                         checkpoint_id=checkpoint_id, attempt=attempt, directory=directory,
                         files=tuple(files), sync_duration_s=time.perf_counter() - t0,
                         sequence_number=seq, working_dir=instance.path)
