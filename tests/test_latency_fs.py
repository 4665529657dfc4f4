"""The benchmarks' object-store model (``benchmarks/latency_fs.py``) charges what an object
store's client sends: one request per upload and per download (s3fs' get_file is one GET,
no HEAD first), with the bytes of each on the link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import latency_fs
from statebackend.errors import StorageError
from statebackend.storage import open_store


@pytest.mark.parametrize("link", latency_fs.LINKS)
def test_a_file_costs_one_request_each_way(tmp_path: Path, link: str) -> None:
    latency_fs.register()
    store = open_store(f"latency://{tmp_path / 'durable'}", backoff_s=0.0, storage_options={
        "latency_s": 0.0, "bandwidth": 1e12, "link": link})
    data = os.urandom(300_000)
    (tmp_path / "src").write_bytes(data)
    r0, up0, down0 = latency_fs.STATS.snapshot()
    store.put_files([(str(tmp_path / "src"), "a/f.sst")])
    r1, up1, down1 = latency_fs.STATS.snapshot()
    assert (up1 - up0, down1 - down0) == (len(data), 0)
    (t,) = store.get_files([("a/f.sst", str(tmp_path / "dst"), len(data), None)])
    r2, up2, down2 = latency_fs.STATS.snapshot()
    assert (r2 - r1, up2 - up1, down2 - down1) == (1, 0, len(data))
    assert t.size == len(data) and (tmp_path / "dst").read_bytes() == data
    assert r1 > r0
    with pytest.raises((StorageError, FileNotFoundError)):
        store.get_files([("a/missing.sst", str(tmp_path / "dst2"), None, None)])


class _Clock:
    """time.monotonic and time.sleep of latency_fs on a fake clock: sleeps are recorded."""

    def __init__(self) -> None:
        self.now, self.sleeps = 1000.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(round(s, 6))
        self.now += s


@pytest.mark.parametrize("link", latency_fs.LINKS)
@pytest.mark.parametrize("copy_s", [0.3, 2.5])
def test_the_local_copy_counts_within_the_transfer(tmp_path: Path, link: str,
                                                   copy_s: float,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A transfer takes the later of the link's time and the local copy standing in for
    its bytes, never their sum: 1 MB at 1 MB/s is 1 s of link, plus 0.1 s of latency."""
    clock = _Clock()
    monkeypatch.setattr(latency_fs, "time", clock)
    # the shared link's own clock, free of earlier transfers on the real one
    monkeypatch.setattr(latency_fs, "_UP", latency_fs._Link())
    monkeypatch.setattr(latency_fs, "_DOWN", latency_fs._Link())
    fs = latency_fs.LatencyFileSystem(latency_s=0.1, bandwidth=1e6, link=link)
    real_get, real_put = fs.inner.get_file, fs.inner.put_file

    def slow(real):
        def copy(*a, **kw):
            clock.now += copy_s  # the copy itself takes copy_s
            return real(*a, **kw)
        return copy

    monkeypatch.setattr(fs.inner, "get_file", slow(real_get))
    monkeypatch.setattr(fs.inner, "put_file", slow(real_put))
    (tmp_path / "src").write_bytes(b"x" * 1_000_000)
    t0 = clock.now
    fs.put_file(str(tmp_path / "src"), str(tmp_path / "remote"))
    assert clock.now - t0 == pytest.approx(max(1.1, 0.1 + copy_s) if link == "shared"
                                           else max(1.1, copy_s))
    t1 = clock.now
    fs.get_file(str(tmp_path / "remote"), str(tmp_path / "back"))
    assert clock.now - t1 == pytest.approx(0.1 + max(1.0, copy_s))
    assert (tmp_path / "back").read_bytes() == (tmp_path / "src").read_bytes()
