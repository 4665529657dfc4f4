"""Processors of test_faults_more.py (workers import this module by name, see conftest.py).

Each installs, in the Python worker that runs it, a patch that injects one fault; faults
are switched and synchronised through files in the test's temporary directory, which
every process of a local Spark session sees.
"""

from __future__ import annotations

import os
import time

from processors import RunningCount


def _task() -> tuple[int, int, int]:
    from pyspark import TaskContext

    tc = TaskContext.get()
    return (int(tc.getLocalProperty("streaming.sql.batchId")), tc.partitionId(),
            tc.attemptNumber())


def _first_time(marker: str) -> bool:
    """True exactly once per marker path, across processes."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


_PATCHED: dict[str, object] = {}


class HoldFirstUpload(RunningCount):
    """RunningCount whose first SST upload of checkpoint ``checkpoint_id`` announces itself
    (creates ``<sync>/uploading``) and waits for ``<sync>/stopped``: the test stops the S3
    server in between, so the upload meets a dead server, and restarts it later."""

    def __init__(self, sync_dir: str, checkpoint_id: int, root_contains: str) -> None:
        self.sync_dir = sync_dir
        self.checkpoint_id = checkpoint_id
        self.root_contains = root_contains  # only this test's store (workers are reused)

    def init(self, handle):
        _PATCHED["hold"] = (self.sync_dir, self.checkpoint_id, self.root_contains)
        if "put_file" not in _PATCHED:
            from statebackend.storage.fsspec_store import FsspecStore

            put_file = FsspecStore.put_file

            def held_put_file(store, local_path, path):
                hold = _PATCHED.get("hold")
                if hold is not None:
                    sync, n, root = hold
                    if (root in store.root and f"chk-{n}/" in path
                            and path.endswith((".sst", ".sbcl"))  # either mode's data
                            and _first_time(os.path.join(sync, "uploading"))):
                        deadline = time.monotonic() + 60
                        while (not os.path.exists(os.path.join(sync, "stopped"))
                               and time.monotonic() < deadline):
                            time.sleep(0.02)
                return put_file(store, local_path, path)

            FsspecStore.put_file = held_put_file
            _PATCHED["put_file"] = held_put_file
        super().init(handle)


class FailAfterPublish(RunningCount):
    """RunningCount whose first attempt of partition 0 in micro-batch 1 fails right after it
    has published its manifest (once per ``once_marker``, and only for operator
    ``operator_id``): Spark's retry publishes a second attempt of the same checkpoint, as a
    speculative duplicate that also finished would."""

    def __init__(self, operator_id: str, once_marker: str) -> None:
        self.operator_id = operator_id
        self.once_marker = once_marker

    def init(self, handle):
        _PATCHED["fail"] = (self.operator_id, self.once_marker)
        if "checkpoint" not in _PATCHED:
            from statebackend.checkpoint import PartitionCheckpointer

            checkpoint = PartitionCheckpointer.checkpoint

            def checkpoint_then_fail(cp, *args, **kwargs):
                out = checkpoint(cp, *args, **kwargs)
                op, marker = _PATCHED["fail"]  # type: ignore[misc]
                if cp.operator_id == op and _task() == (1, 0, 0) and _first_time(marker):
                    raise RuntimeError("injected failure after publishing the manifest")
                return out

            PartitionCheckpointer.checkpoint = checkpoint_then_fail
            _PATCHED["checkpoint"] = checkpoint_then_fail
        super().init(handle)
