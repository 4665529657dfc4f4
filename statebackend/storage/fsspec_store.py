"""A :class:`DurableStore` over any fsspec filesystem (local paths, ``memory://``, ``s3://``...).

Publication is atomic per filesystem kind: on a local filesystem, content goes to a temp
file first and is then linked (no overwrite) or renamed into place; on object stores (and
the in-memory filesystem) a single put is already all-or-nothing. Every transfer is
retried with exponential backoff on transient errors and verified by size afterwards;
downloads are also verified by CRC32, computed while streaming, so it costs no extra read.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from ..checkpoint.manifest import check_relative
from ..errors import StorageError, TransientStorageError, UnsafePathError
from .base import DurableStore, StoreFileNotFoundError, Transfer, _expand_get
from .checksum import CHUNK, bytes_crc32, file_crc32, format_crc32

log = logging.getLogger(__name__)

T = TypeVar("T")
_Job = tuple[Callable[..., Transfer], tuple[Any, ...], dict[str, Any]]

# Failures that retrying cannot fix: the answer will be the same next time.
_PERMANENT: tuple[type[BaseException], ...] = (
    FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
    NotADirectoryError, UnsafePathError, ValueError, TypeError, KeyError,
)


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


class FsspecStore(DurableStore):
    """Durable storage rooted at an fsspec URL.

    Parameters
    ----------
    url : str
        Any fsspec URL; a plain path means the local filesystem.
    upload_threads, download_threads : int
        Bounds of the thread pools used by :meth:`put_files` and :meth:`get_files`.
    retries : int
        Extra attempts after the first one for transient failures.
    storage_options : dict, optional
        Passed to the fsspec filesystem (e.g. ``client_kwargs`` for S3).
    backoff_s : float
        First backoff delay; doubles each retry, with jitter.
    fs : fsspec.AbstractFileSystem, optional
        A ready filesystem to use instead of resolving ``url`` (tests wrap one to inject
        faults). ``url`` is then taken as a path on that filesystem.

    Notes
    -----
    The store pickles without its filesystem handle and pools, which are rebuilt lazily,
    so it can ship to Spark executors.
    """

    def __init__(self, url: str, *, upload_threads: int = 4, download_threads: int = 4,
                 retries: int = 3, storage_options: dict[str, Any] | None = None,
                 backoff_s: float = 0.05, fs: fsspec.AbstractFileSystem | None = None) -> None:
        if upload_threads < 1 or download_threads < 1:
            raise ValueError(f"upload_threads and download_threads must be >= 1, got "
                             f"{upload_threads} and {download_threads}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.url = url
        self.upload_threads = upload_threads
        self.download_threads = download_threads
        self.retries = retries
        self.backoff_s = backoff_s
        self.storage_options = dict(storage_options or {})
        self._given_fs = fs
        self._lock = threading.Lock()
        self._fs: fsspec.AbstractFileSystem | None = None
        self._up_pool: ThreadPoolExecutor | None = None
        self._down_pool: ThreadPoolExecutor | None = None
        self._owns_pools = True
        fs_, root = self._resolve()
        self._fs = fs_
        self.root = root

    # --- plumbing ---------------------------------------------------------------------

    def _resolve(self) -> tuple[fsspec.AbstractFileSystem, str]:
        if self._given_fs is not None:
            fs = self._given_fs
            root = fs._strip_protocol(self.url)
        else:
            fs, root = url_to_fs(self.url, **self.storage_options)
        if isinstance(fs, LocalFileSystem):
            root = os.path.abspath(root)
        return fs, root.rstrip("/") or "/"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            with self._lock:
                if self._fs is None:
                    self._fs = self._resolve()[0]
        return self._fs

    @property
    def atomic_rename(self) -> bool:
        """True when publication goes through temp file + rename (local filesystems)."""
        return isinstance(self.fs, LocalFileSystem)

    def _pool(self, upload: bool) -> ThreadPoolExecutor:
        with self._lock:
            if upload:
                if self._up_pool is None:
                    self._up_pool = ThreadPoolExecutor(self.upload_threads,
                                                       thread_name_prefix="sb-upload")
                return self._up_pool
            if self._down_pool is None:
                self._down_pool = ThreadPoolExecutor(self.download_threads,
                                                     thread_name_prefix="sb-download")
            return self._down_pool

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Handles, pools and locks do not survive pickling; rebuilt lazily on first use.
        for k in ("_fs", "_up_pool", "_down_pool", "_lock"):
            state[k] = None
        state["_owns_pools"] = True
        if state["_given_fs"] is not None:
            # An injected filesystem pickles only if it can (fsspec filesystems do).
            pass
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FsspecStore({self.url!r})"

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
                if not _is_transient(exc):
                    if isinstance(exc, FileNotFoundError):
                        err = StoreFileNotFoundError(f"{what}: not found in {self.url} ({exc})")
                    else:
                        err = StorageError(f"{what} failed: {type(exc).__name__}: {exc}")
                elif attempt >= self.retries:
                    err = StorageError(f"{what} failed after {self.retries + 1} tries: "
                                       f"{type(exc).__name__}: {exc}")
                else:
                    delay = self.backoff_s * (2 ** attempt) * (0.5 + random.random())
                    log.info("%s failed (%s: %s); retry %d/%d in %.2fs", what,
                             type(exc).__name__, exc, attempt + 1, self.retries, delay)
                    if delay > 0:
                        time.sleep(delay)
                    continue
                err.path = path  # type: ignore[attr-defined]
                raise err from exc
        raise AssertionError("unreachable")

    def _remote_size(self, full: str) -> int | None:
        try:
            info = self.fs.info(full)
        except FileNotFoundError:
            return None
        if info.get("type") == "directory":
            return None
        return int(info["size"])

    # --- DurableStore -----------------------------------------------------------------

    def put_file(self, local_path: str, path: str) -> Transfer:
        full = self.full_path(path)
        size, checksum = file_crc32(local_path)

        def once(attempt: int) -> Transfer:
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
        full = self.full_path(path)

        def once(_attempt: int) -> Transfer:
            tmp = f"{local_path}.part-{uuid.uuid4().hex[:8]}"
            os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
            try:
                got_size, got_sum = self._stream_down(full, tmp)
                if size is not None and got_size != size:
                    raise TransientStorageError(f"download of {path}: expected {size} bytes, "
                                                f"got {got_size}")
                if checksum is not None and got_sum != checksum:
                    raise TransientStorageError(f"download of {path}: expected {checksum}, "
                                                f"got {got_sum}")
                os.replace(tmp, local_path)
                return Transfer(path, got_size, got_sum)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

        return self._retry(f"download of {path}", once, path)

    def _stream_down(self, full: str, local_tmp: str) -> tuple[int, str]:
        import zlib

        crc = 0
        n = 0
        with self.fs.open(full, "rb", block_size=CHUNK) as src, open(local_tmp, "wb") as dst:
            while True:
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                crc = zlib.crc32(chunk, crc)
                n += len(chunk)
                dst.write(chunk)
        return n, format_crc32(crc)

    def put_bytes_atomic(self, path: str, data: bytes) -> None:
        full = self.full_path(path)

        def once(_attempt: int) -> None:
            if self.atomic_rename:
                self._put_local_atomic(None, full, overwrite=True, data=data)
            else:
                self.fs.pipe_file(full, data)
            got = self._remote_size(full)
            if got != len(data):
                raise TransientStorageError(f"publication of {path}: expected {len(data)} "
                                            f"bytes, found {got}")

        self._retry(f"publication of {path}", once, path)

    def get_bytes(self, path: str) -> bytes:
        full = self.full_path(path)
        return self._retry(f"read of {path}", lambda _a: bytes(self.fs.cat_file(full)), path)

    def exists(self, path: str) -> bool:
        return self.size(path) is not None

    def size(self, path: str) -> int | None:
        full = self.full_path(path)
        return self._retry(f"size of {path}", lambda _a: self._remote_size(full))

    def delete(self, paths: Iterable[str]) -> None:
        fulls = [self.full_path(p) for p in paths]
        for full in fulls:
            def once(_a: int, full: str = full) -> None:
                try:
                    self.fs.rm_file(full)
                except FileNotFoundError:
                    pass

            self._retry(f"delete of {full}", once)

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

    def put_files(self, pairs: Iterable[tuple[str, str]]) -> list[Transfer]:
        jobs: list[_Job] = [(self.put_file, (local, path), {}) for local, path in pairs]
        return self._run_all(self._pool(upload=True), jobs)

    def get_files(self, items: Iterable[Sequence[object]]) -> list[Transfer]:
        jobs: list[_Job] = []
        for item in items:
            path, local, size, checksum = _expand_get(item)
            jobs.append((self.get_file, (path, local), {"size": size, "checksum": checksum}))
        return self._run_all(self._pool(upload=False), jobs)

    @staticmethod
    def _run_all(pool: ThreadPoolExecutor, jobs: list[_Job]) -> list[Transfer]:
        if not jobs:
            return []
        if len(jobs) == 1:
            fn, args, kwargs = jobs[0]
            return [fn(*args, **kwargs)]
        futures: list[Future[Transfer]] = [pool.submit(fn, *a, **kw) for fn, a, kw in jobs]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in done if f.exception() is not None]
        if failed:
            for f in pending:
                f.cancel()
            # Nothing may still be writing once we report the failure.
            wait(futures)
            raise failed[0].exception()  # type: ignore[misc]
        return [f.result() for f in futures]

    def child(self, prefix: str) -> FsspecStore:
        check_relative(prefix)
        new = object.__new__(FsspecStore)
        new.__dict__.update(self.__dict__)
        new.url = f"{self.url.rstrip('/')}/{prefix}"
        new.root = self.full_path(prefix)
        new._lock = threading.Lock()
        # The child shares the parent's filesystem but uses its own pools, so closing one
        # never breaks the other.
        new._up_pool = None
        new._down_pool = None
        if self._given_fs is None:
            new._fs = self._fs
        return new

    def close(self) -> None:
        with self._lock:
            for pool in (self._up_pool, self._down_pool):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._up_pool = None
            self._down_pool = None


def open_store(url: str, *, upload_threads: int = 4, download_threads: int = 4,
               retries: int = 3, storage_options: dict[str, Any] | None = None,
               backoff_s: float = 0.05,
               fs: fsspec.AbstractFileSystem | None = None) -> FsspecStore:
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

    Returns
    -------
    FsspecStore
        A picklable store; paths given to it are relative to ``url``.
    """
    return FsspecStore(url, upload_threads=upload_threads, download_threads=download_threads,
                       retries=retries, storage_options=storage_options, backoff_s=backoff_s,
                       fs=fs)


__all__ = ["FsspecStore", "open_store", "bytes_crc32"]
