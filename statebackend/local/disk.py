"""The local side of recovery for one (operator, partition): working directory, clean
marker and local secondary copies.

Layout under ``<local_root>/<operator_id>/p<partition>/``::

    work/                     the RocksDB working directory of the open instance
    work.clean.json           "work/ holds exactly checkpoint n, attempt a" (see below)
    copies/chk-<n>-<attempt>/ native checkpoint directories: upload source, then secondary copy
    copies/chk-<n>-<attempt>.inflight  a materialization still uploading it (never pruned)
    changelogs/chk-<n>-<attempt>.sbcl  changelog mode: this worker's changelogs (secondary)

The clean marker is written after checkpoint ``n`` is published and names ``n``, the attempt
and RocksDB's sequence number at the snapshot; it is removed whenever the working directory
is opened for writing. A restore trusts ``work/`` only when the marker names exactly the
requested checkpoint and attempt and the reopened database still has that sequence number,
so writes made after the snapshot (a failed or repeated attempt) are never taken for
committed state (invariant 1).

Secondary copies are secondary (invariant 7): nothing here raises on a failure to keep or
prune them; restore verifies a copy against the manifest before it is used.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..model.manifest import FileEntry, PartitionManifest, check_component
from ..storage.checksum import file_crc32

INFLIGHT_SUFFIX = ".inflight"  # statebackend.checkpoint.materialize marks uploads with it

log = logging.getLogger(__name__)

_COPY_RE = re.compile(r"^chk-(\d+)-(.+)$")
WORK_DIR = "work"
MARKER_SUFFIX = ".clean.json"


class LocalCopyError(Exception):
    """A local copy is missing or does not match its manifest (internal: triggers fallback)."""


@dataclass(frozen=True)
class CleanMarker:
    checkpoint_id: int
    attempt: str
    sequence_number: int | None


class LocalRecovery:
    """Local directories of one (operator, partition).

    Parameters
    ----------
    local_root : str
        Root of local state on this machine (``StateBackendOptions.local_dir``).
    operator_id : str
        Operator directory name (a safe path component).
    partition : int
        Partition index.
    num_retained : int
        Local secondary copies to keep after a successful checkpoint.
    working_dir_name : str
        Name of the working directory in the partition directory: ``work`` for an instance
        closed at the end of each task; a name of its own for an instance kept open
        between tasks (:mod:`statebackend.local.resident`), which no other process
        may replace while it is open.
    """

    def __init__(self, local_root: str, operator_id: str, partition: int,
                 num_retained: int = 2, working_dir_name: str = WORK_DIR) -> None:
        check_component(operator_id)
        if num_retained < 0:
            raise ValueError(f"num_retained must be >= 0, got {num_retained}")
        self.operator_id = operator_id
        self.partition = partition
        self.num_retained = num_retained
        self.partition_dir = os.path.join(os.path.abspath(local_root), operator_id,
                                          f"p{partition}")
        self.working_dir = os.path.join(self.partition_dir, check_component(working_dir_name))
        self.copies_dir = os.path.join(self.partition_dir, "copies")
        self.changelogs_dir = os.path.join(self.partition_dir, "changelogs")

    def use_working_dir(self, name: str) -> None:
        """Make ``name`` (a directory of this partition) the working directory."""
        self.working_dir = os.path.join(self.partition_dir, check_component(name))

    # --- clean marker -----------------------------------------------------------------

    @property
    def marker_path(self) -> str:
        return self.working_dir + MARKER_SUFFIX

    def write_clean_marker(self, checkpoint_id: int, attempt: str,
                           sequence_number: int | None) -> None:
        """Record that the working directory holds exactly this checkpoint (atomic write)."""
        data = json.dumps({"checkpoint_id": checkpoint_id, "attempt": attempt,
                           "sequence_number": sequence_number}).encode()
        atomic_write(self.marker_path, data)

    def read_clean_marker(self) -> CleanMarker | None:
        return read_clean_marker(self.marker_path)

    def clear_clean_marker(self) -> None:
        """Forget that the working directory is clean (call before opening it for writing)."""
        try:
            os.unlink(self.marker_path)
        except FileNotFoundError:
            pass

    def working_dir_matches(self, checkpoint_id: int, attempt: str) -> CleanMarker | None:
        """The marker when the working directory claims to be exactly (checkpoint, attempt)."""
        m = self.read_clean_marker()
        if m is None or (m.checkpoint_id, m.attempt) != (checkpoint_id, attempt):
            return None
        if not os.path.exists(os.path.join(self.working_dir, "CURRENT")):
            return None
        return m

    # --- secondary copies -------------------------------------------------------------

    def copy_dir(self, checkpoint_id: int, attempt: str) -> str:
        check_component(attempt)
        return os.path.join(self.copies_dir, f"chk-{checkpoint_id}-{attempt}")

    def list_copies(self) -> list[tuple[int, str, str]]:
        """``(checkpoint_id, attempt, directory)`` of every local copy, oldest first."""
        try:
            names = os.listdir(self.copies_dir)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            m = _COPY_RE.match(name)
            path = os.path.join(self.copies_dir, name)
            if m and not name.endswith(INFLIGHT_SUFFIX) and os.path.isdir(path):
                out.append((int(m.group(1)), m.group(2), path))
        return sorted(out)

    def inflight_copies(self) -> set[str]:
        """Copies a materialization is still uploading (marker names a live process)."""
        return {os.path.abspath(d) for _n, _a, d in self.list_copies() if copy_in_flight(d)}

    # --- changelogs (changelog mode) ----------------------------------------------------

    def changelog_path(self, checkpoint_id: int, attempt: str) -> str:
        check_component(attempt)
        return os.path.join(self.changelogs_dir, f"chk-{checkpoint_id}-{attempt}.sbcl")

    def recording_path(self) -> str:
        """A fresh name for the changelog being recorded (renamed at its checkpoint)."""
        return os.path.join(self.changelogs_dir, f".rec-{uuid.uuid4().hex[:12]}.sbcl")

    def prune_changelogs(self, upto: int | None, keep: Iterable[str] = ()) -> None:
        """Delete local changelogs of batches ``<= upto`` (subsumed by a materialization)
        and recordings left by failed tasks; never raises."""
        keep_set = {os.path.abspath(k) for k in keep}
        try:
            names = os.listdir(self.changelogs_dir)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self.changelogs_dir, name)
            if os.path.abspath(path) in keep_set:
                continue
            m = _COPY_RE.match(name)
            old = m is not None and upto is not None and int(m.group(1)) <= upto
            if old or (name.startswith(".rec-") and not _recent(path)):
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def verify_copy(self, manifest: PartitionManifest, *, threads: int = 2) -> str:
        """Check the local copy of ``manifest`` file by file (presence, size, CRC32).

        Returns
        -------
        str
            The copy's directory.

        Raises
        ------
        LocalCopyError
            Anything missing or different; the message names the file.
        """
        ref = manifest.snapshot_ref
        if ref is None:
            raise LocalCopyError("the checkpoint has no snapshot (changelogs only)")
        d = self.copy_dir(ref.checkpoint_id, ref.attempt)
        if not os.path.isdir(d):
            raise LocalCopyError(f"no local copy at {d}")
        for f in manifest.db_files:
            p = os.path.join(d, check_component(f.name))
            try:
                size = os.stat(p).st_size
            except FileNotFoundError:
                raise LocalCopyError(f"local copy misses {f.name}") from None
            if size != f.size:
                raise LocalCopyError(f"local {f.name}: expected {f.size} bytes, found {size}")

        def check(f: FileEntry) -> str | None:
            _size, crc = file_crc32(os.path.join(d, f.name))
            return None if crc == f.checksum else (
                f"local {f.name}: expected {f.checksum}, found {crc}")

        # Checksums dominate restore time on big states; zlib releases the GIL on large
        # chunks, so threads overlap on several cores. Largest first balances the pool.
        files = sorted(manifest.db_files, key=lambda f: -f.size)
        if threads > 1 and len(files) > 1:
            with ThreadPoolExecutor(min(threads, len(files))) as pool:
                problems = [p for p in pool.map(check, files) if p]
        else:
            problems = [p for p in map(check, files) if p]
        if problems:
            raise LocalCopyError(problems[0])
        return d

    def materialize_copy(self, copy_dir: str, files: Iterable[FileEntry]) -> str:
        """Build a fresh working directory from a verified copy and swap it in.

        SST files are hard-linked (immutable in RocksDB, so sharing inodes is safe); the
        small private files are copied, because RocksDB may append to or replace them.
        """
        tmp = self.fresh_dir()
        try:
            for f in files:
                src = os.path.join(copy_dir, f.name)
                dst = os.path.join(tmp, f.name)
                if f.shared:
                    try:
                        os.link(src, dst)
                    except OSError:
                        shutil.copy2(src, dst)  # e.g. another device: still correct
                else:
                    shutil.copy2(src, dst)
            return self.install_working_dir(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def fresh_dir(self) -> str:
        """An empty directory next to the working directory, for building a new one."""
        d = os.path.join(self.partition_dir, f".work-{uuid.uuid4().hex[:12]}")
        os.makedirs(d)
        return d

    def install_working_dir(self, built: str) -> str:
        """Replace the working directory by ``built`` (a :meth:`fresh_dir`)."""
        self.clear_clean_marker()
        self.discard_working_dir()
        os.rename(built, self.working_dir)
        return self.working_dir

    def discard_working_dir(self) -> None:
        self.clear_clean_marker()
        if os.path.exists(self.working_dir):
            # Rename first so a crash mid-delete never leaves a half-deleted "work".
            trash = os.path.join(self.partition_dir, f".trash-{uuid.uuid4().hex[:12]}")
            os.rename(self.working_dir, trash)
            shutil.rmtree(trash, ignore_errors=True)

    def remove_copy(self, directory: str) -> None:
        """Delete one copy; never raises."""
        try:
            os.unlink(directory + INFLIGHT_SUFFIX)
        except OSError:
            pass
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            pass
        except OSError:
            log.warning("could not remove local copy %s", directory, exc_info=True)

    def retain(self, keep: Iterable[str] = ()) -> list[str]:
        """Prune local copies to the newest ``num_retained`` (plus ``keep``); never raises.

        Returns
        -------
        list of str
            Directories removed.
        """
        removed: list[str] = []
        try:
            keep_set = {os.path.abspath(k) for k in keep} | self.inflight_copies()
            copies = self.list_copies()
            newest = {d for _n, _a, d in copies[len(copies) - self.num_retained:]} \
                if self.num_retained else set()
            for _n, _a, d in copies:
                if d not in newest and os.path.abspath(d) not in keep_set:
                    self.remove_copy(d)
                    removed.append(d)
            self._sweep_leftovers()
        except Exception:  # noqa: BLE001 - a secondary copy never fails a checkpoint
            log.warning("pruning local copies under %s failed", self.copies_dir, exc_info=True)
        return removed

    def _sweep_leftovers(self) -> None:
        """Remove half-built working directories left by a crash."""
        try:
            names = os.listdir(self.partition_dir)
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith((".work-", ".trash-")):
                shutil.rmtree(os.path.join(self.partition_dir, name), ignore_errors=True)


def copy_in_flight(directory: str) -> bool:
    """Whether a live process still uploads the local copy ``directory`` (its in-flight
    marker, written by :func:`statebackend.checkpoint.materialize.materialize_in_background`,
    names that process)."""
    try:
        with open(directory + INFLIGHT_SUFFIX) as fh:
            pid = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return False
    return pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine is alive (a zombie, exited but not yet
    reaped by its parent, is not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True  # no procfs: cannot tell more
    # the state letter follows "(comm) "; comm may hold any character, so the last ')'
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] not in (b"Z", b"X")


def _recent(path: str, seconds: float = 3600.0) -> bool:
    """Modified within the last hour: a recording another task may still be writing."""
    try:
        return time.time() - os.stat(path).st_mtime < seconds
    except OSError:
        return False


def read_clean_marker(path: str) -> CleanMarker | None:
    """The clean marker at ``path`` (None: absent or unreadable, logged)."""
    try:
        with open(path, "rb") as fh:
            d = json.loads(fh.read())
        return CleanMarker(int(d["checkpoint_id"]), str(d["attempt"]),
                           None if d.get("sequence_number") is None
                           else int(d["sequence_number"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, OSError):
        log.warning("ignoring unreadable clean marker %s", path)
        return None


def atomic_write(path: str, data: bytes, *, exclusive: bool = False,
                 sync: bool = True) -> bool:
    """Write ``path`` whole: no reader ever sees it empty or partly written (a complete
    temporary file renamed, or, ``exclusive``, hard-linked: created only if ``path`` does
    not exist yet; False then). ``sync``: fsync the data first (survives a crash)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        if not exclusive:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
