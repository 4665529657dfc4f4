"""FsspecStore specifics: URL resolution, retries, torn writes, pickling."""

from __future__ import annotations

import os
import pickle
import uuid
from pathlib import Path

import fsspec
import pytest

from statebackend.errors import StorageError
from statebackend.storage import FsspecStore, StoreFileNotFoundError, open_store
from statebackend.storage.testing import FaultInjectingFileSystem


def _src(tmp_path: Path, data: bytes = b"0123456789" * 100) -> str:
    p = tmp_path / f"src-{uuid.uuid4().hex[:6]}"
    p.write_bytes(data)
    return str(p)


@pytest.fixture
def mem_root() -> str:
    return f"/sb-faults-{uuid.uuid4().hex[:10]}"


def _faulty(root: str, **kw: object) -> tuple[FsspecStore, FaultInjectingFileSystem]:
    fs = FaultInjectingFileSystem(fsspec.filesystem("memory"), **kw)  # type: ignore[arg-type]
    return open_store(root, fs=fs, backoff_s=0.0, retries=3), fs


def test_plain_path_and_file_url_are_local(tmp_path: Path) -> None:
    a = open_store(str(tmp_path / "a"))
    b = open_store(f"file://{tmp_path}/b")
    assert a.atomic_rename and b.atomic_rename
    assert a.root == str(tmp_path / "a") and b.root == str(tmp_path / "b")
    a.put_bytes_atomic("x/y", b"1")
    assert (tmp_path / "a" / "x" / "y").read_bytes() == b"1"
    assert not open_store("memory://m").atomic_rename


def test_relative_local_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    monkeypatch.chdir(tmp_path)
    s = open_store("rel/dir")
    assert s.root == str(tmp_path / "rel" / "dir")


def test_bad_pool_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        open_store("memory://x", upload_threads=0)
    with pytest.raises(ValueError):
        open_store("memory://x", retries=-1)


def test_transient_upload_failures_are_retried(tmp_path: Path, mem_root: str) -> None:
    store, fs = _faulty(mem_root, fail_times=2)
    t = store.put_file(_src(tmp_path), "a/f")
    assert fs.failures == 2 and fs.calls == 3
    assert store.get_bytes("a/f") == b"0123456789" * 100 and t.size == 1000


def test_retries_exhausted_raise_storage_error_naming_the_path(tmp_path: Path,
                                                              mem_root: str) -> None:
    store, fs = _faulty(mem_root)
    with pytest.raises(StorageError) as ei:
        store.put_file(_src(tmp_path), "a/f")
    assert ei.value.path == "a/f"
    assert fs.calls == 4  # first try + 3 retries
    assert not store.exists("a/f")


def test_torn_write_is_replaced_on_retry(tmp_path: Path, mem_root: str) -> None:
    store, fs = _faulty(mem_root, fail_times=1, torn=True)
    data = os.urandom(5000)
    store.put_file(_src(tmp_path, data), "a/f")
    assert fs.failures == 1
    assert store.get_bytes("a/f") == data


def test_permanent_errors_are_not_retried(tmp_path: Path, mem_root: str) -> None:
    store, fs = _faulty(mem_root, error=lambda: PermissionError("denied"))
    with pytest.raises(StorageError, match="denied"):
        store.put_file(_src(tmp_path), "a/f")
    assert fs.calls == 1


def test_transient_download_failures_are_retried(tmp_path: Path, mem_root: str) -> None:
    store, fs = _faulty(mem_root, fail_method="open", fail_times=2)
    t = store.put_file(_src(tmp_path), "a/f")
    out = tmp_path / "out"
    assert store.get_file("a/f", str(out), size=t.size, checksum=t.checksum) == t
    assert fs.failures == 2 and out.read_bytes() == b"0123456789" * 100


def test_missing_download_is_typed(tmp_path: Path, mem_root: str) -> None:
    store, _fs = _faulty(mem_root, fail_method="none")
    with pytest.raises(StoreFileNotFoundError) as ei:
        store.get_file("no/such", str(tmp_path / "x"))
    assert ei.value.path == "no/such"


def test_parallel_upload_failure_raises_after_all_threads_stop(tmp_path: Path,
                                                               mem_root: str) -> None:
    store, fs = _faulty(mem_root, match="bad")
    pairs = [(_src(tmp_path), f"p/good{i}") for i in range(6)] + [(_src(tmp_path), "p/bad")]
    with pytest.raises(StorageError):
        store.put_files(pairs)
    assert not store.exists("p/bad")
    # Whatever was not cancelled completed whole; nothing is left half-written.
    for rel in store.list_dir("p"):
        assert store.size(rel) == 1000


def test_pickle_drops_handles(tmp_path: Path) -> None:
    s = open_store(str(tmp_path / "d"), upload_threads=2)
    s.put_files([(_src(tmp_path), "a"), (_src(tmp_path), "b")])
    state = s.__getstate__()
    assert "upload" in s._pools  # the upload above made its pool
    assert state["_fs"] is None and state["_pools"] == {} and state["_lock"] is None
    clone = pickle.loads(pickle.dumps(s))
    assert clone.list_dir("a") == [] and clone.size("a") == 1000
    s.close()


def test_list_dir_hides_local_temp_files(tmp_path: Path) -> None:
    s = open_store(str(tmp_path / "d"))
    s.put_bytes_atomic("c/f", b"1")
    (tmp_path / "d" / "c" / ".tmp-abc").write_bytes(b"partial")
    assert s.list_dir("c") == ["c/f"]


def test_a_checksum_mismatch_is_corruption_read_once_not_retried(tmp_path) -> None:
    from statebackend.errors import ChecksumMismatchError

    store = open_store(str(tmp_path / "s"), retries=3, backoff_s=0.0)
    src = tmp_path / "src"
    src.write_bytes(b"x" * 1000)
    t = store.put_file(str(src), "a/f")
    full = tmp_path / "s" / "a" / "f"
    full.write_bytes(b"y" * 1000)  # the same size, other bytes
    before = store.request_counts()
    with pytest.raises(ChecksumMismatchError, match="CRC32") as bad:
        store.get_file("a/f", str(tmp_path / "out"), size=t.size, checksum=t.checksum)
    assert bad.value.path == "a/f"
    reads = store.request_counts() - before
    assert reads.get == 1, "a damaged file was read again as if the failure were transient"
    full.write_bytes(b"y" * 10)
    with pytest.raises(ChecksumMismatchError, match="1000 bytes"):
        store.get_file("a/f", str(tmp_path / "out"), size=t.size, checksum=t.checksum)
