"""One writer per state location, on Spark: a second query started on the location of a
running one is refused at its start, and the running one goes on undisturbed; a restart of
the same query takes the location over."""

from __future__ import annotations

import os

import fault_procs as F
import pandas as pd
import pytest
from harness import check_batches, random_batches, running_counts, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.checkpoint.fencing import latest_writer, list_epochs
from statebackend.restore.carry import manifests_at
from statebackend.storage import open_store, read_manifest

pytestmark = [pytest.mark.spark, pytest.mark.faults]

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"
OP = "counts"


def query(spark, backend, in_dir: str, ck: str, out: dict[int, pd.DataFrame], name: str,
          available_now: bool = False):
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(in_dir)

    def collect(batch_df, batch_id):
        pdf = batch_df.toPandas()
        out[batch_id] = pdf.sort_values(list(pdf.columns)).reset_index(drop=True)

    w = (backend.transform_with_state(df.groupBy("k"), F.RunningCount(), OUT, operator_id=OP)
         .writeStream.foreachBatch(collect).outputMode("update").queryName(name)
         .option("checkpointLocation", ck))
    return (w.trigger(availableNow=True) if available_now else w).start()


def backend(state: str, local: str) -> RocksDBStateBackend:
    return RocksDBStateBackend(state, StateBackendOptions(parallelism=2, local_dir=local))


def test_a_second_query_on_a_running_querys_location_is_refused(spark, tmp_path):
    state = str(tmp_path / "state")
    data = random_batches(4, 31, rows=40, keys=8)
    in_a, in_b = str(tmp_path / "in-a"), str(tmp_path / "in-b")
    write_batches(in_a, data[:2])
    write_batches(in_b, data[:1])
    out_a: dict[int, pd.DataFrame] = {}
    a = query(spark, backend(state, str(tmp_path / "local-a")), in_a, str(tmp_path / "ck-a"),
              out_a, "owner")
    try:
        a.processAllAvailable()
        ostore = open_store(state).child(OP)
        owner = latest_writer(ostore)
        assert owner is not None and owner.query_id == str(a.id)
        # what the owner's tasks publish names its query too
        for rel in manifests_at(ostore, 0).values():
            assert all(read_manifest(ostore, r).writer_query == str(a.id) for r in rel)
        # the same state URL configured by mistake for another query (its own Spark
        # checkpoint, so another query id), while the owner runs
        out_b: dict[int, pd.DataFrame] = {}
        b = query(spark, backend(state, str(tmp_path / "local-b")), in_b,
                  str(tmp_path / "ck-b"), out_b, "intruder", available_now=True)
        with pytest.raises(Exception, match="StateLocationInUseError") as info:
            b.awaitTermination()
        assert str(a.id) in str(info.value) and "another streaming query" in str(info.value)
        assert out_b == {}
        assert list_epochs(ostore) == [owner.epoch]  # it took nothing
        # the owner runs on, exactly once, with the batches that arrive meanwhile
        assert a.isActive
        write_batches(in_a, data[2:], start=2)
        a.processAllAvailable()
    finally:
        a.stop()
    check_batches(out_a, running_counts(data)[0])


def test_a_restart_of_the_same_query_takes_the_location_over(spark, tmp_path):
    state, ck = str(tmp_path / "state"), str(tmp_path / "ck")
    data = random_batches(4, 37, rows=40, keys=8)
    in_dir = str(tmp_path / "in")
    write_batches(in_dir, data[:2])
    out: dict[int, pd.DataFrame] = {}
    first = query(spark, backend(state, str(tmp_path / "local")), in_dir, ck, out, "q1",
                  available_now=True)
    first.awaitTermination()
    write_batches(in_dir, data[2:], start=2)
    # a new driver (another backend object, another local dir) restarts the query from
    # its Spark checkpoint: same query id, new run id
    again = query(spark, backend(state, str(tmp_path / "local-2")), in_dir, ck, out, "q1",
                  available_now=True)
    again.awaitTermination()
    ostore = open_store(state).child(OP)
    epochs = list_epochs(ostore)
    assert epochs == [1, 2]
    newest = latest_writer(ostore)
    assert newest.query_id == str(first.id) == str(again.id)
    assert newest.run_id == str(again.runId) != str(first.runId)
    check_batches(out, running_counts(data)[0])
    assert os.path.isdir(os.path.join(state, OP, "_writers"))


def test_without_writer_files_a_second_query_is_refused_by_the_records_and_deletes_nothing(
        spark, tmp_path):
    """Issue 34: ``_writers/`` lost (a lifecycle rule, a partial copy) while the owner runs;
    another query (keeping fewer checkpoints) is refused by what the records say, its
    coordinator completes and deletes nothing, and the owner runs on exactly once."""
    import shutil

    from statebackend.storage.records import completed_ids
    from statebackend.verify import verify_checkpoints

    state = str(tmp_path / "state")
    data = random_batches(4, 41, rows=40, keys=8)
    in_a, in_b = str(tmp_path / "in-a"), str(tmp_path / "in-b")
    write_batches(in_a, data[:2])
    write_batches(in_b, data[:1])
    out_a: dict[int, pd.DataFrame] = {}
    owner_backend = backend(state, str(tmp_path / "local-a"))
    a = query(spark, owner_backend, in_a, str(tmp_path / "ck-a"), out_a, "owner34")
    ostore = open_store(state).child(OP)
    try:
        a.processAllAvailable()
        owner_backend.complete(OP, up_to=1)  # the listener's work, done now, not racing
        assert completed_ids(ostore) == [0, 1]
        shutil.rmtree(os.path.join(state, OP, "_writers"))
        intruder = RocksDBStateBackend(state, StateBackendOptions(
            parallelism=2, num_retained=1, local_dir=str(tmp_path / "local-b")))
        out_b: dict[int, pd.DataFrame] = {}
        b = query(spark, intruder, in_b, str(tmp_path / "ck-b"), out_b, "intruder34",
                  available_now=True)
        with pytest.raises(Exception, match="StateLocationInUseError") as info:
            b.awaitTermination()
        assert str(a.id) in str(info.value)
        assert out_b == {}
        assert list_epochs(ostore) == []  # it took no epoch
        # its coordinator kept the owner's retention (3), not its own (1)
        intruder.complete(OP)
        assert completed_ids(ostore) == [0, 1]
        problems, _, _ = verify_checkpoints(open_store(state), OP)
        assert [p for p in problems if not p.path.startswith("_writers/")] == []
        # the owner runs on, exactly once (its tasks write their epoch file again)
        write_batches(in_a, data[2:], start=2)
        a.processAllAvailable()
        assert a.isActive
    finally:
        a.stop()
    check_batches(out_a, running_counts(data)[0])
    assert list_epochs(ostore) == [1]
