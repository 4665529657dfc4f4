"""A reusable contract test suite that every :class:`DurableStore` must pass.

Subclass :class:`StoreContract` in a test module and provide a ``store`` fixture returning
a fresh, empty store; pytest then runs every ``test_*`` method against it. Importing this
module requires pytest (a test dependency only).
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from ..errors import StorageError, UnsafePathError
from .base import DurableStore
from .checksum import bytes_crc32, file_crc32

UNSAFE_PATHS = ["../x", "/etc/passwd", "a/../../b", "a/./b", "", "a//b", "a/../b",
                "s3://other/x", "a\\b", ".."]


def _write(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


class StoreContract:
    """Behaviour every durable store shares; subclasses provide a ``store`` fixture."""

    @pytest.fixture
    def store(self) -> DurableStore:  # pragma: no cover - overridden
        raise NotImplementedError

    def test_put_get_round_trip_reports_size_and_checksum(self, store: DurableStore,
                                                          tmp_path: Path) -> None:
        data = os.urandom(300_001)
        src = _write(tmp_path / "src.bin", data)
        up = store.put_file(src, "chk-1/p0/a/000001.sst")
        assert (up.path, up.size, up.checksum) == ("chk-1/p0/a/000001.sst", len(data),
                                                   bytes_crc32(data))
        dst = str(tmp_path / "out" / "x.sst")
        down = store.get_file(up.path, dst, size=up.size, checksum=up.checksum)
        assert Path(dst).read_bytes() == data
        assert down == up
        assert store.size(up.path) == len(data)
        assert store.exists(up.path)

    def test_empty_file(self, store: DurableStore, tmp_path: Path) -> None:
        src = _write(tmp_path / "empty", b"")
        assert store.put_file(src, "e/empty").size == 0
        assert store.size("e/empty") == 0
        store.get_file("e/empty", str(tmp_path / "e2"), size=0, checksum=bytes_crc32(b""))
        assert (tmp_path / "e2").read_bytes() == b""

    def test_multi_megabyte_file(self, store: DurableStore, tmp_path: Path) -> None:
        data = os.urandom(6 * 1024 * 1024 + 17)
        src = _write(tmp_path / "big", data)
        t = store.put_file(src, "big/file.sst")
        store.get_file("big/file.sst", str(tmp_path / "big2"), size=t.size, checksum=t.checksum)
        assert file_crc32(str(tmp_path / "big2")) == (len(data), bytes_crc32(data))

    def test_put_file_never_overwrites(self, store: DurableStore, tmp_path: Path) -> None:
        a = _write(tmp_path / "a", b"first")
        b = _write(tmp_path / "b", b"second!")
        store.put_file(a, "x/f")
        with pytest.raises(StorageError):
            store.put_file(b, "x/f")
        assert store.get_bytes("x/f") == b"first"

    def test_get_file_verifies_size_and_checksum(self, store: DurableStore,
                                                 tmp_path: Path) -> None:
        src = _write(tmp_path / "a", b"payload")
        t = store.put_file(src, "v/f")
        dst = tmp_path / "dst"
        with pytest.raises(StorageError):
            store.get_file("v/f", str(dst), size=t.size + 1)
        with pytest.raises(StorageError):
            store.get_file("v/f", str(dst), checksum="crc32:00000000")
        # A failed download leaves nothing at the destination, not even a partial file.
        assert not dst.exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("dst")] == []

    def test_missing_file_is_file_not_found(self, store: DurableStore, tmp_path: Path) -> None:
        with pytest.raises(FileNotFoundError):
            store.get_file("nope/f", str(tmp_path / "x"))
        with pytest.raises(FileNotFoundError):
            store.get_bytes("nope/f")
        with pytest.raises(StorageError):
            store.get_bytes("nope/g")
        assert store.size("nope/f") is None
        assert not store.exists("nope/f")

    def test_put_bytes_atomic_publishes_and_replaces(self, store: DurableStore) -> None:
        store.put_bytes_atomic("m/_MANIFEST.json", b'{"a": 1}')
        assert store.get_bytes("m/_MANIFEST.json") == b'{"a": 1}'
        store.put_bytes_atomic("m/_MANIFEST.json", b'{"a": 22}')
        assert store.get_bytes("m/_MANIFEST.json") == b'{"a": 22}'
        # No temp file stays visible next to the published one.
        assert store.list_dir("m") == ["m/_MANIFEST.json"]

    def test_delete_is_idempotent(self, store: DurableStore) -> None:
        store.put_bytes_atomic("d/1", b"1")
        store.put_bytes_atomic("d/2", b"2")
        store.delete(["d/1", "d/missing"])
        store.delete(["d/1"])
        assert store.list_dir("d") == ["d/2"]
        store.delete([])

    def test_list_dir_is_recursive_and_bounded(self, store: DurableStore) -> None:
        for p in ["chk-1/p0/a/f1", "chk-1/p0/a/_MANIFEST.json", "chk-1/p0/b/f2",
                  "chk-1/p1/a/f3", "chk-10/p0/a/f4"]:
            store.put_bytes_atomic(p, b"x")
        assert store.list_dir("chk-1/p0") == ["chk-1/p0/a/_MANIFEST.json", "chk-1/p0/a/f1",
                                              "chk-1/p0/b/f2"]
        assert store.list_dir("chk-1") == ["chk-1/p0/a/_MANIFEST.json", "chk-1/p0/a/f1",
                                           "chk-1/p0/b/f2", "chk-1/p1/a/f3"]
        assert store.list_dir("chk-2") == []

    @pytest.mark.parametrize("bad", UNSAFE_PATHS)
    def test_unsafe_paths_are_refused(self, store: DurableStore, tmp_path: Path,
                                      bad: str) -> None:
        src = _write(tmp_path / "a", b"x")
        for call in (lambda: store.put_file(src, bad),
                     lambda: store.get_file(bad, str(tmp_path / "o")),
                     lambda: store.put_bytes_atomic(bad, b"x"),
                     lambda: store.get_bytes(bad),
                     lambda: store.exists(bad),
                     lambda: store.delete([bad]),
                     lambda: store.list_dir(bad)):
            with pytest.raises(UnsafePathError):
                call()

    def test_parallel_put_and_get_keep_order(self, store: DurableStore,
                                             tmp_path: Path) -> None:
        blobs = {f"par/{i:03d}.sst": os.urandom(1000 + i) for i in range(24)}
        pairs = [(_write(tmp_path / "in" / p.split("/")[1], d), p) for p, d in blobs.items()]
        ups = store.put_files(pairs)
        assert [u.path for u in ups] == list(blobs)
        items = [(u.path, str(tmp_path / "outp" / u.path.split("/")[1]), u.size, u.checksum)
                 for u in ups]
        downs = store.get_files(items)
        assert downs == ups
        for (_path, local, _s, _c), data in zip(items, blobs.values()):
            assert Path(local).read_bytes() == data

    def test_get_files_each_hands_files_back_in_order(self, store: DurableStore,
                                                      tmp_path: Path) -> None:
        blobs = {f"ea/{i:03d}": os.urandom(500 + 7 * i) for i in range(12)}
        for p, d in blobs.items():
            store.put_bytes_atomic(p, d)
        items = [(p, str(tmp_path / "outea" / p[3:]), len(d), bytes_crc32(d))
                 for p, d in blobs.items()]
        got = []
        for t, (p, local, _s, _c) in zip(store.get_files_each(items), items):
            # each handed back is whole on disk already, whatever the others are doing
            assert (t.path, Path(local).read_bytes()) == (p, blobs[p])
            got.append(t.path)
        assert got == list(blobs)
        bad = items[:2] + [("ea/none", str(tmp_path / "none"), None, None)] + items[2:]
        each = store.get_files_each(bad)
        assert [next(each).path, next(each).path] == ["ea/000", "ea/001"]
        with pytest.raises(FileNotFoundError):
            next(each)

    def test_parallel_get_failure_raises(self, store: DurableStore, tmp_path: Path) -> None:
        store.put_bytes_atomic("pg/1", b"1")
        with pytest.raises(FileNotFoundError):
            store.get_files([("pg/1", str(tmp_path / "1")), ("pg/2", str(tmp_path / "2"))])

    def test_pickles_and_works_after(self, store: DurableStore, tmp_path: Path) -> None:
        store.put_bytes_atomic("pk/a", b"abc")
        clone = pickle.loads(pickle.dumps(store))
        assert clone.root == store.root
        assert clone.get_bytes("pk/a") == b"abc"
        clone.put_files([(_write(tmp_path / "b", b"bb"), "pk/b")])
        assert store.get_bytes("pk/b") == b"bb"
        clone.close()

    def test_child_store_is_rooted_under_parent(self, store: DurableStore) -> None:
        child = store.child("op-1")
        child.put_bytes_atomic("chk-1/x", b"1")
        assert store.get_bytes("op-1/chk-1/x") == b"1"
        assert child.list_dir("chk-1") == ["chk-1/x"]
        with pytest.raises(UnsafePathError):
            store.child("../up")


class FaultInjectingFileSystem(fsspec.AbstractFileSystem):
    """An fsspec filesystem wrapping another one and failing chosen calls.

    Parameters
    ----------
    inner : fsspec.AbstractFileSystem
        The filesystem doing the real work.
    fail_method : str
        Which method fails: ``put_file``, ``pipe_file``, ``open`` (reads), ``info`` ...
    fail_after : int
        Calls of ``fail_method`` that succeed before the first failure.
    fail_times : int or None
        Failures in a row before calls succeed again (None: fail forever).
    match : str
        Only calls whose path contains this substring count.
    error : callable
        Builds the exception raised (default: a ``ConnectionError``, a transient error).
    torn : bool
        For ``put_file``, write half of the file to the target before raising, like a
        non-atomic filesystem that died midway.
    """

    protocol = "faulty"

    def __init__(self, inner: fsspec.AbstractFileSystem, *, fail_method: str = "put_file",
                 fail_after: int = 0, fail_times: int | None = None, match: str = "",
                 error: Callable[[], BaseException] | None = None, torn: bool = False) -> None:
        super().__init__(skip_instance_cache=True)
        self.inner = inner
        self.fail_method = fail_method
        self.fail_after = fail_after
        self.fail_times = fail_times
        self.match = match
        self.error = error or (lambda: ConnectionError("injected fault"))
        self.torn = torn
        self.calls = 0
        self.failures = 0
        self._lock = threading.Lock()

    @classmethod
    def _strip_protocol(cls, path: str) -> str:  # paths are the inner filesystem's
        return path.rstrip("/") or "/"

    def _maybe_fail(self, method: str, path: str) -> bool:
        if method != self.fail_method or self.match not in path:
            return False
        with self._lock:
            self.calls += 1
            if self.calls <= self.fail_after:
                return False
            if self.fail_times is not None and self.failures >= self.fail_times:
                return False
            self.failures += 1
            return True

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        if self._maybe_fail("put_file", rpath):
            if self.torn:
                with open(lpath, "rb") as fh:
                    data = fh.read()
                self.inner.pipe_file(rpath, data[: len(data) // 2])
            raise self.error()
        self.inner.put_file(lpath, rpath, **kwargs)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        if self._maybe_fail("pipe_file", path):
            raise self.error()
        self.inner.pipe_file(path, value, **kwargs)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if self._maybe_fail("open", path):
            raise self.error()
        return self.inner.open(path, mode, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        if self._maybe_fail("cat_file", path):
            raise self.error()
        return self.inner.cat_file(path, start=start, end=end, **kwargs)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        if self._maybe_fail("info", path):
            raise self.error()
        return self.inner.info(path, **kwargs)

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self.inner.find(path, *args, **kwargs)

    def rm_file(self, path: str) -> None:
        if self._maybe_fail("rm_file", path):
            raise self.error()
        self.inner.rm_file(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.inner.makedirs(path, exist_ok=exist_ok)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.inner.invalidate_cache(path)
