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
