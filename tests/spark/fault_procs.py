"""Processors and a filesystem that inject faults into the Spark workers.

Workers import this module by name when they unpickle a processor defined here (see
conftest.py), so everything a fault needs on the executor side lives here: the processors
that kill or fail their task, the patch that makes the local disk "full" while a local copy
is kept, and the ``sbfaulty://`` fsspec filesystem whose uploads fail while an outage
marker file exists. Faults are switched by files on the local disk, which every process of
a local Spark session sees, and are scoped to one test's temporary directory.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from processors import RunningCount

from statebackend.storage.testing import FaultInjectingFileSystem


def _task() -> tuple[int, int, int]:
    from pyspark import TaskContext

    tc = TaskContext.get()
    return (int(tc.getLocalProperty("streaming.sql.batchId")), tc.partitionId(),
            tc.attemptNumber())


class ExitOnce(RunningCount):
    """RunningCount whose Python worker dies (``os._exit``) in the first attempt of
    partition 0 of micro-batch 1, after it has updated some state: a killed worker."""

    def handleInputRows(self, key, rows, timerValues):
        out = list(super().handleInputRows(key, rows, timerValues))
        batch, partition, attempt = _task()
        if (batch, partition, attempt) == (1, 0, 0):
            os._exit(17)
        yield from out


class FailQueryAt(RunningCount):
    """RunningCount failing every attempt of partition 0 in micro-batch ``fail_batch``,
    after it has updated some state: the query fails (Spark's task retry fails too)."""

    def __init__(self, fail_batch: int | None) -> None:
        self.fail_batch = fail_batch

    def handleInputRows(self, key, rows, timerValues):
        out = list(super().handleInputRows(key, rows, timerValues))
        batch, partition, _attempt = _task()
        if partition == 0 and batch == self.fail_batch:
            raise RuntimeError(f"injected query failure in micro-batch {batch}")
        yield from out


# --- local disk full while the local copy is kept ------------------------------------

_DISK_FULL: dict[str, Any] = {"marker": None, "installed": False}


def _disk_full(partition: int, checkpoint_id: int) -> bool:
    marker = _DISK_FULL["marker"]
    return (marker is not None and os.path.exists(marker) and partition == 0
            and checkpoint_id == 1)


def _install_disk_full_patch() -> None:
    """Make keeping the local state of partition 0, checkpoint 1 fail with ENOSPC: the
    clean marker that lets the next task trust the working directory cannot be written
    (the hard-linked copy itself needs no new space)."""
    if _DISK_FULL["installed"]:
        return
    from statebackend.local.disk import LocalRecovery

    write_marker = LocalRecovery.write_clean_marker

    def full_write_marker(self, checkpoint_id, attempt, sequence_number):
        if _disk_full(self.partition, checkpoint_id):
            raise OSError(errno.ENOSPC, "No space left on device (injected)", self.marker_path)
        return write_marker(self, checkpoint_id, attempt, sequence_number)

    LocalRecovery.write_clean_marker = full_write_marker
    _DISK_FULL["installed"] = True


class DiskFullOnce(RunningCount):
    """RunningCount whose partition 0 cannot keep its local copy of checkpoint 1 (disk full)
    while ``marker`` exists."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def init(self, handle):
        _DISK_FULL["marker"] = self.marker
        _install_disk_full_patch()
        super().init(handle)


# --- storage outage ------------------------------------------------------------------


class Counting(RunningCount):
    """RunningCount from this module, so that workers import it (and register
    ``sbfaulty://``) before they open the store."""


class OutageFileSystem(FaultInjectingFileSystem):
    """``sbfaulty://<local path>``: a local filesystem whose SST uploads of checkpoint
    ``fail_checkpoint`` fail with a connection error while ``outage_marker`` exists."""

    protocol = "sbfaulty"

    def __init__(self, outage_marker: str, fail_checkpoint: int = 1, **_: Any) -> None:
        super().__init__(LocalFileSystem(auto_mkdir=True), fail_method="put_file",
                         match=f"/chk-{fail_checkpoint}/p")
        self.outage_marker = outage_marker

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        if path.startswith("sbfaulty://"):
            path = path[len("sbfaulty://"):]
        return path.rstrip("/") or "/"

    def _maybe_fail(self, method: str, path: str) -> bool:
        # the checkpoint's data files, in either mode (SSTs, or the changelog)
        return (method == self.fail_method and self.match in path
                and path.endswith((".sst", ".sbcl"))
                and os.path.exists(self.outage_marker))


fsspec.register_implementation("sbfaulty", OutageFileSystem, clobber=True)
