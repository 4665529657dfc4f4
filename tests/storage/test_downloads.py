"""FsspecStore's parallel downloads: get_files_each hands files back as they arrive while
the rest keep coming, stops cleanly when its consumer does, and at most download_threads
transfers run at once, a file's checksum taken after its connection is free."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import statebackend.storage.fsspec_store as fsspec_store
from statebackend.storage import open_store
from statebackend.storage.checksum import bytes_crc32


class _Transfers:
    """Counts the transfers running at once (each made slow), and what ran during each
    checksum."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: fsspec_store.FsspecStore,
                 seconds: float = 0.05, crc_seconds: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.now = self.most = self.started = 0
        self.during_checksums: list[int] = []
        fs = store.fs
        get_file, crc = fs.get_file, fsspec_store.file_crc32

        def slow_get(rpath: str, lpath: str, **kw: object) -> None:
            with self.lock:
                self.now += 1
                self.started += 1
                self.most = max(self.most, self.now)
            try:
                time.sleep(seconds)
                get_file(rpath, lpath, **kw)
            finally:
                with self.lock:
                    self.now -= 1

        def slow_crc(path: str) -> tuple[int, str]:
            time.sleep(crc_seconds)
            with self.lock:
                self.during_checksums.append(self.now)
            return crc(path)

        monkeypatch.setattr(fs, "get_file", slow_get)
        monkeypatch.setattr(fsspec_store, "file_crc32", slow_crc)


def _items(store: fsspec_store.FsspecStore, tmp_path: Path, n: int) -> list[tuple]:
    out = []
    for i in range(n):
        data = os.urandom(2000 + i)
        store.put_bytes_atomic(f"d/{i:02d}", data)
        out.append((f"d/{i:02d}", str(tmp_path / "out" / f"{i:02d}"), len(data),
                    bytes_crc32(data)))
    return out


def test_the_rest_arrive_while_the_consumer_works_on_the_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "durable"), download_threads=2)
    items = _items(store, tmp_path, 8)
    _Transfers(monkeypatch, store, seconds=0.02)
    each = store.get_files_each(items)
    assert next(each).path == "d/00"
    deadline = time.monotonic() + 10
    while (not all(os.path.exists(local) for _p, local, _s, _c in items)
           and time.monotonic() < deadline):
        time.sleep(0.01)
    # nobody asked for the second yet, and every file is in
    assert all(os.path.exists(local) for _p, local, _s, _c in items)
    assert [t.path for t in each] == [p for p, *_ in items[1:]]


def test_a_consumer_that_stops_leaves_nothing_running(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "durable"), download_threads=2)
    items = _items(store, tmp_path, 12)
    seen = _Transfers(monkeypatch, store, seconds=0.05)
    each = store.get_files_each(items)
    next(each)
    each.close()
    started = seen.started
    assert seen.now == 0  # nothing still transferring once close returned
    time.sleep(0.2)
    assert seen.started == started < len(items)  # the rest were cancelled, not started
    out = os.listdir(tmp_path / "out")
    assert not [n for n in out if ".part-" in n]  # and nothing is left half-written


def test_at_most_download_threads_transfer_and_checksums_free_their_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "durable"), download_threads=2)
    items = _items(store, tmp_path, 10)
    seen = _Transfers(monkeypatch, store, seconds=0.03, crc_seconds=0.03)
    assert [t.path for t in store.get_files(items)] == [p for p, *_ in items]
    assert seen.most == 2  # two connections, although the pool has four threads
    # a checksum ran while two others transferred: its own connection was free again
    assert max(seen.during_checksums) == 2
    for (_p, local, size, _c) in items:
        assert os.path.getsize(local) == size
