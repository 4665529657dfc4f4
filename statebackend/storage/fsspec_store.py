"""A :class:`DurableStore` over any fsspec filesystem (local paths, ``memory://``, ``s3://``...).

Publication is atomic per filesystem kind: on a local filesystem, content goes to a temp
file first and is then linked (no overwrite) or renamed into place; on object stores (and
the in-memory filesystem) a single put is already all-or-nothing. Every transfer is
retried with exponential backoff on transient errors and verified by size afterwards;
downloads are also verified by CRC32, computed while streaming, so it costs no extra read.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from ..errors import (
    ChecksumMismatchError,
    OptionsError,
    StorageError,
    TransientStorageError,
    UnsafePathError,
)
from ..model.manifest import check_relative
from ..redact import redact_text, redact_url
from .accounting import DEFAULT_PART_SIZE, AccountingFileSystem, RequestCounter, RequestCounts
from .base import DurableStore, StoreFileNotFoundError, Transfer, _expand_get
from .checksum import bytes_crc32, file_crc32
from .pooled import Job, each_in_order, run_all

log = logging.getLogger(__name__)

_MEMORY_CREATE_LOCK = threading.Lock()

T = TypeVar("T")

# Failures that retrying cannot fix: the answer will be the same next time.
_PERMANENT: tuple[type[BaseException], ...] = (
    FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
    NotADirectoryError, UnsafePathError, ValueError, TypeError, KeyError,
)


def _is_throttle(exc: BaseException) -> bool:
    """The store asks us to slow down (S3 503 SlowDown; s3fs raises OSError(EBUSY))."""
    if isinstance(exc, OSError) and exc.errno == errno.EBUSY:
        return True
    text = f"{type(exc).__name__} {exc}".lower()
    return any(w in text for w in ("slowdown", "slow down", "throttl", "503"))


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TransientStorageError):
        return True
    if isinstance(exc, _PERMANENT) or isinstance(exc, StorageError):
        return False
    # Generic OS errors (connection resets, timeouts, EIO), and the network errors of
    # remote filesystems, which do not share a base class, are worth another try.
    if isinstance(exc, (OSError, ConnectionError, TimeoutError)):
        return True
    name = type(exc).__name__.lower()
    return any(w in name for w in ("timeout", "connection", "throttl", "slowdown", "unavailable"))


_POOLS = {  # kind of transfer -> (attribute holding its thread count, thread name prefix,
    # threads per count)
    "upload": ("upload_threads", "sb-upload", 1),
    # uploads no critical path waits for (put_files(background=True)): threads of their
    # own, so a batch's upload never queues behind them
    "background": ("upload_threads", "sb-upload-bg", 1),
    # twice the threads, download_threads of them transferring at once (its slots): a thread
    # checks the file it brought down while another transfer takes its connection
    "download": ("download_threads", "sb-download", 2),
    "read": ("read_threads", "sb-read", 1),
}


class FsspecStore(DurableStore):
    """Durable storage rooted at an fsspec URL.

    Parameters
    ----------
    url : str
        Any fsspec URL; a plain path means the local filesystem.
    upload_threads, download_threads : int
        Transfers at once of :meth:`put_files` and of :meth:`get_files` (whose pool has
        twice the threads: a file's checksum is taken after its transfer ends).
    read_threads : int
        Bound of the pool of :meth:`get_bytes_many` and :meth:`sizes` (small reads whose
        time is the store's latency: the driver reads one manifest per partition).
    retries : int
        Extra attempts after the first one for transient failures.
    storage_options : dict, optional
        Passed to the fsspec filesystem (e.g. ``client_kwargs`` for S3).
    backoff_s : float
        First backoff delay; doubles each retry, with jitter. Throttling (S3's 503
        SlowDown) backs off ten times longer.
    fs : fsspec.AbstractFileSystem, optional
        A ready filesystem to use instead of resolving ``url`` (tests wrap one to inject
        faults). ``url`` is then taken as a path on that filesystem.
    part_size : int
        Multipart part size of uploads and chunk of parallel ranged downloads (S3).

    Notes
    -----
    The store pickles without its filesystem handle and pools, which are rebuilt lazily,
    so it can ship to Spark executors. Every call to the filesystem goes through an
    :class:`~statebackend.storage.accounting.AccountingFileSystem`; :meth:`request_counts`
    reads its running totals (per process, shared with child stores).
    """

    def __init__(self, url: str, *, upload_threads: int = 4, download_threads: int = 4,
                 retries: int = 3, storage_options: dict[str, Any] | None = None,
                 backoff_s: float = 0.05, fs: fsspec.AbstractFileSystem | None = None,
                 part_size: int = DEFAULT_PART_SIZE, read_threads: int = 64) -> None:
        if upload_threads < 1 or download_threads < 1 or read_threads < 1:
            raise ValueError(f"upload_threads, download_threads and read_threads must be "
                             f">= 1, got {upload_threads}, {download_threads} and "
                             f"{read_threads}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.url = url
        self.upload_threads = upload_threads
        self.download_threads = download_threads
        self.read_threads = read_threads
        self.retries = retries
        self.backoff_s = backoff_s
        self.storage_options = dict(storage_options or {})
        self.part_size = part_size
        self.requests = RequestCounter()
        self._given_fs = fs
        self._lock = threading.Lock()
        self._fs: fsspec.AbstractFileSystem | None = None
        # by kind (_POOLS), made lazily: its threads, and its transfers at once
        self._pools: dict[str, tuple[ThreadPoolExecutor, threading.BoundedSemaphore]] = {}
        fs_, root = self._resolve()
        self._fs = fs_
        self.root = root

    # --- plumbing ---------------------------------------------------------------------

    def _resolve(self) -> tuple[AccountingFileSystem, str]:
        if self._given_fs is not None:
            fs = self._given_fs
            root = fs._strip_protocol(self.url)
        else:
            fs, root = url_to_fs(self.url, **self.storage_options)
        if isinstance(_innermost(fs), LocalFileSystem):
            root = os.path.abspath(root)
        counted = AccountingFileSystem(fs, counter=self.requests, part_size=self.part_size)
        return counted, root.rstrip("/") or "/"

    @property
    def fs(self) -> AccountingFileSystem:
        """The (counting) filesystem every remote call goes through."""
        if self._fs is None:
            with self._lock:
                if self._fs is None:
                    self._fs = self._resolve()[0]
        return self._fs

    @property
    def atomic_rename(self) -> bool:
        """True when publication goes through temp file + rename (local filesystems)."""
        return isinstance(_innermost(self.fs), LocalFileSystem)

    def request_counts(self) -> RequestCounts:
        """Object-store requests made through this store (and its children) so far, in
        this process."""
        return self.requests.snapshot()

    def _pool(self, kind: str) -> tuple[ThreadPoolExecutor, threading.BoundedSemaphore]:
        """The thread pool of one kind of transfer (:data:`_POOLS`), and the slots of its
        transfers at once (fewer than its threads when a thread has work after one)."""
        with self._lock:
            pool = self._pools.get(kind)
            if pool is None:
                threads, prefix, per = _POOLS[kind]
                n = getattr(self, threads)
                pool = self._pools[kind] = (
                    ThreadPoolExecutor(n * per, thread_name_prefix=prefix),
                    threading.BoundedSemaphore(n))
            return pool

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Handles, pools and locks do not survive pickling; rebuilt lazily on first use.
        for k in ("_fs", "_lock", "requests"):
            state[k] = None
        state["_pools"] = {}
        if state["_given_fs"] is not None:
            # An injected filesystem pickles only if it can (fsspec filesystems do).
            pass
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self.requests = RequestCounter()  # counts are per process

    def __repr__(self) -> str:
        return f"FsspecStore({redact_url(self.url)!r})"

    def full_path(self, path: str) -> str:
        """The filesystem path of ``path`` after checking that it stays under the root."""
        check_relative(path)
        return f"{self.root}/{path}" if self.root != "/" else f"/{path}"

    def _retry(self, what: str, fn: Callable[[int], T], path: str | None = None) -> T:
        """Run ``fn(try_number)`` with retries and backoff on transient errors.

        Errors raised when giving up carry ``path`` as their ``path`` attribute.
        """
        for attempt in range(self.retries + 1):
            try:
                return fn(attempt)
            except Exception as exc:  # noqa: BLE001 - classified below
                if isinstance(exc, StorageError) and not isinstance(exc, TransientStorageError):
                    raise
                err: StorageError
                # a filesystem's own message may quote the root, which may hold the
                # location's credentials: redact as the location itself
                why = redact_text(f"{type(exc).__name__}: {exc}", self.url)
                if not _is_transient(exc):
                    if isinstance(exc, FileNotFoundError):
                        err = StoreFileNotFoundError(f"{what}: not found in "
                                                     f"{redact_url(self.url)} "
                                                     f"({redact_text(exc, self.url)})")
                    else:
                        err = StorageError(f"{what} failed: {why}")
                elif attempt >= self.retries:
                    err = StorageError(f"{what} failed after {self.retries + 1} tries: {why}")
                else:
                    base = self.backoff_s * (10 if _is_throttle(exc) else 1)
                    delay = base * (2 ** attempt) * (0.5 + random.random())
                    log.info("%s failed (%s); retry %d/%d in %.2fs", what, why,
                             attempt + 1, self.retries, delay)
                    if delay > 0:
                        time.sleep(delay)
                    continue
                err.path = path  # type: ignore[attr-defined]
                raise err from exc
        raise AssertionError("unreachable")

    def _remote_size(self, full: str) -> int | None:
        return self.fs.head(full)

    # --- DurableStore -----------------------------------------------------------------

    def put_file(self, local_path: str, path: str) -> Transfer:
        full = self.full_path(path)
        size, checksum = file_crc32(local_path)

        exclusive = self.fs.exclusive_put

        def once(attempt: int) -> Transfer:
            if exclusive:
                return self._put_exclusive(local_path, full, path, size, checksum, attempt)
            existing = self._remote_size(full)
            if existing is not None:
                if attempt == 0:
                    raise FileExistsError(f"{full} already exists; durable files are never "
                                          f"overwritten (use a fresh attempt name)")
                # Only our own earlier try can have written this attempt-unique name: if
                # its answer was lost the content is complete; if it was torn, replace it.
                if existing == size:
                    return Transfer(path, size, checksum)
                self._rm_quiet(full)
            if self.atomic_rename:
                self._put_local_atomic(local_path, full, overwrite=False)
            else:
                self.fs.put_file(local_path, full)
            got = self._remote_size(full)
            if got != size:
                # A short write must not stay under its final name: remove it and retry.
                self._rm_quiet(full)
                raise TransientStorageError(f"upload of {path}: expected {size} bytes "
                                            f"durable, found {got}")
            return Transfer(path, size, checksum)

        return self._retry(f"upload of {path}", once, path)

    def _put_exclusive(self, local_path: str, full: str, path: str, size: int,
                       checksum: str, attempt: int) -> Transfer:
        """One conditional PUT (``If-None-Match: *``): the store itself refuses to overwrite,
        so no HEAD before and none after (an object-store PUT is all or nothing, and its
        length is checked by the store)."""
        if attempt > 0:
            # Only our own earlier try can have written this attempt-unique name.
            existing = self._remote_size(full)
            if existing == size:
                return Transfer(path, size, checksum)
            if existing is not None:
                self._rm_quiet(full)
        try:
            self.fs.put_file(local_path, full, mode="create")
        except FileExistsError as exc:
            raise FileExistsError(f"{full} already exists; durable files are never "
                                  f"overwritten (use a fresh attempt name)") from exc
        return Transfer(path, size, checksum)

    def _put_local_atomic(self, local_path: str | None, full: str, *, overwrite: bool,
                          data: bytes | None = None) -> None:
        parent = os.path.dirname(full)
        self.fs.makedirs(parent, exist_ok=True)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        try:
            if data is not None:
                self.fs.pipe_file(tmp, data)
            else:
                self.fs.put_file(local_path, tmp)
            if overwrite:
                os.replace(tmp, full)
            else:
                # link() fails if the target exists: an atomic "create, never overwrite".
                os.link(tmp, full)
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def _rm_quiet(self, full: str) -> None:
        try:
            self.fs.rm_file(full)
        except Exception:  # noqa: BLE001 - best effort clean-up of our own partial file
            log.debug("could not remove %s", full, exc_info=True)

    def get_file(self, path: str, local_path: str, *, size: int | None = None,
                 checksum: str | None = None) -> Transfer:
        return self._get_file(path, local_path, size, checksum, None)

    def _get_file(self, path: str, local_path: str, size: int | None, checksum: str | None,
                  slots: threading.BoundedSemaphore | None) -> Transfer:
        """:meth:`get_file`, holding one of ``slots`` for the transfer only."""
        full = self.full_path(path)

        def once(_attempt: int) -> Transfer:
            tmp = f"{local_path}.part-{uuid.uuid4().hex[:8]}"
            os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
            try:
                got_size, got_sum = self._stream_down(full, tmp, slots)
                # a whole read that differs from the record is a damaged file, not a
                # transient failure: reading it again returns the same bytes
                if size is not None and got_size != size:
                    raise ChecksumMismatchError(f"download of {path}: expected {size} bytes, "
                                                f"the stored file has {got_size}", path)
                if checksum is not None and got_sum != checksum:
                    raise ChecksumMismatchError(f"download of {path}: expected CRC32 "
                                                f"{checksum}, the stored file has {got_sum}",
                                                path)
                os.replace(tmp, local_path)
                return Transfer(path, got_size, got_sum)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

        return self._retry(f"download of {path}", once, path)

    def _stream_down(self, full: str, local_tmp: str,
                     slots: threading.BoundedSemaphore | None) -> tuple[int, str]:
        # One GET, or parallel ranged GETs for a large file (s3fs splits it by part_size);
        # then the checksum from the local copy (page cache, much faster than the link),
        # the connection already free for the next transfer
        with slots or contextlib.nullcontext():
            self.fs.get_file(full, local_tmp)
        return file_crc32(local_tmp)

    def put_bytes_atomic(self, path: str, data: bytes) -> None:
        full = self.full_path(path)

        def once(_attempt: int) -> None:
            if self.atomic_rename:
                self._put_local_atomic(None, full, overwrite=True, data=data)
            else:
                self.fs.pipe_file(full, data)
            if self.fs.exclusive_put:
                return  # an object-store PUT is all or nothing: no HEAD to check it
            got = self._remote_size(full)
            if got != len(data):
                raise TransientStorageError(f"publication of {path}: expected {len(data)} "
                                            f"bytes, found {got}")

        self._retry(f"publication of {path}", once, path)

    @property
    def supports_exclusive_create(self) -> bool:
        return (self.atomic_rename or self.fs.exclusive_put
                or isinstance(_base_fs(self.fs), (LocalFileSystem, MemoryFileSystem)))

    def create_exclusive(self, path: str, data: bytes) -> bool:
        if not self.supports_exclusive_create:
            return super().create_exclusive(path, data)
        full = self.full_path(path)
        memory = isinstance(_base_fs(self.fs), MemoryFileSystem)

        def once(_attempt: int) -> bool:
            try:
                if self.atomic_rename:
                    self._put_local_atomic(None, full, overwrite=False, data=data)
                elif memory:
                    # the memory filesystem checks and writes in two steps: one process
                    # holds all of it, so a lock makes the pair atomic
                    with _MEMORY_CREATE_LOCK:
                        self.fs.pipe_file(full, data, mode="create")
                else:
                    # S3's conditional PUT, or a local filesystem behind a wrapper: its
                    # open(mode="xb") is O_EXCL
                    self.fs.pipe_file(full, data, mode="create")
            except FileExistsError:
                return False
            return True

        return self._retry(f"exclusive creation of {path}", once, path)

    def get_bytes(self, path: str) -> bytes:
        full = self.full_path(path)
        return self._retry(f"read of {path}", lambda _a: bytes(self.fs.cat_file(full)), path)

    def get_bytes_many(self, paths: Sequence[str],
                       then: Callable[[str, bytes | None], Any] | None = None) -> list[Any]:
        def one(path: str) -> Any:
            try:
                data: bytes | None = self.get_bytes(path)
            except FileNotFoundError:
                data = None
            return data if then is None else then(path, data)

        return self._map(one, paths)

    def sizes(self, paths: Sequence[str]) -> list[int | None]:
        return self._map(self.size, paths)

    def _map(self, fn: Callable[[str], T], paths: Sequence[str]) -> list[T]:
        paths = list(paths)
        if len(paths) <= 1:
            return [fn(p) for p in paths]
        return list(self._pool("read")[0].map(fn, paths))

    def exists(self, path: str) -> bool:
        return self.size(path) is not None

    def size(self, path: str) -> int | None:
        full = self.full_path(path)
        return self._retry(f"size of {path}", lambda _a: self._remote_size(full))

    def delete(self, paths: Iterable[str]) -> None:
        fulls = [self.full_path(p) for p in paths]
        if fulls:
            # Bulk deletes of up to 1,000 keys per request; missing keys are fine.
            self._retry(f"delete of {len(fulls)} file(s) under {self.root}",
                        lambda _a: self.fs.rm_many(fulls))

    def list_dir(self, path: str) -> list[str]:
        full = self.full_path(path)
        prefix = (self.root.rstrip("/") + "/") if self.root != "/" else "/"

        def once(_a: int) -> list[str]:
            # A listing must see files just written by other processes or threads.
            self.fs.invalidate_cache(full)
            try:
                found = self.fs.find(full)
            except FileNotFoundError:
                return []
            if not found and _find_hides_errors(self.fs):
                try:  # raise what the empty answer hid; absent is a real empty answer
                    self.fs.ls(full, detail=False)
                except FileNotFoundError:
                    return []
            out = []
            for f in found:
                f = f if f.startswith("/") or not prefix.startswith("/") else "/" + f.lstrip("/")
                if not f.startswith(prefix):
                    continue
                rel = f[len(prefix):]
                if not rel.startswith(path + "/"):
                    continue  # ``path`` itself is a file, not a directory
                if rel.rsplit("/", 1)[-1].startswith(".tmp-"):
                    continue  # a local publication in progress, not a file yet
                out.append(rel)
            return sorted(out)

        return self._retry(f"listing of {path}", once)

    # --- parallel helpers -------------------------------------------------------------

    def put_files(self, pairs: Iterable[tuple[str, str]], *,
                  background: bool = False) -> list[Transfer]:
        jobs: list[Job] = [(self.put_file, (local, path), {}) for local, path in pairs]
        return run_all(self._pool("background" if background else "upload")[0], jobs)

    def get_files(self, items: Iterable[Sequence[object]]) -> list[Transfer]:
        return run_all(*self._downloads(items))

    def get_files_each(self, items: Iterable[Sequence[object]]) -> Iterator[Transfer]:
        return each_in_order(*self._downloads(items))

    def _downloads(self, items: Iterable[Sequence[object]]
                   ) -> tuple[ThreadPoolExecutor, list[Job]]:
        """The download pool, and a job for each item holding one of its slots."""
        pool, slots = self._pool("download")
        return pool, [(self._get_file, (*_expand_get(item), slots), {}) for item in items]

    def child(self, prefix: str) -> FsspecStore:
        check_relative(prefix)
        new = object.__new__(FsspecStore)
        new.__dict__.update(self.__dict__)
        new.url = f"{self.url.rstrip('/')}/{prefix}"
        new.root = self.full_path(prefix)
        new._lock = threading.Lock()
        # The child shares the parent's filesystem but uses its own pools, so closing one
        # never breaks the other.
        new._pools = {}
        if self._given_fs is None:
            new._fs = self._fs
        return new

    def close(self) -> None:
        with self._lock:
            for pool, _slots in self._pools.values():
                pool.shutdown(wait=True)
            self._pools = {}


def open_store(url: str, *, upload_threads: int = 4, download_threads: int = 4,
               retries: int = 3, storage_options: dict[str, Any] | None = None,
               backoff_s: float = 0.05,
               fs: fsspec.AbstractFileSystem | None = None,
               part_size: int = DEFAULT_PART_SIZE, read_threads: int = 64) -> FsspecStore:
    """Open durable storage at ``url``.

    Parameters
    ----------
    url : str
        Any fsspec URL (``s3://bucket/prefix``, ``memory://x``, ``file:///d``) or a plain
        local path.
    upload_threads, download_threads : int
        Bounds of the parallel transfer pools.
    retries : int
        Extra tries after a transient failure (exponential backoff from ``backoff_s``).
    storage_options : dict, optional
        Filesystem options, e.g. ``{"client_kwargs": {"endpoint_url": ...}}`` for S3.
    backoff_s : float
        First retry delay in seconds.
    fs : fsspec.AbstractFileSystem, optional
        Use this filesystem instead of resolving the URL (fault injection, wrappers).
    part_size : int
        Multipart part size and ranged-download chunk for large files (S3).
    read_threads : int
        Parallel small reads (manifests, sizes) of :meth:`FsspecStore.get_bytes_many`.

    Returns
    -------
    FsspecStore
        A picklable store; paths given to it are relative to ``url``.
    """
    if not isinstance(url, str) or not url.strip() or "\x00" in url:
        raise OptionsError("url", None, f"a store needs a non-empty path or fsspec URL "
                                        f"without NUL characters, got {redact_url(url)!r}")
    return FsspecStore(url, upload_threads=upload_threads, download_threads=download_threads,
                       retries=retries, storage_options=storage_options, backoff_s=backoff_s,
                       fs=fs, part_size=part_size, read_threads=read_threads)


def _find_hides_errors(fs: fsspec.AbstractFileSystem) -> bool:
    """fsspec's HTTP ``find`` answers "nothing" when the server cannot be reached: an
    unreachable store would look empty ("no completed checkpoint")."""
    protocol = _base_fs(fs).protocol
    return bool({"http", "https"} & set((protocol,) if isinstance(protocol, str) else protocol))


def _base_fs(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """The filesystem under our counting layer and any wrapper that keeps its inner one
    in ``inner`` (fault injection): what decides whether a create-if-absent is real."""
    while isinstance(getattr(fs, "inner", None), fsspec.AbstractFileSystem):
        fs = fs.inner
    return fs


def _innermost(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    while isinstance(fs, AccountingFileSystem):
        fs = fs.inner
    return fs


__all__ = ["FsspecStore", "open_store", "bytes_crc32"]
