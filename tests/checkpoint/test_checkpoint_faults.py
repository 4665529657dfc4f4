"""Faults around publication: failed uploads, killed processes, unsafe manifests, S3."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint.task_metrics import RestoreSource
from statebackend.errors import CorruptStateError, StorageError, UnsafePathError
from statebackend.model.manifest import MANIFEST_NAME, PartitionManifest
from statebackend.options import StateBackendOptions
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.storage import list_published_manifests, open_store, read_manifest
from statebackend.storage.testing import FaultInjectingFileSystem

OP = "op-1"
pytestmark = pytest.mark.faults


def dump(inst: RocksDBInstance) -> dict[str, dict[bytes, bytes]]:
    return {cf: dict(inst.scan_range(cf, b"", None)) for cf in inst.column_family_names()}


def batch(cp: PartitionCheckpointer, base: PartitionManifest | None, n: int, attempt: str,
          tag: bytes) -> tuple[PartitionManifest, dict[str, dict[bytes, bytes]]]:
    inst, _ = cp.restore(base)
    try:
        inst.write({"default": {b"k%05d" % i: tag * 16 for i in range(n * 50, n * 50 + 400)}})
        state = dump(inst)
        m, _ = cp.checkpoint(inst, n, attempt)
        return m, state
    finally:
        inst.close()


def test_upload_failing_midway_publishes_nothing_and_next_checkpoint_succeeds(
        tmp_path: Path) -> None:
    root = f"/sb-midway-{uuid.uuid4().hex[:10]}"
    fs = FaultInjectingFileSystem(fsspec.filesystem("memory"), match=".sst", fail_after=1)
    store = open_store(root, fs=fs, retries=1, backoff_s=0.0, upload_threads=1)
    local = str(tmp_path / "local")
    healthy = open_store(root, fs=fsspec.filesystem("memory"))
    inc = StateBackendOptions(checkpoint_mode="incremental")  # SST uploads failing midway
    m1, s1 = batch(PartitionCheckpointer(healthy, OP, 0, inc, local_root=local), None, 1, "a0",
                   b"1")

    cp = PartitionCheckpointer(store, OP, 0, inc, local_root=local)
    inst, _ = cp.restore(m1)
    inst.write({"default": {b"new%d" % i: b"v" * 30 for i in range(300)}})
    inst.flush()
    inst.write({"default": {b"more%d" % i: b"w" * 30 for i in range(300)}})
    with pytest.raises(StorageError):
        cp.checkpoint(inst, 2, "a0")
    inst.close()
    assert fs.failures >= 1
    assert list_published_manifests(healthy, 2, 0, operator_id=OP) == []
    assert not os.path.exists(cp.local.copy_dir(2, "a0"))  # no copy of an unpublished one

    # The task is retried under a new attempt name, and the store has recovered.
    fs.fail_method = "none"
    m2, s2 = batch(PartitionCheckpointer(store, OP, 0, local_root=local), m1, 2, "a1", b"2")
    assert [m.attempt for m in list_published_manifests(healthy, 2, 0, operator_id=OP)] == ["a1"]
    m3, s3 = batch(PartitionCheckpointer(store, OP, 0, local_root=local), m2, 3, "a0", b"3")
    fresh = PartitionCheckpointer(healthy, OP, 0, local_root=str(tmp_path / "other"))
    inst, rm = fresh.restore(m3)
    assert rm.source is RestoreSource.DURABLE and dump(inst) == s3
    inst.close()


def test_failed_manifest_publication_leaves_no_manifest(tmp_path: Path) -> None:
    root = f"/sb-pub-{uuid.uuid4().hex[:10]}"
    fs = FaultInjectingFileSystem(fsspec.filesystem("memory"), fail_method="pipe_file",
                                  match=MANIFEST_NAME)
    store = open_store(root, fs=fs, retries=2, backoff_s=0.0)
    cp = PartitionCheckpointer(store, OP, 0, local_root=str(tmp_path))
    with pytest.raises(StorageError):
        batch(cp, None, 1, "a0", b"x")
    assert fs.failures == 3
    assert list_published_manifests(store, 1, 0, operator_id=OP) == []
    # The uploaded files stay, for the coordinator's sweep of failed attempts.
    assert store.list_dir(f"{OP}/chk-1/p0/a0")


_KILLED = textwrap.dedent("""
    import json, os, sys
    import statebackend.checkpoint.publish as pub
    from statebackend.checkpoint import PartitionCheckpointer
    from statebackend.storage import open_store, read_manifest

    root, local, base_path = sys.argv[1:4]
    store = open_store(root)
    base = read_manifest(store, base_path, operator_id="op-1")
    cp = PartitionCheckpointer(store, "op-1", 0, local_root=local)
    inst, _ = cp.restore(base)
    inst.write({"default": {b"late%d" % i: b"z" * 40 for i in range(500)}})

    def killed(*_a, **_k):
        os._exit(9)   # the executor dies after the uploads, before publication

    pub.publish_manifest = killed
    cp.checkpoint(inst, 2, "a0")
""")


def test_process_killed_between_upload_and_publication(tmp_path: Path) -> None:
    root, local = str(tmp_path / "durable"), str(tmp_path / "local")
    store = open_store(root)
    m1, s1 = batch(PartitionCheckpointer(store, OP, 0, local_root=local), None, 1, "a0", b"1")
    proc = subprocess.run([sys.executable, "-c", _KILLED, root, local, m1.path],
                          capture_output=True, text=True, timeout=120,
                          cwd=str(Path(__file__).resolve().parents[2]))
    assert proc.returncode == 9, proc.stderr
    assert any(p.endswith(".sst") for p in store.list_dir(f"{OP}/chk-2/p0/a0"))
    assert list_published_manifests(store, 2, 0, operator_id=OP) == []
    # The previous checkpoint is intact and restores to exactly its state, from any source.
    for where in (local, str(tmp_path / "elsewhere")):
        cp = PartitionCheckpointer(store, OP, 0, local_root=where)
        inst, _ = cp.restore(m1)
        assert dump(inst) == s1
        inst.close()
    m2, s2 = batch(PartitionCheckpointer(store, OP, 0, local_root=local), m1, 2, "a1", b"2")
    assert read_manifest(store, m2.path, operator_id=OP) == m2


@pytest.mark.parametrize("bad_path", ["../../etc/passwd", "/etc/passwd", "chk-1/../../x",
                                      "s3:/x/y", "chk-1/p0/a0/../../../../x"])
def test_manifest_naming_a_path_outside_the_root_is_refused(tmp_path: Path,
                                                            bad_path: str) -> None:
    store = open_store(str(tmp_path / "durable"))
    m1, _ = batch(PartitionCheckpointer(store, OP, 0, local_root=str(tmp_path / "l")), None,
                  1, "a0", b"1")
    d = json.loads(m1.to_json())
    d["files"][0]["path"] = bad_path
    forged = f"chk-1/p0/a9/{MANIFEST_NAME}"
    d["attempt"] = "a9"
    store.child(OP).put_bytes_atomic(forged, json.dumps(d).encode())
    with pytest.raises(UnsafePathError):
        read_manifest(store, forged, operator_id=OP)
    with pytest.raises(UnsafePathError):
        PartitionManifest.from_json(json.dumps(d))


def test_manifest_file_name_escaping_the_working_dir_is_refused(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "durable"))
    m1, _ = batch(PartitionCheckpointer(store, OP, 0, local_root=str(tmp_path / "l")), None,
                  1, "a0", b"1")
    d = json.loads(m1.to_json())
    d["files"][0]["name"] = "../CURRENT"
    with pytest.raises(UnsafePathError):
        PartitionManifest.from_json(json.dumps(d))


def test_truncated_manifest_is_corrupt(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "durable"))
    m1, _ = batch(PartitionCheckpointer(store, OP, 0, local_root=str(tmp_path / "l")), None,
                  1, "a0", b"1")
    forged = f"chk-1/p0/a8/{MANIFEST_NAME}"
    store.child(OP).put_bytes_atomic(forged, m1.to_json().encode()[:200])
    with pytest.raises(CorruptStateError):
        read_manifest(store, forged, operator_id=OP)


def test_checkpoint_and_durable_restore_on_every_store(
        store_url: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, options = store_url
    store = open_store(url, storage_options=options, backoff_s=0.0)
    # The store ships to executors pickled: use a pickled copy like a task would.
    store = pickle.loads(pickle.dumps(store))
    opts = StateBackendOptions()
    m = None
    for n in (1, 2, 3):
        cp = PartitionCheckpointer(store, OP, 3, opts, str(tmp_path / "exec"))
        m, state = batch(cp, m, n, "a0", b"%d" % n)
    assert m is not None and any(not f.uploaded for f in m.files)
    cp = PartitionCheckpointer(store, OP, 3, opts, str(tmp_path / "other-executor"))
    inst, rm = cp.restore(m)
    assert rm.source is RestoreSource.DURABLE and dump(inst) == state
    assert rm.bytes_downloaded == m.full_size
    inst.close()
    store.close()
