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
own, ``work-<pid>-<random>``, that no other process opens, replaces or deletes while it
may be open. A task that does not find its instance in its own cache asks for it: it
drops a request (``<dir>.release``, naming its own directory) next to the directory
whose clean marker names exactly its base; the owner's timer thread (every
:data:`POLL_S`) closes the idle instance and renames the directory and its marker to the
requested name, and the task reopens it as a working directory (marker and sequence
number checked as for any working directory). The task waits at most
:data:`HANDOVER_WAIT_S`: when the owner is busy with that very instance, dead, or slow,
it withdraws the request and restores into a fresh directory from the verified local
copy (else durable storage). A cached instance that is not current any more is closed
when this process next runs a task (it is superseded once a newer local copy of its
partition exists), or by an idle timer; its directory is then deleted. Directories of
dead processes are taken over or deleted once their ``LOCK`` is free (probed with an
open-file-description lock query, which acquires nothing).

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

from ..model.manifest import PartitionManifest
from ..rocksdb.instance import RocksDBInstance
from .disk import MARKER_SUFFIX, LocalRecovery, atomic_write, pid_alive, read_clean_marker

log = logging.getLogger(__name__)

_DIR_RE = re.compile(r"^work-(\d+)-[0-9a-f]{12}$")
RELEASE_SUFFIX = ".release"
POLL_S = 0.01
"""How often a process checks for handover requests of its idle instances."""
HANDOVER_WAIT_S = 1.0
"""How long a task waits for another process to hand over its instance before restoring
from the local copy instead (closing an idle instance takes milliseconds)."""
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
            if (base is not None and entry.manifest_path == base.path
                    and _same_sequence(entry) and _directory_intact(entry)):
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
        return hit

    def opened(self, local: LocalRecovery, instance: RocksDBInstance) -> None:
        """Record that a task of this process opened ``instance`` (never probe its LOCK),
        then delete the partition's directories nobody holds any more."""
        self._in_use.add(instance.path)
        try:
            self._sweep_dirs(local)
        except Exception:  # noqa: BLE001 - tidying up never fails a task
            log.warning("sweeping kept-open directories of %s failed", local.partition_dir,
                        exc_info=True)

    def request_handover(self, local: LocalRecovery, base: PartitionManifest,
                         wait_s: float | None = None,
                         reasons: list[str] | None = None) -> bool:
        """Have another process of this machine hand over its open instance of ``base``.

        Looks for a working directory of another process whose clean marker names exactly
        ``base`` (an instance kept open, idle, since it took that checkpoint). Its owner's
        timer thread closes it and renames it and its marker to ``local.working_dir``, then
        :meth:`PartitionCheckpointer.restore` reopens it as a working directory (marker and
        sequence number checked as always). A dead owner's directory is taken directly once
        its LOCK is free. Waits at most ``wait_s``; False: restore from the local copy as
        usual (``local`` then names a fresh directory, so a late handover lands nowhere).
        ``wait_s`` defaults to :data:`HANDOVER_WAIT_S`, read at each call. ``reasons``
        gets why an instance that was asked for did not come (the restore report's
        fallback reason).
        """
        if wait_s is None:
            wait_s = HANDOVER_WAIT_S
        for name, pid in _marked_dirs(local, base):
            src = os.path.join(local.partition_dir, name)
            if pid == os.getpid():
                continue
            if not pid_alive(pid):
                if _take_from_dead(src, local):
                    return True
                continue
            request = src + RELEASE_SUFFIX
            try:
                # whole or not at all: the owner's timer must never read it half written
                if not atomic_write(request, os.path.basename(local.working_dir).encode(),
                                    exclusive=True, sync=False):
                    continue  # another task asked first
            except OSError:  # a full disk, a filesystem without hard links
                log.info("could not ask for %s", src, exc_info=True)
                return False
            # the owner may die while we wait (a killed worker), even halfway through
            # handing it over: then take it, or finish the move, directly
            def dead_owner(p=pid, d=src) -> bool:
                return not pid_alive(p) and _take_from_dead(d, local)

            if _wait_for(local.marker_path, wait_s, dead_owner):
                _unlink(request)
                return True
            try:
                os.unlink(request)  # withdrawn before the owner took it up
                why = "did not take the request up (busy with it, or slow)"
            except FileNotFoundError:
                # taken up: it is on its way
                if _wait_for(local.marker_path, wait_s, dead_owner):
                    return True
                why = ("took the request up but the directory did not arrive ("
                       + ("it is still there" if os.path.exists(src) else
                          "the owner deleted it: not reusable") + ")")
            if reasons is not None:
                reasons.append(f"the instance kept open by worker {pid} was not handed over "
                               f"within {wait_s:g} s: it {why}")
            local.use_working_dir(resident_dir_name())
            return False
        return False

    def give_back(self, local: LocalRecovery, instance: RocksDBInstance,
                  manifest: PartitionManifest) -> None:
        """Keep ``instance``, which just published ``manifest``, open for the next task
        (closed and deleted instead if it cannot even report its sequence number)."""
        try:
            seq = int(instance.db.latest_sequence_number())
        except Exception:  # noqa: BLE001 - the checkpoint is published: never fail the task
            log.warning("instance %s not kept open", instance.path, exc_info=True)
            self.discard(local, instance)
            return
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
        try:
            instance.close()
        except Exception:  # noqa: BLE001 - never hide the task's own error behind this
            log.warning("closing instance %s failed", instance.path, exc_info=True)
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

    def close_all(self, keep: bool = False) -> None:
        """Close every cached instance; ``keep``: leave the directories of unchanged ones
        (with their clean markers) for a task of another process to take over."""
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        for e in entries:
            if keep and _same_sequence(e):
                try:
                    e.instance.close()
                    continue
                except Exception:  # noqa: BLE001 - then delete it
                    pass
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
            base = name
            for suffix in (MARKER_SUFFIX, RELEASE_SUFFIX):
                if name.endswith(suffix):
                    base = name[:-len(suffix)]
            m = _DIR_RE.match(base)
            if not m:
                continue
            path = os.path.join(local.partition_dir, base)
            if name != base:  # a marker or request: goes when its directory has gone
                if not os.path.isdir(path):
                    _unlink(os.path.join(local.partition_dir, name))
                continue
            if path in mine:
                continue
            if int(m.group(1)) == os.getpid() or (not pid_alive(int(m.group(1)))
                                                  and not _lock_held(path)):
                # ours and not open (a task that died before closing), or a dead process's
                _remove(path)

    def release_requested(self) -> int:
        """Hand over every cached instance another process asked for; returns how many.

        The request (``<dir>.release``, holding the requester's directory name) is taken
        up by deleting it, so a requester that withdrew in time is never handed anything.
        """
        with self._lock:
            asked = [(k, e) for k, e in self._entries.items()
                     if os.path.exists(e.instance.path + RELEASE_SUFFIX)]
        done = 0
        for key, entry in asked:
            request = entry.instance.path + RELEASE_SUFFIX
            try:
                with open(request) as fh:
                    target = fh.read().strip()
                if not _DIR_RE.match(target):
                    # not a request of ours (requests are created whole, with their
                    # content): leave it to its writer, who withdraws it after its wait
                    continue
                os.unlink(request)
            except OSError:
                continue
            with self._lock:
                if self._entries.get(key) is not entry:
                    continue  # taken by a task of ours meanwhile
                del self._entries[key]
            done += self._hand_over(entry, target)
        return done

    def _hand_over(self, entry: _Entry, target: str) -> int:
        path = entry.instance.path
        clean = _same_sequence(entry)
        t0 = time.monotonic()
        try:
            entry.instance.close()
        except Exception:  # noqa: BLE001 - then it is not handed over
            clean = False
        took = time.monotonic() - t0
        if took > HANDOVER_WAIT_S / 2 or not clean:
            log.warning("handing over %s: closing took %.2f s, reusable: %s", path, took, clean)
        self._in_use.discard(path)
        dst = os.path.join(os.path.dirname(path), target)
        if clean and os.path.exists(path + MARKER_SUFFIX):  # target: checked by the caller
            try:
                os.rename(path, dst)
                # the marker last: the requester waits for it
                os.rename(path + MARKER_SUFFIX, dst + MARKER_SUFFIX)
                return 1
            except OSError:
                log.warning("handing over %s to %s failed", path, target, exc_info=True)
        _remove(path)
        return 0

    def _start_timer(self) -> None:
        if self._timer is not None and self._timer.is_alive():
            return
        idle_period = max(0.05, min(self.idle_timeout_s / 4, 30.0))

        def run() -> None:
            last_sweep = time.monotonic()
            while True:
                time.sleep(POLL_S)
                try:
                    self.release_requested()
                    if time.monotonic() - last_sweep >= idle_period:
                        last_sweep = time.monotonic()
                        self.sweep()
                except Exception:  # noqa: BLE001 - the timer must survive
                    log.warning("sweep of kept-open instances failed", exc_info=True)
                with self._lock:
                    if not self._entries:
                        self._timer = None
                        return

        self._timer = threading.Thread(target=run, name="statebackend-resident-idle",
                                       daemon=True)
        self._timer.start()


def _marked_dirs(local: LocalRecovery, base: PartitionManifest) -> list[tuple[str, int]]:
    """Kept-open directories of the partition whose clean marker names exactly ``base``."""
    try:
        names = os.listdir(local.partition_dir)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        m = _DIR_RE.match(name[:-len(MARKER_SUFFIX)]) if name.endswith(MARKER_SUFFIX) else None
        marker = m and read_clean_marker(os.path.join(local.partition_dir, name))
        if m and marker and (marker.checkpoint_id, marker.attempt) == (base.checkpoint_id,
                                                                        base.attempt):
            out.append((m.group(0), int(m.group(1))))
    return out


def _wait_for(path: str, wait_s: float, other=None) -> bool:
    """Wait at most ``wait_s`` for ``path`` to exist, or for ``other()`` to return True."""
    deadline = time.monotonic() + wait_s
    while True:
        if os.path.exists(path) or (other is not None and other()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def _same_sequence(entry: _Entry) -> bool:
    try:
        return int(entry.instance.db.latest_sequence_number()) == entry.sequence_number
    except Exception:  # noqa: BLE001 - a closed or broken instance is not reusable
        return False


def _directory_intact(entry: _Entry) -> bool:
    """The instance's directory is still there (someone may have deleted the local
    directory under a live worker, as a new machine would have none): RocksDB could not
    create its next file in a deleted one."""
    return os.path.exists(os.path.join(entry.instance.path, "CURRENT"))


def _superseded(entry: _Entry) -> bool:
    """A newer local copy of the partition exists: another process of this machine took a
    later checkpoint, so this instance will never be the base again."""
    copies = entry.local.list_copies()
    return bool(copies) and copies[-1][0] > entry.checkpoint_id




def _take_from_dead(src: str, local: LocalRecovery) -> bool:
    """Move the working directory ``src`` of a dead process, and its clean marker, to
    ``local``'s working directory once no process holds its LOCK (False: not taken).

    Also finishes a handover its owner died in: the directory already renamed to
    ``local``'s working directory (a name only that handover could create), the marker
    not yet."""
    try:
        if os.path.isdir(src):
            if _lock_held(src):
                return False
            os.rename(src, local.working_dir)
        elif not os.path.isdir(local.working_dir):
            return False
        os.rename(src + MARKER_SUFFIX, local.marker_path)
    except OSError:
        return False
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
    _unlink(path + RELEASE_SUFFIX)


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


def close_all(keep: bool = False) -> None:
    """Close every kept-open instance of this process; see :meth:`ResidentInstances.close_all`."""
    with _CACHES_LOCK:
        caches = list(_CACHES.values())
    for c in caches:
        c.close_all(keep)


# A worker that exits leaves its instances' directories to the next task of their partition.
atexit.register(close_all, True)
