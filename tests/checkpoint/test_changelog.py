"""Changelog mode: the changelog format, replay, materialization and its faults.

The Hypothesis test drives one partition through any sequence of batches of writes, crashed
attempts (before publication, or after the changelog upload), materializations that
complete at once, later (after newer changelogs) or never (a crash while uploading), and
checks after every batch that a restore from durable storage alone, and the next batch's
restore, equal a plain dict model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from statebackend.checkpoint import PartitionCheckpointer, RestoreSource
from statebackend.checkpoint import changelog_mode as changelog_mode_mod
from statebackend.checkpoint import materialize as materialize_mod
from statebackend.checkpoint import publish as publish_mod
from statebackend.checkpoint.changelog import ChangelogWriter, read_records, replay
from statebackend.checkpoint.materialize import (
    Lineage,
    materialization_due,
    pending_limit,
    upload_materialization,
    wait_for_materializations,
)
from statebackend.coordinator import (
    CheckpointCoordinator,
    RegisteredCheckpoint,
    SharedStateRegistry,
)
from statebackend.errors import CorruptStateError, StorageError
from statebackend.local.disk import INFLIGHT_SUFFIX
from statebackend.model.manifest import (
    MATERIALIZED_NAME,
    CompletedCheckpoint,
    MaterializationRef,
    PartitionManifest,
    attempt_dir,
    changelog_name,
)
from statebackend.options import StateBackendOptions
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.storage import open_store, read_manifest

OP = "op"
CFS = ("default", "a", "b")
KEYS = [b"k%d" % i for i in range(12)]

Model = dict[str, dict[bytes, bytes]]


def dump(inst: RocksDBInstance) -> Model:
    """Non-empty column families and their entries (the logical state)."""
    out = {cf: dict(inst.scan_range(cf, b"", None)) for cf in inst.column_family_names()}
    return {cf: d for cf, d in out.items() if d}


def apply(inst: RocksDBInstance, model: Model, ops: list[tuple]) -> None:
    """Apply ``ops`` to the instance and to the model alike."""
    for op in ops:
        kind, cf = op[0], op[1]
        if kind == "put":
            inst.write({cf: {op[2]: op[3]}})
            model.setdefault(cf, {})[op[2]] = op[3]
        elif kind == "delete":
            inst.write({cf: {op[2]: None}})
            model.get(cf, {}).pop(op[2], None)
        elif kind == "range":
            lo, hi = sorted((op[2], op[3]))
            inst.delete_range(cf, lo, hi)
            for k in [k for k in model.get(cf, {}) if lo <= k < hi]:
                del model[cf][k]
        elif kind == "drop":
            if cf != "default":
                inst.drop_column_family(cf)
                model.pop(cf, None)
        else:  # a multi-entry write batch
            inst.write({cf: dict(op[2])})
            for k, v in op[2]:
                if v is None:
                    model.get(cf, {}).pop(k, None)
                else:
                    model.setdefault(cf, {})[k] = v
    for cf in [cf for cf, d in model.items() if not d]:
        del model[cf]


keys = st.sampled_from(KEYS)
values = st.binary(min_size=0, max_size=40)
cfs = st.sampled_from(CFS)
ops = st.one_of(
    st.tuples(st.just("put"), cfs, keys, values),
    st.tuples(st.just("delete"), cfs, keys),
    st.tuples(st.just("range"), cfs, keys, keys),
    st.tuples(st.just("drop"), cfs),
    st.tuples(st.just("batch"), cfs,
              st.lists(st.tuples(keys, st.none() | values), max_size=8,
                       unique_by=lambda kv: kv[0])),
)


class Dying:
    """A store whose worker dies after storing the first file of an upload."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def put_files(self, pairs: Any, **kw: Any) -> Any:
        self.store.put_files(list(pairs)[:1], **kw)
        raise StorageError("injected: worker died mid-materialization")


class Background:
    """Stands in for the worker's materialization thread: the test decides when (or
    whether) each queued upload runs."""

    def __init__(self) -> None:
        self.queue: list[tuple[tuple, dict]] = []

    def submit(self, store: Any, snapshot: Any, *args: Any, **kwargs: Any) -> None:
        Path(snapshot.directory + INFLIGHT_SUFFIX).write_text(str(os.getpid()))
        self.queue.append(((store, snapshot, *args), kwargs))

    def run_all(self) -> None:
        for args, kwargs in self.queue:
            try:
                upload_materialization(*args, **kwargs)
            finally:
                os.unlink(args[1].directory + INFLIGHT_SUFFIX)
        self.queue.clear()

    def crash_all(self) -> None:
        """Each upload stores one file, then its worker dies."""
        for (store, *rest), kwargs in self.queue:
            with pytest.raises(StorageError):
                upload_materialization(Dying(store), *rest, **kwargs)
        self.lose_all()

    def lose_all(self) -> None:
        """The worker died while uploading: nothing published."""
        for args, _kwargs in self.queue:
            os.unlink(args[1].directory + INFLIGHT_SUFFIX)
        self.queue.clear()


@pytest.fixture
def background(monkeypatch: pytest.MonkeyPatch) -> Background:
    bg = Background()
    monkeypatch.setattr(changelog_mode_mod, "materialize_in_background", bg.submit)
    return bg


def options(**kw: Any) -> StateBackendOptions:
    """Changelog mode, materializing in the background unless a test says otherwise."""
    return StateBackendOptions(**{"checkpoint_mode": "changelog",
                                  "materialize_inline_ratio": 0.0, **kw})


def restore_durable(store: Any, m: PartitionManifest | None, opts: StateBackendOptions
                    ) -> Model:
    """The state of ``m`` from durable storage alone (fresh local directory)."""
    local = tempfile.mkdtemp()
    try:
        cp = PartitionCheckpointer(store, OP, 0, opts, local)
        inst, metrics = cp.restore(m)
        try:
            assert metrics.source in (RestoreSource.DURABLE, RestoreSource.EMPTY)
            return dump(inst)
        finally:
            inst.close()
    finally:
        shutil.rmtree(local, ignore_errors=True)


# --- the format ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(ops, max_size=30))
def test_format_round_trips_any_sequence_of_records(seq: list[tuple]) -> None:
    d = tempfile.mkdtemp()
    try:
        w = ChangelogWriter(os.path.join(d, "x.sbcl"))
        want = []
        for op in seq:
            if op[0] in ("put", "delete", "batch"):
                entries = ({op[2]: op[3] if op[0] == "put" else None} if op[0] != "batch"
                           else dict(op[2]))
                if entries:
                    w.write(op[1], entries)
                    want.append((1, op[1], entries))
            elif op[0] == "range":
                w.delete_range(op[1], op[2], op[3])
                want.append((2, op[1], (op[2], op[3])))
            else:
                w.drop_column_family(op[1])
                want.append((4, op[1], None))
        stats = w.finish()
        data = Path(w.path).read_bytes()
        assert stats.size == len(data) and stats.records == len(want)
        got = [(r.op, r.cf, r.entries if r.op == 1 else (r.start, r.end) if r.op == 2 else None)
               for r in read_records(data)]
        assert got == want
    finally:
        shutil.rmtree(d)


def test_frames_bound_memory_and_every_damage_is_detected(tmp_path: Path) -> None:
    w = ChangelogWriter(str(tmp_path / "big.sbcl"))
    for i in range(40):  # ~2.6 MB raw: several frames
        w.write("default", {b"k%05d-%d" % (j, i): os.urandom(64) for j in range(1000)})
    stats = w.finish()
    data = (tmp_path / "big.sbcl").read_bytes()
    assert stats.records == 40 and sum(1 for _ in read_records(data)) == 40
    for bad in (data[:-1], data[: len(data) // 2], data[:6],
                data[:100] + bytes([data[100] ^ 1]) + data[101:], b"XXXX" + data[4:]):
        with pytest.raises(CorruptStateError):
            list(read_records(bad))


def test_replay_applies_every_record_kind(tmp_path: Path) -> None:
    with RocksDBInstance(str(tmp_path / "src")) as src, \
            RocksDBInstance(str(tmp_path / "dst")) as dst:
        model: Model = {}
        apply(dst, {}, [("put", "b", b"k1", b"old")])  # state before the batch
        model = {"b": {b"k1": b"old"}}
        apply(src, {}, [("put", "b", b"k1", b"old")])
        src.changelog = ChangelogWriter(str(tmp_path / "c.sbcl"))
        apply(src, model, [("put", "a", b"k1", b"v"), ("batch", "a", [(b"k2", b"w"),
                                                                     (b"k3", None)]),
                           ("range", "a", b"k0", b"k2"), ("drop", "b"),
                           ("put", "b", b"k9", b"new")])
        src.changelog.finish()
        n = replay(dst, (tmp_path / "c.sbcl").read_bytes())
        assert n >= 5 and dump(dst) == dump(src) == model


# --- any sequence of writes, crashes and materializations ---------------------------------


steps = st.lists(st.tuples(
    st.lists(ops, max_size=6),
    st.sampled_from(["commit", "commit", "commit", "crash", "unpublished"]),
    st.sampled_from(["now", "later", "later", "lost"])), min_size=1, max_size=8)


@settings(max_examples=30, deadline=None)
@given(steps, st.integers(1, 3))
def test_any_writes_crashes_and_materializations_restore_the_model(
        scenario: list[tuple], interval: int) -> None:
    bg = Background()
    orig = changelog_mode_mod.materialize_in_background
    orig_publish = publish_mod.publish_manifest
    orig_min = materialize_mod.MIN_CHANGELOG_BYTES
    changelog_mode_mod.materialize_in_background = bg.submit  # type: ignore[assignment]
    # small enough that a batch writing more than the state (the first one, or after an
    # abandoned materialization) materializes in its own critical path
    materialize_mod.MIN_CHANGELOG_BYTES = 64
    root = tempfile.mkdtemp()
    try:
        store = open_store(os.path.join(root, "durable"), backoff_s=0.0)
        opts = options(materialize_interval=interval, materialize_changelog_ratio=100.0)
        model: Model = {}
        last: PartitionManifest | None = None
        n = 0
        for i, (batch_ops, outcome, materialization) in enumerate(scenario):
            cp = PartitionCheckpointer(store, OP, 0, opts, os.path.join(root, "local"))
            inst, _ = cp.restore(last)
            assert dump(inst) == model
            attempt_model = {cf: dict(d) for cf, d in model.items()}
            apply(inst, attempt_model, batch_ops)
            if outcome == "crash":  # the task dies before its checkpoint
                inst.close()
                continue
            n += 1
            if outcome == "unpublished":  # changelog uploaded, manifest never published
                def fail(*_a: Any) -> None:
                    raise StorageError("injected: publication lost")
                publish_mod.publish_manifest = fail  # type: ignore[assignment]
                with pytest.raises(StorageError):
                    cp.checkpoint(inst, n, f"x{i}", (0, 127))
                publish_mod.publish_manifest = orig_publish  # type: ignore[assignment]
                # its changelog, or the materialization of a batch that wrote more than
                # its state, stays behind unreferenced
                adir = attempt_dir(n, 0, f"x{i}")
                assert store.child(OP).exists(f"{adir}/{changelog_name(n)}") or \
                    store.child(OP).exists(f"{adir}/{MATERIALIZED_NAME}")
                inst.close()
                n -= 1  # the batch is retried under the same id
                continue
            last, _ = cp.checkpoint(inst, n, f"a{i}", (0, 127))
            inst.close()
            model = attempt_model
            if materialization == "now":
                bg.run_all()
            elif materialization == "lost":
                bg.lose_all()
            assert restore_durable(store, last, opts) == model
        bg.run_all()
        assert restore_durable(store, last, opts) == model
    finally:
        changelog_mode_mod.materialize_in_background = orig  # type: ignore[assignment]
        publish_mod.publish_manifest = orig_publish  # type: ignore[assignment]
        materialize_mod.MIN_CHANGELOG_BYTES = orig_min
        shutil.rmtree(root, ignore_errors=True)


# --- the three fault cases ----------------------------------------------------------------


def _batch(store: Any, tmp_path: Path, opts: StateBackendOptions, base: PartitionManifest | None,
           n: int, model: Model, attempt: str = "a0") -> PartitionManifest:
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local"))
    inst, _ = cp.restore(base)
    assert dump(inst) == model
    apply(inst, model, [("batch", "default", [(b"k%03d" % (n * 7 % 50 + j), b"v%d" % n)
                                              for j in range(5)]),
                        ("delete", "default", b"k%03d" % (n % 50))])
    try:
        m, _ = cp.checkpoint(inst, n, attempt, (0, 127))
    finally:
        inst.close()
    return m


@pytest.mark.faults
def test_crash_during_materialization_is_abandoned_then_retried(
        tmp_path: Path, background: Background, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = options(materialize_interval=2)
    model: Model = {}
    m = _batch(store, tmp_path, opts, None, 1, model)
    assert m.pending_materialization == MaterializationRef(1, "a0")
    # the upload dies after some files: no _MATERIALIZED.json is ever published
    background.crash_all()
    assert not store.child(OP).exists(f"{attempt_dir(1, 0, 'a0')}/{MATERIALIZED_NAME}")
    ms = [m]
    for n in range(2, 3 + pending_limit(opts.materialize_interval)):
        ms.append(_batch(store, tmp_path, opts, ms[-1], n, model))
        assert restore_durable(store, ms[-1], opts) == model
        if ms[-1].pending_materialization != MaterializationRef(1, "a0"):
            break
    # abandoned after the limit, and a new materialization started in the same batch
    last = ms[-1]
    assert last.materialization is None
    assert last.pending_materialization is not None
    assert last.pending_materialization.checkpoint_id == last.checkpoint_id
    background.run_all()
    nxt = _batch(store, tmp_path, opts, last, last.checkpoint_id + 1, model)
    assert nxt.materialization == last.pending_materialization
    assert [f.name for f in nxt.changelog_files] == [changelog_name(nxt.checkpoint_id)]
    assert restore_durable(store, nxt, opts) == model


def test_a_materialization_still_uploading_on_this_machine_is_never_abandoned(
        tmp_path: Path, background: Background) -> None:
    # A large state's materialization can take longer than pending_limit short batches.
    # While a live process of this machine uploads it (its local copy marked in flight),
    # checkpoints keep waiting for it instead of throwing the upload away.
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = options(materialize_interval=2)
    model: Model = {}
    ms = [_batch(store, tmp_path, opts, None, 1, model)]
    ref = MaterializationRef(1, "a0")
    assert ms[0].pending_materialization == ref and len(background.queue) == 1
    for n in range(2, 4 + pending_limit(opts.materialize_interval)):
        ms.append(_batch(store, tmp_path, opts, ms[-1], n, model))
        assert ms[-1].pending_materialization == ref
        assert ms[-1].metrics["changelog"]["adoption"] == "pending"
    background.run_all()  # the upload ends, late
    nxt = _batch(store, tmp_path, opts, ms[-1], ms[-1].checkpoint_id + 1, model)
    assert nxt.materialization == ref and nxt.metrics["changelog"]["adoption"] == "adopted"
    assert restore_durable(store, nxt, opts) == model


def test_a_batch_that_writes_more_than_its_state_materializes_in_its_critical_path(
        tmp_path: Path, background: Background) -> None:
    # A load: the first batch's changelog would be as big as the state, and a background
    # materialization would upload the same data again. Its checkpoint is a materialization
    # instead, adopted at once; the next (small) batch is a changelog on top of it.
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = options()
    model: Model = {}
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local"))
    inst, _ = cp.restore(None)
    apply(inst, model, [("batch", "default", [(b"load%05d" % i, os.urandom(1024))
                                              for i in range(3000)])])
    m1, met1 = cp.checkpoint(inst, 1, "a0", (0, 127))
    inst.close()
    assert background.queue == []  # nothing left for the background
    assert m1.materialization == MaterializationRef(1, "a0")
    assert m1.pending_materialization is None and m1.changelog_files == ()
    assert m1.metrics["changelog"]["materialized_inline"] is True
    assert store.child(OP).exists(f"{attempt_dir(1, 0, 'a0')}/{MATERIALIZED_NAME}")
    assert met1.bytes_uploaded == sum(f.size for f in m1.db_files) >= 3000 * 1024
    assert restore_durable(store, m1, opts) == model
    # the next batch restores from the local copy of that materialization, downloading
    # nothing, and adds a changelog only
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local"))
    cp.local.use_working_dir("elsewhere")  # not the working directory: the local copy
    inst, rmet = cp.restore(m1)
    assert rmet.source == RestoreSource.LOCAL_COPY and rmet.bytes_downloaded == 0
    apply(inst, model, [("put", "default", b"after", b"load")])
    m2, met2 = cp.checkpoint(inst, 2, "a0", (0, 127))
    inst.close()
    assert m2.materialization == MaterializationRef(1, "a0") and background.queue == []
    assert [f.name for f in m2.changelog_files] == [changelog_name(2)]
    assert {f.path for f in m1.db_files} <= {f.path for f in m2.files}
    assert met2.bytes_uploaded == m2.changelog_files[0].size
    assert restore_durable(store, m2, opts) == model
    # the coordinator counts the materialization's files for both and deletes nothing live
    coord = CheckpointCoordinator(store, OP, 1, 128, num_retained=1)
    assert coord.try_complete(1) is not None and coord.try_complete(2) is not None
    coord.collect_garbage()
    assert restore_durable(store, m2, opts) == model


@pytest.mark.parametrize("ratio, interval", [(2.0, 10), (2.0, 1), (0.0, 1)])
def test_small_materializations_go_in_the_critical_path_and_rewrites_to_the_background(
        tmp_path: Path, background: Background, ratio: float, interval: int) -> None:
    # materialize_inline_ratio: every batch takes a snapshot (whatever the interval); one
    # that adds about the batch's own writes is uploaded instead of the changelog and
    # adopted at once, one holding a compaction's rewrite of the state goes to the
    # background. 0 (the default): materializations when due, all in the background.
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = options(materialize_interval=interval, materialize_inline_ratio=ratio)
    model: Model = {}
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local"))
    inst, _ = cp.restore(None)
    apply(inst, model, [("batch", "default", [(b"k%05d" % i, os.urandom(1024))
                                              for i in range(3000)])])
    m1, _ = cp.checkpoint(inst, 1, "a0", (0, 127))  # a load: inline whatever the ratio
    assert m1.materialization == MaterializationRef(1, "a0")
    cp.resume(m1, inst)  # the instance stays open, as a kept-open task's does

    apply(inst, model, [("batch", "default", [(b"k%05d" % i, os.urandom(1024))
                                              for i in range(0, 3000, 30)])])
    m2, met2 = cp.checkpoint(inst, 2, "a0", (0, 127))
    if ratio:
        assert m2.materialization == MaterializationRef(2, "a0")
        assert m2.pending_materialization is None and m2.changelog_files == ()
        assert m2.metrics["changelog"]["materialized_inline"] is True
        assert background.queue == []
        # the batch's critical path: its flushed writes (100 x 1 KiB) and the small files
        assert 100 * 1024 <= met2.bytes_uploaded < 2 * 100 * 1024 + 128 * 1024
        # and only them: the load's files are reused
        assert {f.path for f in m1.db_files if f.shared} & {f.path for f in m2.db_files}
    else:
        assert m2.pending_materialization == MaterializationRef(2, "a0")
        assert [f.name for f in m2.changelog_files] == [changelog_name(2)]
        assert len(background.queue) == 1
        background.run_all()
    assert restore_durable(store, m2, opts) == model
    cp.resume(m2, inst)

    # a compaction rewrites the whole state: its materialization goes to the background
    apply(inst, model, [("put", "default", b"k00001", b"small")])
    inst.db.compact_range(None, None)
    m3, met3 = cp.checkpoint(inst, 3, "a0", (0, 127))
    assert m3.pending_materialization == MaterializationRef(3, "a0")
    assert [f.name for f in m3.changelog_files][-1] == changelog_name(3)
    assert met3.bytes_uploaded == m3.changelog_files[-1].size < 4096
    assert len(background.queue) == 1
    assert restore_durable(store, m3, opts) == model
    background.run_all()
    cp.resume(m3, inst)

    # adopted by the next batch, whose own snapshot is small again
    apply(inst, model, [("put", "default", b"k00002", b"tiny")])
    m4, _ = cp.checkpoint(inst, 4, "a0", (0, 127))
    inst.close()
    if ratio:
        assert m4.materialization == MaterializationRef(4, "a0")
        assert m4.changelog_files == () and background.queue == []
    else:
        assert m4.materialization == MaterializationRef(3, "a0")
        assert m4.pending_materialization == MaterializationRef(4, "a0")
    assert restore_durable(store, m4, opts) == model


def test_a_reused_file_is_checked_once_per_inode(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # A materialization reuses the files of the previous one whose checksum matches. A
    # hard link to a file this process checked or uploaded has that checksum; a file
    # rewritten in place (a new inode or modification time) is read again.
    calls: list[str] = []
    real = materialize_mod.file_crc32

    def counting(path: str) -> tuple[int, str]:
        calls.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(materialize_mod, "file_crc32", counting)
    a = tmp_path / "a.sst"
    a.write_bytes(b"x" * 1000)
    first = materialize_mod.known_checksum(str(a))
    assert first == real(str(a))[1] and calls == ["a.sst"]
    os.link(a, tmp_path / "b.sst")
    assert materialize_mod.known_checksum(str(tmp_path / "b.sst")) == first
    assert calls == ["a.sst"]
    (tmp_path / "c.sst").write_bytes(b"y" * 1000)
    materialize_mod.remember_checksum(str(tmp_path / "c.sst"), "crc32:deadbeef")
    assert materialize_mod.known_checksum(str(tmp_path / "c.sst")) == "crc32:deadbeef"
    assert calls == ["a.sst"]
    a.unlink()
    (tmp_path / "b.sst").unlink()
    a.write_bytes(b"z" * 1000)  # same name and size, other bytes and inode
    os.utime(a, ns=(1, 1))
    assert materialize_mod.known_checksum(str(a)) == real(str(a))[1] != first
    assert calls == ["a.sst", "a.sst"]


@pytest.mark.faults
def test_changelog_uploaded_but_manifest_not_published(
        tmp_path: Path, background: Background, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = options()
    model: Model = {}
    m1 = _batch(store, tmp_path, opts, None, 1, model)
    background.run_all()

    def lost(*_a: Any) -> None:
        raise StorageError("injected: manifest publication lost")

    monkeypatch.setattr(publish_mod, "publish_manifest", lost)
    with pytest.raises(StorageError):
        _batch(store, tmp_path, opts, m1, 2, {cf: dict(d) for cf, d in model.items()},
               attempt="bad")
    monkeypatch.undo()
    monkeypatch.setattr(changelog_mode_mod, "materialize_in_background", background.submit)
    orphan = f"{attempt_dir(2, 0, 'bad')}/{changelog_name(2)}"
    assert store.child(OP).exists(orphan)
    # the retry starts from checkpoint 1 (never from the dirty working directory)
    m2 = _batch(store, tmp_path, opts, m1, 2, model, attempt="good")
    assert orphan not in {f.path for f in m2.files}
    assert restore_durable(store, m2, opts) == model
    # the coordinator completes 1 and 2 (and 3) and its sweep deletes the orphan
    coord = CheckpointCoordinator(store, OP, 1, 128, num_retained=1)
    assert coord.try_complete(1) is not None and coord.try_complete(2) is not None
    m3 = _batch(store, tmp_path, opts, m2, 3, model)
    assert coord.try_complete(3) is not None
    coord.collect_garbage()
    assert not store.child(OP).exists(orphan)
    assert restore_durable(store, m3, opts) == model


@pytest.mark.faults
def test_materialization_completing_after_newer_changelogs(
        tmp_path: Path, background: Background) -> None:
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = options(materialize_interval=2)
    model: Model = {}
    ms = [_batch(store, tmp_path, opts, None, 1, model)]
    background.run_all()
    ms.append(_batch(store, tmp_path, opts, ms[-1], 2, model))  # adopts 1
    ms.append(_batch(store, tmp_path, opts, ms[-1], 3, model))  # starts 3, stays queued
    assert ms[-1].pending_materialization == MaterializationRef(3, "a0")
    for n in (4, 5, 6):  # newer changelogs while the upload lags
        ms.append(_batch(store, tmp_path, opts, ms[-1], n, model))
        assert ms[-1].materialization == MaterializationRef(1, "a0")
        assert ms[-1].pending_materialization == MaterializationRef(3, "a0")
        assert restore_durable(store, ms[-1], opts) == model
    background.run_all()  # the materialization of batch 3 completes now
    model6 = {cf: dict(d) for cf, d in model.items()}
    m7 = _batch(store, tmp_path, opts, ms[-1], 7, model)
    assert m7.materialization == MaterializationRef(3, "a0")
    assert [f.name for f in m7.changelog_files] == [changelog_name(n) for n in (4, 5, 6, 7)]
    assert restore_durable(store, m7, opts) == model
    # a restore of an older checkpoint still replays from the old materialization
    assert restore_durable(store, ms[-1], opts) == model6
    assert m7.metrics["changelog"]["adoption"] == "adopted"


# --- manifest, lineage and registry -------------------------------------------------------


def test_manifest_round_trips_changelog_fields(tmp_path: Path, background: Background) -> None:
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = options()
    model: Model = {}
    m1 = _batch(store, tmp_path, opts, None, 1, model)
    assert m1.mode == "changelog" and m1.db_files == () and m1.materialized_id is None
    assert read_manifest(store.child(OP), m1.path) == m1
    assert PartitionManifest.from_json(m1.to_json()) == m1
    background.run_all()
    mat = read_manifest(store.child(OP), MaterializationRef(1, "a0").path(0))
    assert mat.mode == "materialization" and mat.path.endswith(MATERIALIZED_NAME)
    assert all(f.path.startswith("chk-1/p0/a0/m-") for f in mat.files)
    m2 = _batch(store, tmp_path, opts, m1, 2, model)
    assert m2.materialized_id == 1 and {f.path for f in m2.db_files} == \
        {f.path for f in mat.files}
    assert not any(f.uploaded for f in m2.db_files)
    assert [f.uploaded for f in m2.changelog_files] == [True]


def test_lineage_of_an_incremental_manifest_is_its_own_materialization(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    model: Model = {}
    inc = _batch(store, tmp_path, StateBackendOptions(checkpoint_mode="incremental"), None,
                 1, model)
    lin = Lineage.of(inc)
    assert lin.materialization == MaterializationRef(1, "a0") and lin.changelogs == ()
    assert not materialization_due(lin, 2, 10, interval=5, ratio=0.5)
    assert materialization_due(lin, 6, 10, interval=5, ratio=0.5)
    assert materialization_due(Lineage.of(None), 1, 0, interval=5, ratio=0.5)
    # materialize_inline_ratio: every batch, unless one is pending
    assert materialization_due(lin, 2, 10, interval=5, ratio=0.5, inline_ratio=2.0)
    assert not materialization_due(replace(lin, pending=MaterializationRef(2, "a0")), 3, 10,
                                   interval=5, ratio=0.5, inline_ratio=2.0)
    # switching modes both ways keeps the state
    m2 = _batch(store, tmp_path, options(), inc, 2, model)
    assert m2.materialization == MaterializationRef(1, "a0")
    assert restore_durable(store, m2, options()) == model
    m3 = _batch(store, tmp_path, StateBackendOptions(checkpoint_mode="incremental"), m2, 3,
                model)
    assert m3.mode == "incremental" and restore_durable(store, m3, options()) == model


def test_registry_counts_changelogs_and_bounds_sweeps_below_pending() -> None:
    def reg_cp(n: int, files: list[str], pending: set[int]) -> RegisteredCheckpoint:
        rec = CompletedCheckpoint(OP, n, 1, 8, {0: f"chk-{n}/p0/a/_MANIFEST.json"})
        return RegisteredCheckpoint(rec, frozenset(files) | {rec.manifests[0]},
                                    frozenset(pending))

    c = [f"chk-{n}/p0/a/{changelog_name(n)}" for n in range(6)]
    reg = SharedStateRegistry(2)
    reg = reg.register(reg_cp(1, c[1:2], {1})).register(reg_cp(2, c[1:3], {1}))
    assert reg.refs[c[1]] == {1, 2} and reg.sweep_bound(2) == 1
    # batch 3 adopts the materialization of 1: changelogs 1 drops out of the references
    # (checkpoint 2, still retained, names 1 as pending: adopted now, its files referenced)
    reg = reg.register(reg_cp(3, ["chk-1/p0/a/m-000009.sst", c[2], c[3]], set()))
    assert reg.sweep_bound(3) == 3 and reg.is_referenced("chk-1/p0/a/m-000009.sst")
    # batch 4 starts another materialization: sweeps stay below it
    reg = reg.register(reg_cp(4, ["chk-1/p0/a/m-000009.sst", c[2], c[3], c[4]], {4}))
    assert reg.sweep_bound(4) == 4 and reg.sweep_bound(5) == 4 and c[1] not in reg.refs
    assert c[1] in reg.unreferenced_paths(2)


def test_coordinator_deletes_subsumed_changelogs_and_keeps_pending_files(
        tmp_path: Path, background: Background) -> None:
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = options(materialize_interval=3)
    coord = CheckpointCoordinator(store, OP, 1, 128, num_retained=1)
    model: Model = {}
    ms: list[PartitionManifest] = []
    ostore = store.child(OP)
    for n in range(1, 9):
        ms.append(_batch(store, tmp_path, opts, ms[-1] if ms else None, n, model))
        assert coord.try_complete(n) is not None
        coord.collect_garbage()
        pending = ms[-1].pending_materialization
        if pending is not None:
            # a queued upload writes under chk-<j>/ after sweeps passed it: nothing lost
            assert coord.registry.sweep_bound(n) <= pending.checkpoint_id
        if n in (2, 3, 6):
            background.run_all()
        for f in ms[-1].files:
            assert ostore.exists(f.path), f.path
        # the manifest of the materialization in use stays as long as its files
        if ms[-1].materialization is not None:
            assert ostore.exists(ms[-1].materialization.path(0))
        assert restore_durable(store, ms[-1], opts) == model
    live = {f.path for f in ms[-1].files}
    # changelogs subsumed by materializations are gone
    assert not ostore.exists(f"chk-1/p0/a0/{changelog_name(1)}")
    assert {p for p in live if changelog_name(1) in p} == set()
    wait_for_materializations()
