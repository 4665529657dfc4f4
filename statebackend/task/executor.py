"""Which Spark executor this Python process works for (resolves ``{executor_id}`` in
``local_dir``).

A Python worker is a child of the executor's Python daemon, itself a child of the
executor JVM. Spark passes the executor id to neither as an environment variable (except
on Kubernetes, which sets ``SPARK_EXECUTOR_ID``), but every cluster manager starts the
executor JVM with ``--executor-id <id>`` (``CoarseGrainedExecutorBackend`` and its YARN
and Kubernetes subclasses), so the id is read from the command line of the first ancestor
that has it. A process with no such ancestor runs under the driver JVM (local mode) or is
the driver itself: its executor id is Spark's ``driver``.
"""

from __future__ import annotations

import functools
import os

DRIVER_ID = "driver"  # SparkContext.DRIVER_IDENTIFIER: the executor id in local mode
_MAX_ANCESTORS = 8  # worker -> daemon -> JVM is three; leave room for wrapper scripts


def executor_id_from_cmdline(argv: list[str]) -> str | None:
    """The value after ``--executor-id`` in a command line, if any."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "--executor-id":
            return argv[i + 1]
    return None


def _cmdline_and_parent(pid: int) -> tuple[list[str], int]:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    with open(f"/proc/{pid}/stat") as fh:
        # the command name (2nd field) may hold spaces and ')': the parent pid is the
        # second field after the last ')'
        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
    return argv, ppid


@functools.lru_cache(maxsize=1)
def current_executor_id() -> str:
    """Spark's id of the executor this process works for; ``driver`` in local mode and on
    the driver (also where ``/proc`` does not exist: then every executor of a machine
    shares one ``local_dir``, which is safe, only less like separate hosts)."""
    env = os.environ.get("SPARK_EXECUTOR_ID")
    if env:
        return env
    pid = os.getppid()
    for _ in range(_MAX_ANCESTORS):
        if pid <= 1:
            break
        try:
            argv, pid_next = _cmdline_and_parent(pid)
        except (OSError, ValueError, IndexError):
            break
        found = executor_id_from_cmdline(argv)
        if found:
            return found
        pid = pid_next
    return DRIVER_ID
