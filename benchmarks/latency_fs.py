"""A local directory that costs what an object store costs: ``latency://<abs path>``.

Every request (HEAD, PUT, GET, LIST, DELETE) waits ``latency_s``. The bytes of a PUT or a
GET cost time under one of two link models (``link``):

``"shared"`` (the default)
    One link up and one down (full duplex) of ``bandwidth`` bytes/s, shared by all threads
    of the process, so four parallel uploads share the 100 MB/s rather than getting 400:
    one saturated NIC. Transfers take the link a slice (:data:`SLICE`) at a time, so
    concurrent ones share it as TCP flows do: a small PUT started while a large one is
    under way gets its share at once instead of waiting for the whole large object.
``"independent"``
    Every request is a connection of its own that pays ``latency_s + size / bandwidth``
    whatever else runs, as separate S3 connections each at full speed behave; at most
    ``max_connections`` requests of the process are under way at once (the others wait
    for a free connection, as a client's connection pool makes them).

Directories cost nothing (object stores have none).
It is not a :class:`~fsspec.implementations.local.LocalFileSystem`, so the store takes its
object-store path (plain PUTs, no temp file and rename).

    from benchmarks.latency_fs import register, STATS
    register()
    store = open_store("latency:///tmp/durable", storage_options={"latency_s": 0.02,
                                                                  "bandwidth": 100e6})

:data:`STATS` counts requests and bytes both ways for the whole process.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

PROTOCOL = "latency"


@dataclass
class Stats:
    """Requests and bytes that went through any :class:`LatencyFileSystem` of the process."""

    requests: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> tuple[int, int, int]:
        with self.lock:
            return self.requests, self.bytes_up, self.bytes_down


STATS = Stats()


SLICE = 1 << 20
"""Bytes a transfer takes the link for at a time (concurrent transfers interleave)."""


class _Link:
    """One direction of the network: ``bandwidth`` bytes/s, handed out slice by slice."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy_until = 0.0

    def transfer(self, nbytes: int, bandwidth: float, credit_s: float = 0.0) -> None:
        """Take the link for ``nbytes``, as if started ``credit_s`` ago."""
        at = time.monotonic() - credit_s
        while True:
            part = min(nbytes, SLICE)
            with self._lock:
                start = max(at, self._busy_until)
                self._busy_until = until = at = start + part / bandwidth
            delay = until - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            nbytes -= part
            if nbytes <= 0:
                return


_UP, _DOWN = _Link(), _Link()

LINKS = ("shared", "independent")

_POOLS: dict[int, threading.BoundedSemaphore] = {}
_POOLS_LOCK = threading.Lock()


def _pool(max_connections: int) -> threading.BoundedSemaphore:
    """The process's connection pool of that size (one per size, as one client has one)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(max_connections)
        if pool is None:
            pool = _POOLS[max_connections] = threading.BoundedSemaphore(max_connections)
        return pool


def _within(seconds: float | Callable[[Any], float], copy: Callable[[], Any] | None) -> Any:
    """Run ``copy`` and sleep what is left of ``seconds`` (a function of what ``copy``
    returned, or a number) after it; what ``copy`` returned."""
    t0 = time.monotonic()
    out = copy() if copy is not None else None
    total = seconds(out) if callable(seconds) else seconds
    time.sleep(max(0.0, total - (time.monotonic() - t0)))
    return out


class _MeteredReader:
    """A file opened for reading whose bytes pay the download link as they are read."""

    def __init__(self, raw: Any, fs: LatencyFileSystem) -> None:
        self._raw, self._fs = raw, fs

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self._fs._down(lambda: len(data))
        return data

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> _MeteredReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class LatencyFileSystem(AbstractFileSystem):
    """A local directory behind an object store's per-request latency and bandwidth.

    Parameters
    ----------
    latency_s : float
        Seconds every request waits (default 20 ms).
    bandwidth : float
        Bytes per second of each direction of the link (default 100 MB/s); per connection
        under ``link="independent"``.
    link : {"shared", "independent"}
        The link model (see the module documentation).
    max_connections : int
        Requests under way at once under ``link="independent"`` (default 16).
    """

    protocol = PROTOCOL
    root_marker = "/"

    def __init__(self, latency_s: float = 0.02, bandwidth: float = 100e6, link: str = "shared",
                 max_connections: int = 16, **kwargs: Any):
        super().__init__(**kwargs)
        if link not in LINKS:
            raise ValueError(f"link={link!r}: expected one of {LINKS}")
        if int(max_connections) < 1:
            raise ValueError(f"max_connections={max_connections!r}: expected at least 1")
        self.latency_s = float(latency_s)
        self.bandwidth = float(bandwidth)
        self.link = link
        self.max_connections = int(max_connections)
        self._pool = _pool(self.max_connections) if link == "independent" else None
        self.inner = LocalFileSystem(auto_mkdir=True)

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        path = str(path)
        for prefix in (PROTOCOL + "://", PROTOCOL + ":"):
            if path.startswith(prefix):
                path = path[len(prefix):]
                break
        return path.rstrip("/") or "/"

    # --- costs --------------------------------------------------------------------------

    # The local copy that stands in for a transfer's bytes (``copy``: into or out of the
    # directory behind, returning the bytes) runs within the transfer, as a real client
    # writes the bytes while they arrive: a transfer takes the later of the link's time
    # and the copy's, not their sum (the sum charged a 1 GiB restore ~0.4 s a partition
    # of local copying that no object store's download has on top of its transfer).

    def _request(self, up: int = 0, copy: Callable[[], object] | None = None) -> None:
        """One request: its latency, plus the ``up`` bytes it sends (by ``copy``)."""
        with STATS.lock:
            STATS.requests += 1
            STATS.bytes_up += up
        if self._pool is not None:
            with self._pool:  # one connection: latency and transfer, nobody else's
                _within(self.latency_s + up / self.bandwidth, copy)
            return
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        t0 = time.monotonic()
        if copy is not None:
            copy()
        if up:
            _UP.transfer(up, self.bandwidth, time.monotonic() - t0)

    def _down(self, copy: Callable[[], int]) -> None:
        """The bytes ``copy`` brings down (it returns how many) pay the download link."""
        if self._pool is not None:
            with self._pool:
                nbytes = _within(lambda n: n / self.bandwidth, copy)
        else:
            t0 = time.monotonic()
            nbytes = copy()
            _DOWN.transfer(nbytes, self.bandwidth, time.monotonic() - t0)
        with STATS.lock:
            STATS.bytes_down += nbytes

    # --- the requests the store makes ---------------------------------------------------

    def info(self, path: str, **kwargs: Any) -> dict:
        self._request()
        return self.inner.info(self._strip_protocol(path))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        self._request()
        return self.inner.ls(self._strip_protocol(path), detail=detail)

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False,
             detail: bool = False, **kwargs: Any) -> Any:
        self._request()  # one LIST of a prefix
        return self.inner.find(self._strip_protocol(path), maxdepth=maxdepth,
                               withdirs=withdirs, detail=detail)

    # An object store's PUT is all or nothing: a reader sees the whole object or none.
    # The local directory behind it must too (write a temporary name, then rename), or a
    # reader polling for a manifest (changelog mode's adoption of a materialization)
    # could read it half-written, which no object store lets happen.

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        import os

        final = self._strip_protocol(rpath)
        tmp = f"{os.path.dirname(final)}/.tmp-{uuid.uuid4().hex}"  # as the store names its own
        self._request(up=os.path.getsize(lpath), copy=lambda: self.inner.put_file(lpath, tmp))
        os.replace(tmp, final)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        import os

        final = self._strip_protocol(path)
        tmp = f"{os.path.dirname(final)}/.tmp-{uuid.uuid4().hex}"  # as the store names its own
        self._request(up=len(value), copy=lambda: self.inner.pipe_file(tmp, value))
        os.replace(tmp, final)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        self._request()
        got: list[bytes] = []

        def copy() -> int:
            got.append(self.inner.cat_file(self._strip_protocol(path), start=start, end=end))
            return len(got[0])

        self._down(copy)
        return got[0]

    def get_file(self, rpath: str, lpath: str, callback: Any = None, outfile: Any = None,
                 **kwargs: Any) -> None:
        # One GET, as an object store's client makes it (s3fs: get_object, no HEAD first);
        # fsspec's generic get_file would ask isdir() first, a second request per file.
        import os

        self._request()
        src = self._strip_protocol(rpath)

        def copy() -> int:
            self.inner.get_file(src, lpath)
            return os.path.getsize(src)

        self._down(copy)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" not in mode:
            raise NotImplementedError("write through put_file/pipe_file (one PUT each)")
        self._request()
        return _MeteredReader(self.inner._open(self._strip_protocol(path), mode), self)

    def rm_file(self, path: str) -> None:
        self._request()
        self.inner.rm_file(self._strip_protocol(path))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.inner.makedirs(self._strip_protocol(path), exist_ok=True)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.inner.makedirs(self._strip_protocol(path), exist_ok=True)


def register() -> None:
    """Make ``latency://`` known to fsspec in this process."""
    fsspec.register_implementation(PROTOCOL, LatencyFileSystem, clobber=True)
