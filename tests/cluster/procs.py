"""Processors of the cluster scenarios that only make sense on a cluster (imported by
the executors by module name: cluster_job.py puts this directory on their PYTHONPATH)."""

from __future__ import annotations

import os
import signal

from processors import RunningCount


def _executor_jvm_pid() -> int | None:
    """The pid of the executor JVM above this Python worker (worker -> daemon -> JVM)."""
    pid = os.getppid()
    for _ in range(5):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
            if b"CoarseGrainedExecutorBackend" in cmd:
                return pid
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None


def _first_time(marker: str) -> bool:
    """True exactly once per marker path, across processes (a lost executor's shuffle
    output makes Spark rerun the stage, and a new stage attempt restarts attempt numbers)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class KillExecutorOnce(RunningCount):
    """A running count; partition 0 in micro-batch 1 kills its executor JVM (SIGKILL),
    once, after updating state, as a lost machine would."""

    def __init__(self, once_marker: str) -> None:
        self.once_marker = once_marker

    def handleInputRows(self, key, rows, timerValues):
        from pyspark import TaskContext

        out = list(super().handleInputRows(key, rows, timerValues))
        tc = TaskContext.get()
        if (tc.partitionId() == 0 and tc.getLocalProperty("streaming.sql.batchId") == "1"
                and _first_time(self.once_marker)):
            pid = _executor_jvm_pid()
            if pid is not None:
                with open(self.once_marker, "w") as fh:
                    fh.write(str(pid))
                os.kill(pid, signal.SIGKILL)
                os._exit(1)
        yield from out
