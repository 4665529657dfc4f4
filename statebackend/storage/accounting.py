"""Request accounting: what durable storage is asked for, counted as object-store requests.

:class:`AccountingFileSystem` wraps the fsspec filesystem of a
:class:`~statebackend.storage.fsspec_store.FsspecStore` (every remote call of the package
goes through it) and counts each call as the S3 requests it causes through s3fs:

=====================================  ===============================================
fsspec call                            S3 requests
=====================================  ===============================================
``head(path)`` (size or None)          1 HEAD (``head_object``; no LIST on a miss)
``info(path)`` of a missing key        1 HEAD + 1 LIST (s3fs then checks for a "directory")
``put_file`` of ``n`` bytes            1 PUT below ``2 * part_size``; else a multipart
                                       upload: 1 PUT (create + complete) + ceil(n/part) parts
``pipe_file``                          1 PUT
``get_file`` of ``n`` bytes            1 GET up to ``part_size``; else 1 GET (opened, then
                                       closed) + ceil(n/part) ranged GETs, in parallel
``cat_file`` (small objects)           1 GET (s3fs's HEAD first is turned off)
``rm_many(paths)``                     ceil(len/1000) DELETE (bulk ``DeleteObjects``)
``rm_file``                            1 DELETE
``find(prefix)``, ``ls(dir)``           ceil(found/1000) LIST (at least 1)
=====================================  ===============================================

On a local or in-memory filesystem the same calls are counted the same way, so tests on
any store see the requests S3 would receive. The wrapper can also charge a per-request
latency and a per-connection bandwidth (benchmarks use it to model a remote store on
one machine).

The counts are per process (one counter per store and its child stores); a task reads
the counter before and after its work and reports the difference (a Python worker runs
one task at a time).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

import fsspec

__all__ = [
    "AccountingFileSystem",
    "DEFAULT_PART_SIZE",
    "RequestCounter",
    "RequestCounts",
    "is_s3",
]

#: Multipart part size and ranged-download chunk. S3 needs >= 5 MiB parts; 16 MiB makes a
#: 64 MiB SST four parallel parts, while manifests and small SSTs stay single requests.
DEFAULT_PART_SIZE = 16 * 1024 * 1024
#: Keys per bulk delete request (the S3 limit).
DELETE_BATCH = 1000
#: Keys per LIST page (the S3 limit).
LIST_PAGE = 1000


@dataclass(frozen=True)
class RequestCounts:
    """Object-store requests by kind, and the bytes they moved.

    Attributes
    ----------
    put : int
        Objects written (``PutObject``, or one completed multipart upload).
    parts : int
        Multipart ``UploadPart`` requests.
    get : int
        ``GetObject`` requests (whole or ranged).
    head, list, delete : int
        ``HeadObject``, ``ListObjectsV2`` pages, delete requests (bulk or single).
    bytes_up, bytes_down : int
        Payload bytes sent and received.
    """

    put: int = 0
    parts: int = 0
    get: int = 0
    head: int = 0
    list: int = 0
    delete: int = 0
    bytes_up: int = 0
    bytes_down: int = 0

    @property
    def requests(self) -> int:
        """Every request counted (bytes excluded)."""
        return self.put + self.parts + self.get + self.head + self.list + self.delete

    def __add__(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(*(getattr(self, f.name) + getattr(other, f.name)
                               for f in fields(self)))

    def __sub__(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(*(getattr(self, f.name) - getattr(other, f.name)
                               for f in fields(self)))

    def to_dict(self) -> dict[str, int]:
        # not dataclasses.asdict, which deep-copies every field: a task's metrics row
        # reads two of these per batch (BENCHMARKS.md, "Metrics in Spark's progress")
        return {n: getattr(self, n) for n in _COUNT_NAMES}

    @classmethod
    def from_dict(cls, d: Any) -> RequestCounts:
        d = d or {}
        return cls(*(int(d.get(n, 0)) for n in _COUNT_NAMES))


_COUNT_NAMES = tuple(f.name for f in fields(RequestCounts))


class RequestCounter:
    """A thread-safe running total of :class:`RequestCounts`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = {f.name: 0 for f in fields(RequestCounts)}

    def add(self, **kinds: int) -> None:
        with self._lock:
            for k, v in kinds.items():
                self._totals[k] += v

    def snapshot(self) -> RequestCounts:
        with self._lock:
            return RequestCounts(**self._totals)


def is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    """True for s3fs (whose transfers take part sizes and whose HEAD we call directly)."""
    proto = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "s3" in proto and hasattr(fs, "call_s3")


class AccountingFileSystem(fsspec.AbstractFileSystem):
    """An fsspec filesystem that counts (and optionally charges for) the requests of another.

    Parameters
    ----------
    inner : fsspec.AbstractFileSystem
        The filesystem doing the work.
    counter : RequestCounter, optional
        Where counts go (a new one by default).
    part_size : int
        Multipart part size and ranged-download chunk, passed to s3fs.
    latency_s : float
        Charged (slept) once per request: a remote store's round trip.
    bandwidth : float or None
        Bytes per second of one connection (None: not charged). Parallel parts and ranged
        GETs each get their own connection, as they do against S3.
    """

    protocol = "accounting"
    cachable = False  # one per store: fsspec's instance cache would share counters and leak

    def __init__(self, inner: fsspec.AbstractFileSystem, *, counter: RequestCounter | None = None,
                 part_size: int = DEFAULT_PART_SIZE, latency_s: float = 0.0,
                 bandwidth: float | None = None) -> None:
        super().__init__(skip_instance_cache=True)
        if part_size < 5 * 1024 * 1024:
            raise ValueError(f"part_size must be >= 5 MiB (the S3 minimum), got {part_size}")
        self.inner = inner
        self.counter = counter or RequestCounter()
        self.part_size = part_size
        self.latency_s = latency_s
        self.bandwidth = bandwidth
        self._s3 = is_s3(inner)

    @property
    def exclusive_put(self) -> bool:
        """True when ``put_file(..., mode="create")`` is refused by the store itself for an
        existing key (S3's conditional ``If-None-Match: *``), so no HEAD needs to precede
        an upload."""
        inner = self.inner
        return self._s3 or (isinstance(inner, AccountingFileSystem) and inner.exclusive_put)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:  # paths are the inner filesystem's
        return path.rstrip("/") or "/"

    def __reduce__(self) -> Any:
        # A fresh counter in the unpickled copy: counts are per process.
        return (_rebuild, (self.inner, self.part_size, self.latency_s, self.bandwidth))

    # --- charging -----------------------------------------------------------------------

    def _charge(self, requests: int, nbytes: int = 0, streams: int = 1) -> None:
        delay = requests * self.latency_s / max(1, streams)
        if self.bandwidth:
            delay += nbytes / self.bandwidth / max(1, streams)
        if delay > 0:
            time.sleep(delay)

    def _multipart(self, size: int) -> int:
        """Parts of an upload of ``size`` bytes (0: a single PUT), as s3fs splits it."""
        return 0 if size < 2 * self.part_size else math.ceil(size / self.part_size)

    def _ranges(self, size: int) -> int:
        """Ranged GETs of a download of ``size`` bytes (0: one plain GET)."""
        return 0 if size <= self.part_size else math.ceil(size / self.part_size)

    # --- counted calls ------------------------------------------------------------------

    def head(self, path: str) -> int | None:
        """Size of the file at ``path``, or None: one HEAD, never a LIST."""
        self.counter.add(head=1)
        self._charge(1)
        if isinstance(self.inner, AccountingFileSystem):
            return self.inner.head(path)
        if self._s3:
            bucket, key, _ = self.inner.split_path(path)
            try:
                out = self.inner.call_s3("head_object", self.inner.kwargs, Bucket=bucket,
                                         Key=key)
            except FileNotFoundError:
                return None
            return int(out["ContentLength"])
        try:
            info = self.inner.info(path)
        except FileNotFoundError:
            return None
        return None if info.get("type") == "directory" else int(info["size"])

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self.counter.add(head=1)
        self._charge(1)
        try:
            return self.inner.info(path, **kwargs)
        except FileNotFoundError:
            self.counter.add(list=1)  # s3fs looks for a "directory" of that name
            self._charge(1)
            raise

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        size = os.path.getsize(lpath)
        parts = self._multipart(size)
        self.counter.add(put=1, parts=parts, bytes_up=size)
        if self._s3:
            kwargs.setdefault("chunksize", self.part_size)
        self._charge(1 + parts, size, streams=max(1, parts))
        self.inner.put_file(lpath, rpath, **kwargs)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self.counter.add(put=1, bytes_up=len(value))
        self._charge(1, len(value))
        self.inner.pipe_file(path, value, **kwargs)

    def get_file(self, rpath: str, lpath: str, **kwargs: Any) -> None:
        if self._s3:
            kwargs.setdefault("chunksize", self.part_size)
        try:
            self.inner.get_file(rpath, lpath, **kwargs)
        except BaseException:
            self.counter.add(get=1)
            self._charge(1)
            raise
        size = os.path.getsize(lpath)
        ranges = self._ranges(size)
        self.counter.add(get=1 + ranges, bytes_down=size)
        self._charge(1 + ranges, size, streams=max(1, ranges))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        if self._s3:
            # s3fs would HEAD first to decide on a concurrent read: small objects are read
            # whole, with one GET
            kwargs.setdefault("max_concurrency", 1)
        try:
            data = self.inner.cat_file(path, start=start, end=end, **kwargs)
        except BaseException:
            self.counter.add(get=1)
            self._charge(1)
            raise
        self.counter.add(get=1, bytes_down=len(data))
        self._charge(1, len(data))
        return data

    def rm_file(self, path: str) -> None:
        self.counter.add(delete=1)
        self._charge(1)
        self.inner.rm_file(path)

    def rm_many(self, paths: Iterable[str]) -> None:
        """Delete files in bulk requests of up to 1,000 keys; missing ones are fine."""
        paths = list(paths)
        for i in range(0, len(paths), DELETE_BATCH):
            batch = paths[i:i + DELETE_BATCH]
            self.counter.add(delete=1)
            self._charge(1)
            if isinstance(self.inner, AccountingFileSystem):
                self.inner.rm_many(batch)
                continue
            if self._s3:
                self.inner.rm(batch)
                continue
            for p in batch:
                try:
                    self.inner.rm_file(p)
                except FileNotFoundError:
                    pass

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self._listing(lambda: self.inner.find(path, *args, **kwargs))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self._listing(lambda: self.inner.ls(path, detail=detail, **kwargs))

    def _listing(self, call: Callable[[], Any]) -> Any:
        """One LIST page per 1,000 entries found (at least one)."""
        try:
            found = call()
        except BaseException:
            self.counter.add(list=1)
            self._charge(1)
            raise
        pages = max(1, math.ceil(len(found) / LIST_PAGE))
        self.counter.add(list=pages)
        self._charge(pages)
        return found

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        # Not used for transfers (get_file/put_file are); counted as one request.
        if "r" in mode:
            self.counter.add(get=1)
        else:
            self.counter.add(put=1)
        self._charge(1)
        return self.inner.open(path, mode, **kwargs)

    # --- no requests ----------------------------------------------------------------------

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.inner.makedirs(path, exist_ok=exist_ok)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.inner.invalidate_cache(path)


def _rebuild(inner: fsspec.AbstractFileSystem, part_size: int, latency_s: float,
             bandwidth: float | None) -> AccountingFileSystem:
    return AccountingFileSystem(inner, part_size=part_size, latency_s=latency_s,
                                bandwidth=bandwidth)
