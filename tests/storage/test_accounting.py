"""Request accounting: the counted requests match what S3 receives, per store call, per
checkpoint, per restore and per completion; throttling and transient errors are retried."""

from __future__ import annotations

import errno
import os
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.coordinator import CheckpointCoordinator
from statebackend.errors import StorageError
from statebackend.model.manifest import StateDescriptor
from statebackend.options import StateBackendOptions
from statebackend.storage import FsspecStore, open_store
from statebackend.storage.accounting import AccountingFileSystem, RequestCounts
from statebackend.storage.testing import FaultInjectingFileSystem

MiB = 1024 * 1024
INC = "incremental"
OP = "op-1"
STATES = (StateDescriptor("count", "value", value_schema="c long"),)


@pytest.fixture
def store(store_url: tuple[str, dict[str, Any]]) -> FsspecStore:
    url, options = store_url
    s = open_store(url, storage_options=options, backoff_s=0.0)
    yield s
    s.close()


def delta(store: FsspecStore, fn: Any) -> RequestCounts:
    before = store.request_counts()
    fn()
    return store.request_counts() - before


def s3_operations(fs: Any) -> Counter[str]:
    """Count the S3 API operations s3fs really sends (botocore's before-call event)."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def on_call(model: Any, **_kw: Any) -> None:
        with lock:
            seen[model.name] += 1

    fs.connect()  # the client exists once connected
    fs.s3.meta.events.register("before-call.s3", on_call)
    return seen


def test_store_calls_count_as_s3_requests(store: FsspecStore, tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.write_bytes(b"x" * 1000)
    assert delta(store, lambda: store.put_file(str(small), "a/small")).put == 1
    got = delta(store, lambda: store.get_file("a/small", str(tmp_path / "o"), size=1000))
    assert (got.get, got.bytes_down, got.list) == (1, 1000, 0)
    assert delta(store, lambda: store.get_bytes("a/small")).get == 1
    # a miss is one HEAD, not HEAD + LIST (s3fs' info() would list a "directory")
    miss = delta(store, lambda: store.size("a/none"))
    assert (miss.head, miss.list) == (1, 0)
    assert delta(store, lambda: store.list_dir("a")).list == 1
    for i in range(3):
        store.put_bytes_atomic(f"d/{i}", b"1")
    gone = delta(store, lambda: store.delete([f"d/{i}" for i in range(3)] + ["d/missing"]))
    assert (gone.delete, gone.list) == (1, 0)  # one bulk delete, no listing
    assert store.list_dir("d") == []


@pytest.mark.s3
def test_counts_match_the_requests_moto_receives(s3_url: tuple[str, dict[str, Any]],
                                                 tmp_path: Path) -> None:
    url, options = s3_url
    store = open_store(url, storage_options=options, backoff_s=0.0, part_size=5 * MiB)
    ops = s3_operations(store.fs.inner)
    big = tmp_path / "big"
    data = os.urandom(12 * MiB + 5)
    big.write_bytes(data)
    small = tmp_path / "small"
    small.write_bytes(b"y" * 100)
    before = store.request_counts()
    store.put_file(str(small), "x/small")
    store.put_file(str(big), "x/big")  # multipart: 3 parts of 5 MiB
    store.get_file("x/big", str(tmp_path / "big2"), size=len(data))  # 3 ranged GETs
    assert (tmp_path / "big2").read_bytes() == data
    store.get_bytes("x/small")
    store.put_bytes_atomic("x/m", b"{}")
    assert store.size("x/none") is None
    store.list_dir("x")
    store.delete(["x/small", "x/big", "x/m"])
    c = store.request_counts() - before
    assert ops["UploadPart"] == c.parts == 3
    assert ops["PutObject"] + ops["CompleteMultipartUpload"] == c.put == 3
    assert ops["CreateMultipartUpload"] == 1
    assert ops["GetObject"] == c.get == 1 + 1 + 3  # small, big (opened, then 3 ranges)
    assert ops["HeadObject"] == c.head == 1
    assert ops["ListObjectsV2"] == c.list == 1
    assert ops["DeleteObjects"] + ops["DeleteObject"] == c.delete == 1
    assert (c.bytes_up, c.bytes_down) == (100 + len(data) + 2, len(data) + 100)
    store.close()


@pytest.mark.s3
def test_put_file_never_overwrites_on_s3_without_a_head(s3_url: tuple[str, dict[str, Any]],
                                                        tmp_path: Path) -> None:
    url, options = s3_url
    store = open_store(url, storage_options=options, backoff_s=0.0)
    ops = s3_operations(store.fs.inner)
    src = tmp_path / "a"
    src.write_bytes(b"first")
    store.put_file(str(src), "f")
    assert ops == Counter({"PutObject": 1})  # conditional PUT: no HEAD before or after
    src.write_bytes(b"second!")
    with pytest.raises(StorageError, match="never overwritten"):
        store.put_file(str(src), "f")
    assert store.get_bytes("f") == b"first"


@pytest.mark.parametrize("error", [
    lambda: OSError(errno.EBUSY, "SlowDown: please reduce your request rate"),  # s3fs' 503
    lambda: ConnectionError("connection reset"),
    lambda: TimeoutError("read timed out"),
])
@pytest.mark.parametrize("method", ["put_file", "open", "pipe_file", "cat_file", "info"])
def test_throttling_and_transient_errors_are_retried(tmp_path: Path, error: Any,
                                                     method: str) -> None:
    inner = FaultInjectingFileSystem(AccountingFileSystem(_memory()), fail_method=method,
                                     fail_times=2, error=error)
    store = open_store(f"/acct-{uuid.uuid4().hex}", fs=inner, backoff_s=0.0, retries=3)
    src = tmp_path / "a"
    src.write_bytes(b"payload")
    store.put_file(str(src), "f")
    store.put_bytes_atomic("m", b"manifest")
    assert store.get_bytes("m") == b"manifest"
    store.get_file("f", str(tmp_path / "b"), size=7)
    assert (tmp_path / "b").read_bytes() == b"payload"
    assert inner.failures == 2
    # every failed try is a request too
    assert store.request_counts().requests >= 6 + 2


def test_throttling_backs_off_longer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import statebackend.storage.fsspec_store as mod

    slept: list[float] = []
    monkeypatch.setattr(mod.time, "sleep", slept.append)
    monkeypatch.setattr(mod.random, "random", lambda: 0.5)
    for err, expect in ((lambda: OSError(errno.EBUSY, "SlowDown"), [0.1, 0.2]),
                        (lambda: ConnectionError("reset"), [0.01, 0.02])):
        inner = FaultInjectingFileSystem(_memory(), fail_method="pipe_file", fail_times=2,
                                         error=err)
        store = open_store(f"/backoff-{uuid.uuid4().hex}", fs=inner, backoff_s=0.01)
        slept.clear()
        store.put_bytes_atomic("m", b"x")
        assert slept == pytest.approx(expect)


def _memory() -> Any:
    from fsspec.implementations.memory import MemoryFileSystem

    return MemoryFileSystem(skip_instance_cache=True)


# --- per checkpoint, per restore, per completion -----------------------------------------


def _checkpoint(store: FsspecStore, tmp: Path, n: int, base: Any, partition: int = 0) -> Any:
    # incremental checkpoints' requests (changelog mode adds the adoption's reads)
    cp = PartitionCheckpointer(store, OP, partition, StateBackendOptions(checkpoint_mode=INC),
                               str(tmp / "local"))
    inst, _ = cp.restore(base)
    inst.write({"default": {b"k%06d" % i: b"v%d" % n * 10 for i in range(n * 50, n * 50 + 200)},
                "count": {b"c": b"%d" % n}})
    m, metrics = cp.checkpoint(inst, n, f"a{n}", (0, 63), STATES)
    inst.close()
    return m, metrics


def test_checkpoint_puts_are_files_written_plus_one_manifest(store: FsspecStore,
                                                             tmp_path: Path) -> None:
    base = None
    for n in range(1, 4):
        before = store.request_counts()
        base, metrics = _checkpoint(store, tmp_path, n, base)
        counted = store.request_counts() - before
        recorded = RequestCounts.from_dict(base.metrics["checkpoint_requests"])
        assert recorded.put == metrics.files_uploaded + 1 == counted.put
        assert counted.parts == 0
        assert (counted.list, counted.get, counted.delete) == (0, 0, 0)
        if store.fs.exclusive_put:  # S3: conditional PUTs, nothing to check afterwards
            assert counted.head == 0
    assert base.base_checkpoint_id == 2  # incremental: reused files cost no request


def test_restore_from_durable_reads_each_file_once_and_never_lists(store: FsspecStore,
                                                                   tmp_path: Path) -> None:
    m, _ = _checkpoint(store, tmp_path / "w", 1, None)
    cp = PartitionCheckpointer(store, OP, 0, StateBackendOptions(checkpoint_mode=INC),
                               str(tmp_path / "elsewhere"))
    before = store.request_counts()
    inst, rm = cp.restore(m)
    inst.close()
    c = store.request_counts() - before
    assert rm.source.value == "durable"
    assert (c.get, c.list, c.put, c.delete) == (len(m.files), 0, 0, 0)
    assert c.bytes_down == m.full_size


def test_completion_reads_one_manifest_per_partition_and_lists_once(tmp_path: Path) -> None:
    from tests.coordinator.coordsim import run_attempt

    store = open_store(str(tmp_path / "d"), backoff_s=0.0, read_threads=4)
    P = 12
    coord = CheckpointCoordinator(store, "op1", P, 64, num_retained=1)
    base = {}
    for n in range(3):
        for p in range(P):
            base[p] = run_attempt(store, n, p, "a", {f"{n}.sst": b"s" * 50}, base.get(p),
                                  parallelism=P, max_parallelism=64)
        # a failed attempt of partition 0 left a file behind
        store.put_bytes_atomic(f"op1/chk-{n}/p0/dead/9.sst", b"x")
        before = store.request_counts()
        assert coord.try_complete(n) is not None
        c = coord.last_completion_requests
        assert c is not None
        # the record, then the newest-checkpoint pointer (a deleted latest record is missed)
        assert (c.list, c.get, c.put, c.delete) == (1, P, 2, 0)
        gc = store.request_counts() - before - c
        if n > 0:
            # retention dropped checkpoint n-1: its files are found from its record and go
            # in bulk deletes (the sweep's, data files, manifests, record and pin: 4,
            # whatever the parallelism); the one listing is the sweep of chk-<n-1>/
            # (failed attempts); the ownership proofs before the completion and before the
            # collection are a listing of _writers/ and a read of LATEST.json each
            assert (gc.delete, gc.list, gc.get) == (4, 1 + 2, 2)
        assert len(coord.chosen_manifests(n)) == P
    assert not store.exists("op1/chk-1/p0/dead/9.sst")
    coord.close()
    store.close()


def test_requests_reach_the_checkpoint_metrics(tmp_path: Path) -> None:
    from statebackend.backend import complete_pending
    from statebackend.metrics_store import read_metrics
    from tests.coordinator.coordsim import run_attempt

    store = open_store(str(tmp_path / "d"), backoff_s=0.0)
    coord = CheckpointCoordinator(store, "op1", 2, 64)
    for p in range(2):
        m = run_attempt(store, 0, p, "a", {"1.sst": b"s" * 10}, None, parallelism=2,
                        max_parallelism=64)
        # what a task records (the simulated task does not count itself)
        raw = m.with_metrics(checkpoint_requests=RequestCounts(put=4).to_dict(),
                             restore_requests=RequestCounts(get=2, bytes_down=9).to_dict())
        store.put_bytes_atomic(f"op1/{m.path}", raw.to_json().encode())
    # the listener's call; completing without knowing that Spark committed the batch
    # costs one GET more (whether another coordinator recorded the commit)
    complete_pending(coord, up_to=0)
    (line,) = read_metrics(store, "op1")
    assert line["requests"]["checkpoint"]["put"] == 8
    assert line["requests"]["restore"] == {**RequestCounts(get=4, bytes_down=18).to_dict()}
    assert line["requests"]["completion"]["get"] == 2
    assert line["requests"]["completion"]["list"] == 1
    coord.close()


def test_metrics_files_do_not_grow_with_the_checkpoints_taken(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    import statebackend.metrics_store as metrics
    from statebackend.backend import complete_pending
    from tests.coordinator.coordsim import run_attempt

    monkeypatch.setattr(metrics, "METRICS_KEPT", 5)
    monkeypatch.setattr(metrics, "METRICS_DELETE_EVERY", 3)
    store = open_store(str(tmp_path / "d"), backoff_s=0.0)
    coord = CheckpointCoordinator(store, "op1", 1, 64, num_retained=2)
    base = None
    counts = []
    for n in range(20):
        base = run_attempt(store, n, 0, "a", {f"{n}.sst": b"s"}, base, parallelism=1,
                           max_parallelism=64)
        complete_pending(coord)
        counts.append(len(store.list_dir("op1/_metrics")))
    assert max(counts) <= 5 + 3
    assert [r["checkpoint_id"] for r in metrics.read_metrics(store, "op1")][-1] == 19
    assert min(r["checkpoint_id"] for r in metrics.read_metrics(store, "op1")) >= 19 - 5 - 3
    coord.close()
