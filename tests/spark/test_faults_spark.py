"""Fault injection against small streaming queries (marker ``faults``).

Each fault ends either with output and state identical to a failure-free reference, or
with a clear typed error while every committed checkpoint stays intact (and the query
then continues correctly once the fault is repaired). Where a task failed, the restore
report shows partition-level failover: only the failed partition restored from a
fallback source, the others kept their working directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import time

import fault_procs as F
import pandas as pd
import pytest
from harness import check_batches, random_batches, running_counts, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.restart import ExponentialDelay, ManualClock
from statebackend.storage.manifests import read_manifest
from statebackend.supervisor import restore_counts, restore_report

pytestmark = [pytest.mark.spark, pytest.mark.faults]

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"
OP = "counts"
log = logging.getLogger("statebackend.tests.faults")


def batches(n: int, seed: int = 21) -> list[pd.DataFrame]:
    return random_batches(n, seed, rows=40, keys=8)


def reference(data: list[pd.DataFrame]) -> dict[int, pd.DataFrame]:
    """RunningCount's output per micro-batch in a failure-free run."""
    return running_counts(data)[0]


check = check_batches


def add_batch(in_dir: str, i: int, pdf: pd.DataFrame) -> None:
    write_batches(in_dir, [pdf], start=i)


def start(spark, in_dir: str, build, ck: str, out: dict[int, pd.DataFrame]):
    """Start the query (one file per micro-batch); each batch's sorted output lands in
    ``out`` only when the batch succeeds."""
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(in_dir)

    def collect(batch_df, batch_id):
        pdf = batch_df.toPandas()
        out[batch_id] = pdf.sort_values(list(pdf.columns)).reset_index(drop=True)

    return (build(df).writeStream.foreachBatch(collect).outputMode("update")
            .option("checkpointLocation", ck).trigger(availableNow=True).start())


def run(spark, in_dir, build, ck, out) -> None:
    start(spark, in_dir, build, ck, out).awaitTermination()


def spark_committed(ck: str) -> int | None:
    """The newest micro-batch in the commit log of Spark's checkpoint ``ck``."""
    d = os.path.join(ck, "commits")
    ids = [int(f) for f in os.listdir(d) if f.isdigit()] if os.path.isdir(d) else []
    return max(ids, default=None)


class Env:
    """One query's directories and backend."""

    def __init__(self, tmp_path, location: str | None = None,
                 storage_options: dict | None = None) -> None:
        self.tmp = tmp_path
        self.in_dir = str(tmp_path / "in")
        self.ck = str(tmp_path / "ck")
        self.state = str(tmp_path / "state")
        self.local = str(tmp_path / "local")
        self.backend = RocksDBStateBackend(
            location or self.state,
            StateBackendOptions(parallelism=2, local_dir=self.local),
            storage_options=storage_options)

    def build(self, proc):
        return lambda df: self.backend.transform_with_state(df.groupBy("k"), proc, OUT,
                                                            operator_id=OP)

    def completed(self) -> list[int]:
        # The listener completes checkpoints asynchronously (completion is idempotent);
        # Spark's commit log says which micro-batches it committed.
        self.backend.complete(OP, up_to=spark_committed(self.ck))
        return [c.checkpoint_id for c in self.backend.coordinator(OP).list_completed()]

    def durable_digest(self) -> dict[str, str]:
        """sha256 of every durable file of the operator (committed state's fingerprint)."""
        root = os.path.join(self.state, OP)
        out = {}
        for d, _dirs, files in os.walk(root):
            for f in files:
                p = os.path.join(d, f)
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
        return out


# a partition that never failed: its instance kept open in the worker that ran it
# ("resident"), handed over by that worker or, with keep_instances_open off, its working
# directory ("working_dir")
KEPT = {"resident", "working_dir"}


def report(env: Env, checkpoint_id: int) -> dict[str, int]:
    env.completed()
    rep = restore_report(env.backend, OP, checkpoint_id)
    counts = restore_counts(rep)
    log.warning("checkpoint %d restores: %s (%s)", checkpoint_id, counts,
                {p: r.source for p, r in rep.items()})
    return counts


# --- task-level faults: the query survives, only the failed partition falls back ----------


def test_python_worker_killed_mid_batch(spark, tmp_path):
    data = batches(3)
    env = Env(tmp_path)
    write_batches(env.in_dir, data)
    out: dict[int, pd.DataFrame] = {}
    run(spark, env.in_dir, env.build(F.ExitOnce()), env.ck, out)
    check(out, reference(data))
    assert env.completed() == [0, 1, 2]
    rep = restore_report(env.backend, OP, 1)
    # the killed worker had opened and written partition 0's working directory: its retry
    # must not trust it and restores from the verified local copy, downloading nothing;
    # partition 1 never failed and keeps its instance (in its worker, or handed over)
    assert rep[0].source == "local_copy" and rep[0].bytes_downloaded == 0
    assert rep[1].source in KEPT
    counts = report(env, 2)
    assert set(counts) <= KEPT and sum(counts.values()) == 2


def test_local_disk_full_while_keeping_the_local_copy(spark, tmp_path):
    data = batches(3, seed=5)
    env = Env(tmp_path)
    write_batches(env.in_dir, data)
    marker = str(tmp_path / "disk-full")
    open(marker, "w").close()
    out: dict[int, pd.DataFrame] = {}
    try:
        run(spark, env.in_dir, env.build(F.DiskFullOnce(marker)), env.ck, out)
    finally:
        os.remove(marker)
    # a secondary copy that cannot be kept never fails the checkpoint (invariant 7) ...
    check(out, reference(data))
    assert env.completed() == [0, 1, 2]
    # ... and the next batch of that partition, whose working directory could not be
    # marked clean, restores from the verified local copy (or continues with the instance
    # its worker kept open, which took exactly that checkpoint); the other is untouched
    rep = restore_report(env.backend, OP, 2)
    assert rep[0].source in ("local_copy", "resident") and rep[0].bytes_downloaded == 0
    assert rep[1].source in KEPT


def _env_retaining(tmp_path, num_retained: int, data) -> Env:
    env = Env(tmp_path)
    env.backend = RocksDBStateBackend(env.state, StateBackendOptions(
        parallelism=2, num_retained=num_retained, local_dir=env.local))
    write_batches(env.in_dir, data)
    return env


def _sink_fails_in_batch_1(spark, env: Env, out: dict[int, pd.DataFrame]) -> None:
    """Run the running count until its sink fails in micro-batch 1, after the operator ran
    there (every partition published): Spark does not commit the micro-batch."""
    failed = env.tmp / "sink-failed"

    def failing_sink(batch_df, batch_id):
        pdf = batch_df.toPandas()  # runs the operator: every partition publishes
        if batch_id == 1 and not os.path.exists(failed):
            open(failed, "w").close()
            raise RuntimeError("injected sink failure")
        out[batch_id] = pdf.sort_values(list(pdf.columns)).reset_index(drop=True)

    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(env.in_dir)
    q = (env.build(F.RunningCount())(df).writeStream.foreachBatch(failing_sink)
         .outputMode("update").option("checkpointLocation", env.ck)
         .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="injected sink failure"):
        q.awaitTermination()
    assert sorted(out) == [0] and spark_committed(env.ck) == 0
    env.backend.complete(OP)  # what the query's end and the restart's planning do


@pytest.mark.parametrize("num_retained", [1, 2])
def test_sink_fails_after_every_partition_published(spark, tmp_path, num_retained):
    # Spark runs micro-batch 1 again after the restart, from the state of batch 0. The
    # query's end (and the restart's planning) completes checkpoint 1 from what was
    # published, without knowing that Spark did not commit it; with num_retained=1 that
    # completion must not let retention delete checkpoint 0.
    data = batches(3, seed=29)
    env = _env_retaining(tmp_path, num_retained, data)
    out: dict[int, pd.DataFrame] = {}
    _sink_fails_in_batch_1(spark, env, out)
    coord = env.backend.coordinator(OP)
    assert env.completed() == [0, 1]  # 0 is kept: Spark may run micro-batch 1 again
    assert not coord.get(1).committed and coord.get(0).committed

    run(spark, env.in_dir, env.build(F.RunningCount()), env.ck, out)
    check(out, reference(data))
    # Spark committed every micro-batch now: once told so, retention is num_retained again
    assert spark_committed(env.ck) == 2
    assert env.completed() == ([2] if num_retained == 1 else [1, 2])
    assert coord.get(2).committed


def test_another_querys_progress_does_not_commit_a_failed_micro_batch(spark, tmp_path):
    # Query B's sink fails in micro-batch 1 (checkpoint 1 is completed without Spark's
    # commit); query A, on another backend in the same session, then runs micro-batches
    # 0..2. A's progress events must not tell B's backend that Spark committed its
    # micro-batch 1 (num_retained=1 would then delete checkpoint 0, which B's rerun of
    # micro-batch 1 starts from).
    data = batches(3, seed=37)
    a, b = (_env_retaining(tmp_path / name, 1, data) for name in ("a", "b"))
    out_b: dict[int, pd.DataFrame] = {}
    _sink_fails_in_batch_1(spark, b, out_b)
    coord = b.backend.coordinator(OP)
    assert not coord.get(1).committed

    out_a: dict[int, pd.DataFrame] = {}
    run(spark, a.in_dir, a.build(F.RunningCount()), a.ck, out_a)
    check(out_a, reference(data))
    a_coord = a.backend.coordinator(OP)
    deadline = time.monotonic() + 60  # A's listener events are asynchronous
    while not (a_coord.latest() and a_coord.latest().checkpoint_id == 2
               and a_coord.latest().committed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert a_coord.latest().committed  # A's own progress marked A's checkpoints
    assert [c.checkpoint_id for c in coord.list_completed()] == [0, 1]
    assert not coord.get(1).committed

    run(spark, b.in_dir, b.build(F.RunningCount()), b.ck, out_b)
    check(out_b, reference(data))


# --- durable-storage faults: a typed error, committed state intact, then recovery --------


def _stream_two_then_break(spark, env: Env, data) -> dict[int, pd.DataFrame]:
    write_batches(env.in_dir, data[:2])
    out: dict[int, pd.DataFrame] = {}
    run(spark, env.in_dir, env.build(F.RunningCount()), env.ck, out)
    assert env.completed() == [0, 1]
    add_batch(env.in_dir, 2, data[2])
    return out


def _partition0_manifest(env: Env, checkpoint_id: int):
    coord = env.backend.coordinator(OP)
    path = coord.get(checkpoint_id).manifests[0]
    return path, read_manifest(coord.store, path, operator_id=OP)


@pytest.mark.parametrize("fault", ["corrupt_sst", "truncated_manifest"])
def test_corrupt_durable_state_fails_typed_and_leaves_committed_state_intact(
        spark, tmp_path, fault):
    data = batches(3, seed=9)
    env = Env(tmp_path)
    out = _stream_two_then_break(spark, env, data)
    op_root = os.path.join(env.state, OP)
    if fault == "corrupt_sst":
        _path, manifest = _partition0_manifest(env, 1)
        sst = next(f for f in manifest.files if f.name.endswith(".sst"))
        victim = os.path.join(op_root, sst.path)
        # the local copy is gone (new machine), so durable storage is the only source
        shutil.rmtree(env.local)
    else:
        path, _manifest = _partition0_manifest(env, 1)
        victim = os.path.join(op_root, path)
    with open(victim, "rb") as fh:
        original = fh.read()
    with open(victim, "wb") as fh:
        if fault == "corrupt_sst":  # same size, flipped bytes: only the checksum can tell
            fh.write(original[:100] + bytes(b ^ 0xFF for b in original[100:200])
                     + original[200:])
        else:
            fh.write(original[: len(original) // 2])
    before = env.durable_digest()

    with pytest.raises(Exception, match="CorruptStateError") as info:
        run(spark, env.in_dir, env.build(F.RunningCount()), env.ck, out)
    text = str(info.value)
    assert ("partition 0" in text) if fault == "corrupt_sst" else ("truncated or malformed" in text)
    # nothing committed was changed or removed, and nothing new was completed
    after = env.durable_digest()
    assert {p: d for p, d in after.items() if p in before} == before
    assert env.completed() == [0, 1]
    assert 2 not in out

    # repaired, the query continues from the committed state with exactly-once output
    with open(victim, "wb") as fh:
        fh.write(original)
    run(spark, env.in_dir, env.build(F.RunningCount()), env.ck, out)
    check(out, reference(data))
    if fault == "corrupt_sst":
        env.completed()
        assert restore_report(env.backend, OP, 2)[0].source == "durable"


def test_storage_outage_during_upload(spark, tmp_path):
    data = batches(3, seed=13)
    marker = str(tmp_path / "outage")
    env = Env(tmp_path, location="sbfaulty://" + str(tmp_path / "state"),
              storage_options={"outage_marker": marker})
    write_batches(env.in_dir, data)
    out: dict[int, pd.DataFrame] = {}
    open(marker, "w").close()  # SST uploads of checkpoint 1 fail while this exists
    with pytest.raises(Exception, match="StorageError") as info:
        run(spark, env.in_dir, env.build(F.Counting()), env.ck, out)
    assert "injected fault" in str(info.value)
    assert env.completed() == [0] and sorted(out) == [0]
    committed = env.durable_digest()
    os.remove(marker)  # the outage ends; the query is started again
    run(spark, env.in_dir, env.build(F.Counting()), env.ck, out)
    check(out, reference(data))
    assert env.completed() == [0, 1, 2]
    after = env.durable_digest()
    changed = [p for p, d in committed.items()
               if p.startswith(("chk-0/", "_checkpoints/chk-0")) and after.get(p) != d]
    assert changed == []


# --- a supervised query restarted after whole-query failures -------------------------------


def test_supervised_query_survives_three_failures_under_exponential_delay(spark, tmp_path):
    data = batches(4, seed=17)
    env = Env(tmp_path)
    write_batches(env.in_dir, data)
    out: dict[int, pd.DataFrame] = {}
    plan = iter([1, 2, 3, None])  # start i fails in micro-batch plan[i]

    def start_query():
        return start(spark, env.in_dir, env.build(F.FailQueryAt(next(plan))), env.ck, out)

    clock = ManualClock()
    strategy = ExponentialDelay(1.0, 60.0, 2.0, 0.1, 3600.0, rng=random.Random(5))
    result = env.backend.supervise(start_query, strategy, clock=clock)

    check(out, reference(data))
    assert result.starts == 4 and len(result.failures) == 3
    for i, (f, backoff) in enumerate(zip(result.failures, (1.0, 2.0, 4.0))):
        assert "injected query failure in micro-batch" in str(f.error)
        assert f.decision.restart and backoff * 0.9 <= f.decision.delay_s <= backoff * 1.1
        # each restart continued from the batch before the failed one
        assert f.last_completed == {OP: i}
    assert clock.sleeps == [f.decision.delay_s for f in result.failures]
    assert env.completed() == [1, 2, 3]  # num_retained=3
    for b in (1, 2, 3):  # the batches re-run after a query failure
        counts = report(env, b)
        assert sum(counts.values()) == 2 and "empty" not in counts
