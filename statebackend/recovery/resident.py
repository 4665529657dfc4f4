"""Instances kept open in a worker process between micro-batches (``keep_instances_open``).

Closing a RocksDB instance at the end of every task aborts the compactions it started,
so level 0 piles up and every read checks every L0 file. Here a task that published its
checkpoint hands its still-open instance to a per-process cache instead; RocksDB's
background threads keep compacting between batches, and the next task for that partition
in the same process skips the restore and the open.

What makes a cached instance usable (invariant 1, version discipline): it is reused only
by a task whose resolved base manifest is exactly the checkpoint the instance produced
(same path: checkpoint id, partition and attempt), and only when RocksDB's sequence
number has not moved since. Anything else (a retry after the checkpoint was taken, a
speculative attempt chosen instead, a batch this process did not run) closes it and the
task restores as usual.

Handover between processes. Spark gives the next task of a partition to any idle Python
worker of the executor, so the instance may be open in another process, which holds
RocksDB's ``LOCK``. Each kept-open instance therefore lives in a working directory of its
own, ``work-<pid>-<random>``, that no other process ever opens, replaces or deletes
while it may be open: a task that does not find its instance in its own cache restores
into a fresh directory (from the verified local copy, else durable storage) and never
waits for the other process. A cached instance that is not current any more is closed
when this process next runs a task (it is superseded once a newer local copy of its
partition exists), or by an idle timer; its directory is then deleted. Directories of
dead processes are deleted by the next task of their partition, once their ``LOCK`` is
free (probed with an open-file-description lock query, which acquires nothing).

Memory: every instance of a process shares one block cache and one write buffer manager
when ``bounded_memory`` is on (:mod:`statebackend.rocksdb.options`), so the number of
instances kept open does not change the bound.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import re
import shutil
import struct
import threading
import time
import uuid
from dataclasses import dataclass

from ..checkpoint.manifest import PartitionManifest
from ..rocksdb.instance import RocksDBInstance
from .local import MARKER_SUFFIX, LocalRecovery

log = logging.getLogger(__name__)

_DIR_RE = re.compile(r"^work-(\d+)-[0-9a-f]{12}$")
# struct flock on 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid (padded to 32)
_FLOCK = "hh4xqqi4x"


def resident_dir_name() -> str:
    """A working directory name of this process, unique to one instance."""
    return f"work-{os.getpid()}-{uuid.uuid4().hex[:12]}"


@dataclass
class _Entry:
    instance: RocksDBInstance
    manifest_path: str  # the checkpoint the instance produced (partition, id, attempt)
    checkpoint_id: int
    sequence_number: int
    local: LocalRecovery  # its partition's local directories
    last_used: float  # time.monotonic() when handed back


class ResidentInstances:
    """The open instances of one process, at most one per (local root, operator, partition).

    Thread-safe: the idle timer closes entries from its own thread, and an entry taken by
    a task is out of the cache until it is handed back.

    Parameters
    ----------
    idle_timeout_s : float
        An instance unused for this long is closed.
    """

    def __init__(self, idle_timeout_s: float = 300.0) -> None:
        self.idle_timeout_s = idle_timeout_s
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._timer: threading.Thread | None = None
        self._in_use: set[str] = set()  # instance paths taken by a running task
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    # --- one task's lifecycle ---------------------------------------------------------

    def take(self, local: LocalRecovery, base: PartitionManifest | None
             ) -> RocksDBInstance | None:
        """The cached instance of ``local``'s partition if it holds exactly ``base``.

        A cached instance that does not (or whose sequence number moved) is closed and its
        directory deleted. Also closes this process's superseded and idle instances, and
        deletes directories of this partition left by dead processes.
        """
        self.sweep()
        with self._lock:
            entry = self._entries.pop(local.partition_dir, None)
        hit = None
        if entry is not None:
            if base is not None and entry.manifest_path == base.path and _same_sequence(entry):
                hit = entry.instance
            else:
                log.info("partition dir %s: kept-open instance of checkpoint %d is not the "
                         "base %s: closing it", local.partition_dir, entry.checkpoint_id,
                         None if base is None else base.path)
                self._close(entry)
        if hit is not None:
            self.hits += 1
            self._in_use.add(hit.path)
        else:
            self.misses += 1
        self._sweep_dirs(local)
        return hit

    def opened(self, instance: RocksDBInstance) -> None:
        """Record that a task of this process opened ``instance`` (never probe its LOCK)."""
        self._in_use.add(instance.path)

    def give_back(self, local: LocalRecovery, instance: RocksDBInstance,
                  manifest: PartitionManifest) -> None:
        """Keep ``instance``, which just published ``manifest``, open for the next task."""
        seq = int(instance.db.latest_sequence_number())
        entry = _Entry(instance, manifest.path, manifest.checkpoint_id, seq, local,
                       time.monotonic())
        with self._lock:
            old = self._entries.pop(local.partition_dir, None)
            self._entries[local.partition_dir] = entry
            self._in_use.discard(instance.path)
        if old is not None and old.instance is not instance:
            self._close(old)
        self._start_timer()

    def discard(self, local: LocalRecovery, instance: RocksDBInstance) -> None:
        """Close ``instance`` (a failed task's, or one not to keep) and delete its directory."""
        self._in_use.discard(instance.path)
        instance.close()
        if os.path.dirname(instance.path) == local.partition_dir and \
                _DIR_RE.match(os.path.basename(instance.path)):
            _remove(instance.path)

    def forget(self, local: LocalRecovery) -> None:
        """Close the cached instance of ``local``'s partition, if any (its state is stale)."""
        with self._lock:
            entry = self._entries.pop(local.partition_dir, None)
        if entry is not None:
            self._close(entry)

    # --- closing stale instances ------------------------------------------------------

    def sweep(self, now: float | None = None) -> int:
        """Close idle instances and those another process has moved past; returns how many."""
        now = time.monotonic() if now is None else now
        stale = []
        with self._lock:
            for key, e in list(self._entries.items()):
                if now - e.last_used >= self.idle_timeout_s or _superseded(e):
                    stale.append(self._entries.pop(key))
        for e in stale:
            self._close(e)
        return len(stale)

    def close_all(self) -> None:
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        for e in entries:
            self._close(e)

    def _close(self, entry: _Entry) -> None:
        try:
            entry.instance.close()
        except Exception:  # noqa: BLE001 - closing a stale instance never fails a task
            log.warning("closing kept-open instance %s failed", entry.instance.path,
                        exc_info=True)
        self._in_use.discard(entry.instance.path)
        _remove(entry.instance.path)

    def _sweep_dirs(self, local: LocalRecovery) -> None:
        """Delete this partition's kept-open directories nobody holds open any more."""
        try:
            names = os.listdir(local.partition_dir)
        except FileNotFoundError:
            return
        with self._lock:
            mine = {e.instance.path for e in self._entries.values()} | set(self._in_use)
        for name in names:
            base = name[:-len(MARKER_SUFFIX)] if name.endswith(MARKER_SUFFIX) else name
            m = _DIR_RE.match(base)
            if not m:
                continue
            path = os.path.join(local.partition_dir, base)
            if name != base:  # a clean marker: goes when its directory has gone
                if not os.path.isdir(path):
                    _unlink(os.path.join(local.partition_dir, name))
                continue
            if path in mine:
                continue
            if int(m.group(1)) == os.getpid() or (not _pid_alive(int(m.group(1)))
                                                  and not _lock_held(path)):
                # ours and not open (a task that died before closing), or a dead process's
                _remove(path)

    def _start_timer(self) -> None:
        if self._timer is not None and self._timer.is_alive():
            return
        period = max(0.05, min(self.idle_timeout_s / 4, 30.0))

        def run() -> None:
            while True:
                time.sleep(period)
                try:
                    self.sweep()
                except Exception:  # noqa: BLE001 - the timer must survive
                    log.warning("idle sweep of kept-open instances failed", exc_info=True)
                with self._lock:
                    if not self._entries:
                        self._timer = None
                        return

        self._timer = threading.Thread(target=run, name="statebackend-resident-idle",
                                       daemon=True)
        self._timer.start()


def _same_sequence(entry: _Entry) -> bool:
    try:
        return int(entry.instance.db.latest_sequence_number()) == entry.sequence_number
    except Exception:  # noqa: BLE001 - a closed or broken instance is not reusable
        return False


def _superseded(entry: _Entry) -> bool:
    """A newer local copy of the partition exists: another process of this machine took a
    later checkpoint, so this instance will never be the base again."""
    copies = entry.local.list_copies()
    return bool(copies) and copies[-1][0] > entry.checkpoint_id


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_held(path: str) -> bool:
    """Whether some process holds RocksDB's LOCK in ``path``.

    Asks with ``F_OFD_GETLK``, which acquires nothing. Never call it on a directory this
    process has open: closing any descriptor of a file drops the process's POSIX locks on
    it, RocksDB's included.
    """
    try:
        fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: keep it
    try:
        res = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, 0, 0, 0, 0))
        return struct.unpack(_FLOCK, res)[0] != fcntl.F_UNLCK
    except OSError:
        return True
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    _unlink(path + MARKER_SUFFIX)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        log.warning("could not remove %s", path, exc_info=True)


_CACHES: dict[float, ResidentInstances] = {}
_CACHES_LOCK = threading.Lock()


def resident_instances(idle_timeout_s: float) -> ResidentInstances:
    """This process's cache (one per idle timeout; in practice one)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(idle_timeout_s)
        if cache is None:
            cache = _CACHES[idle_timeout_s] = ResidentInstances(idle_timeout_s)
        return cache


def close_all() -> None:
    """Close every kept-open instance of this process (tests, process exit)."""
    with _CACHES_LOCK:
        caches = list(_CACHES.values())
    for c in caches:
        c.close_all()


atexit.register(close_all)
