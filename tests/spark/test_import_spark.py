"""The one-step move from Spark's own state store (issue 35 item 4): a stopped Spark
``transformWithStateInPandas`` query's state, read through Spark's ``statestore`` source,
becomes a savepoint of ours; the query started on our backend from it gives Spark's answers
in every following micro-batch (Spark's own query continuing from its checkpoint is the
reference), and ``read_state`` of the savepoint equals Spark's export entry by entry,
expiries included."""

from __future__ import annotations

import json
import os

import import_procs as IP
import pandas as pd
import pytest
from harness import assert_same, run_stream, watch_driver, write_batches
from pyspark.sql import DataFrame

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.cli import main
from statebackend.errors import CheckpointNotFoundError, MoveRefusedError, StorageError

pytestmark = pytest.mark.spark

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"


@pytest.fixture(scope="module")
def stopped(spark_no_data, tmp_path_factory):
    """A Spark query that ran three micro-batches on Spark's own operator and stopped (the
    first test continues it for three more: later tests read its state at either point)."""
    d = tmp_path_factory.mktemp("import-spark")
    write_batches(str(d / "in"), IP.BEFORE)
    out = run_stream(spark_no_data, str(d / "in"), SCHEMA, IP.spark_query, str(d / "spark-ck"))
    assert len(out) == 3
    return d


def test_a_spark_query_moves_in_one_step_and_continues_with_sparks_answers(
        spark_no_data, stopped, tmp_path, monkeypatch):
    spark = spark_no_data
    ck = str(stopped / "spark-ck")
    backend = RocksDBStateBackend(str(tmp_path / "state"), StateBackendOptions(
        parallelism=3, local_dir=str(tmp_path / "local")))
    collected: list[int] = []
    with monkeypatch.context() as m:
        watch_driver(m, DataFrame, collected)
        step = backend.import_spark_state(spark, ck, "every")
    # the driver saw Spark's operator metadata (one row) and one row per partition
    assert sum(collected) <= 1 + 3, collected
    theirs_export = IP.spark_export(spark, ck)
    keys = {k for b in IP.BEFORE for k in b["k"]}
    # one row per key of a value and of a list (lists unflattened), one per map entry
    assert step.rows["cnt"] == step.rows["hist"] == len(keys) == 7
    assert step.rows["tags"] == len(theirs_export["tags"]) > len(keys)
    assert step.rows["$timers"] > len(keys)
    # read_state of the savepoint = Spark's export, expiries included; lists in order
    ours_export = IP.ours_export(backend, spark, "every", step.savepoint)
    IP.assert_same_exports(ours_export, theirs_export)

    # Spark's query continues from its own checkpoint: the reference
    write_batches(str(stopped / "in"), IP.AFTER, start=3)
    theirs = run_stream(spark, str(stopped / "in"), SCHEMA, IP.spark_query, ck)
    assert sorted(theirs) == [3, 4, 5]
    # ours starts from the savepoint with a new Spark checkpoint and the source positioned
    # where Spark's stopped (here: a directory of the later files)
    write_batches(str(tmp_path / "in"), IP.AFTER)
    moved = RocksDBStateBackend(backend.checkpoint_location, StateBackendOptions(
        parallelism=3, local_dir=str(tmp_path / "local")), from_savepoint=step.savepoint)
    ours = run_stream(spark, str(tmp_path / "in"), SCHEMA,
                      lambda df: moved.transform_with_state(
                          df.groupBy("k"), IP.EveryState(), IP.OUT, "Update", "ProcessingTime",
                          operator_id="every"), str(tmp_path / "ck"))
    assert_same({b + 3: v for b, v in ours.items()}, theirs)
    # the imported timers are the processor's: every key's count of them carried over
    assert (theirs[3]["timers"] > 1).any()


def test_an_imported_expiry_in_the_past_is_expired_for_ours(tmp_path):
    """TTL is Spark's: a value whose recorded expiry has passed is gone for the processor,
    one still ahead lives (the task's replay, without Spark)."""
    import pyarrow as pa
    from pyspark.sql.types import LongType, StructField, StructType

    from statebackend.keys.grouping_key import encode_grouping_key
    from statebackend.keys.groups import key_group
    from statebackend.rocksdb.instance import RocksDBInstance
    from statebackend.state.backend import KeyedStateBackend
    from statebackend.task.import_spark import VAR, ImportPlan, StateVariable, _replay

    var = StateVariable("cnt", "value", StructType([StructField("n", LongType())]), None, True)
    plan = ImportPlan(str(tmp_path), {}, "op", "_savepoints/x", ("k",), ("string",), (var,),
                      1, 8)
    future = 4_102_444_800_000
    batch = pa.RecordBatch.from_pylist([
        {"k": "old", VAR: 0, "__sb_v0": {"value": {"n": 1}, "ttlExpirationMs": 1_000}},
        {"k": "new", VAR: 0, "__sb_v0": {"value": {"n": 2}, "ttlExpirationMs": future}}])
    inst = RocksDBInstance(str(tmp_path / "db"))
    rows, _states = _replay(inst, iter([batch]), plan, 0)
    assert rows == {0: 2}
    kb = KeyedStateBackend(inst)
    cnt = kb.value_state("cnt", "n BIGINT", ttl_ms=60_000)

    def key(k: str) -> bytes:
        return encode_grouping_key((k,), ("string",), key_group((k,), ("string",), 8))

    kb.set_current_key(key("old"))
    assert cnt.get() is None
    kb.set_current_key(key("new"))
    assert tuple(cnt.get()) == (2,)
    kb.close()
    inst.close()


def test_files_of_attempts_spark_did_not_keep_are_not_left_behind(spark_no_data, stopped,
                                                                 tmp_path, monkeypatch):
    """A retried or speculative task's data file (named by its attempt) is deleted before
    the savepoint's manifest is published: the directory holds what the manifest names."""
    import statebackend.spark.import_spark as driver

    real = driver._write_files

    def with_a_lost_attempt(op_store, plan, placed):
        written = real(op_store, plan, placed)
        op_store.put_bytes_atomic(f"{plan.savepoint_dir}/part-00000-00009-t9-a0-lost.sbsp",
                                  b"an attempt Spark did not keep")
        return written

    monkeypatch.setattr(driver, "_write_files", with_a_lost_attempt)
    backend = RocksDBStateBackend(str(tmp_path / "state"), StateBackendOptions(parallelism=2))
    step = backend.import_spark_state(spark_no_data, str(stopped / "spark-ck"), "every")
    sp_dir = tmp_path / "state" / "every" / "_savepoints" / step.savepoint
    manifest = json.loads((sp_dir / "_SAVEPOINT.json").read_text())
    assert len(manifest["files"]) == 2
    assert sorted(p.name for p in sp_dir.iterdir()) == sorted([*manifest["files"],
                                                               "_SAVEPOINT.json"])


def test_a_failed_import_leaves_no_half_written_savepoint(spark_no_data, stopped, tmp_path,
                                                          monkeypatch):
    """The data files are written, then the import fails before its manifest: nothing is
    left under the savepoint's directory, and the same name can be imported again."""
    import statebackend.spark.import_spark as driver

    real = driver._manifest

    def storage_fails(*a, **k):
        raise StorageError("the store went away before the manifest")

    monkeypatch.setattr(driver, "_manifest", storage_fails)
    backend = RocksDBStateBackend(str(tmp_path / "state"), StateBackendOptions(parallelism=2))
    with pytest.raises(StorageError, match="went away"):
        backend.import_spark_state(spark_no_data, str(stopped / "spark-ck"), "every")
    sp_dir = tmp_path / "state" / "every" / "_savepoints" / "from-spark"
    assert not sp_dir.exists() or [p for p in sp_dir.rglob("*") if p.is_file()] == []
    monkeypatch.setattr(driver, "_manifest", real)
    step = backend.import_spark_state(spark_no_data, str(stopped / "spark-ck"), "every")
    # as many values as Spark holds (the first test continued Spark's query: 10 keys then)
    held = spark_no_data.read.format("statestore").option("stateVarName", "cnt").load(
        str(stopped / "spark-ck")).count()
    assert (sp_dir / "_SAVEPOINT.json").exists() and step.rows["cnt"] == held >= 7


def test_refusals_name_the_cause_and_write_nothing(spark_no_data, stopped, tmp_path):
    spark = spark_no_data
    ck = str(stopped / "spark-ck")
    loc = str(tmp_path / "state")
    backend = RocksDBStateBackend(loc, StateBackendOptions(parallelism=2))
    with pytest.raises(CheckpointNotFoundError, match="no stateful operator 4"):
        backend.import_spark_state(spark, ck, "every", spark_operator_id=4)
    with pytest.raises(CheckpointNotFoundError, match="holds no stateful operator"):
        backend.import_spark_state(spark, str(tmp_path / "nothing"), "every")
    assert not os.path.exists(loc) or not os.listdir(loc)
    backend.import_spark_state(spark, ck, "every", name="first")
    with pytest.raises(StorageError, match="already exists"):
        backend.import_spark_state(spark, ck, "every", name="first")

    # an applyInPandasWithState query's state is not transformWithState state
    def count(key, frames, state):
        yield pd.DataFrame({"k": [key[0]], "n": [sum(len(f) for f in frames)]})

    other = tmp_path / "apply"
    write_batches(str(other / "in"), IP.BEFORE[:1])
    run_stream(spark, str(other / "in"), SCHEMA, lambda df: df.groupBy("k").applyInPandasWithState(
        count, "k STRING, n BIGINT", "n BIGINT", "Update", "NoTimeout"), str(other / "ck"))
    with pytest.raises(MoveRefusedError, match="not a transformWithState operator"):
        backend.import_spark_state(spark, str(other / "ck"), "apply")
    assert not os.path.exists(os.path.join(loc, "apply"))


def test_the_cli_imports_and_refuses_with_its_exit_codes(spark_no_data, stopped, tmp_path,
                                                         capsys):
    ck = str(stopped / "spark-ck")
    loc = str(tmp_path / "state")
    assert main(["import-spark", loc, "every", "--from", ck, "--parallelism", "2",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["savepoint"] == doc["from_savepoint"] == "from-spark"
    assert doc["rows"]["cnt"] > 0 and "from_savepoint='from-spark'" in doc["restart"]
    assert os.path.exists(os.path.join(loc, "every", "_savepoints", "from-spark",
                                       "_SAVEPOINT.json"))
    # the same name again: storage refuses to overwrite (4); no Spark state there (3)
    assert main(["import-spark", loc, "every", "--from", ck]) == 4
    assert main(["import-spark", loc, "other", "--from", str(tmp_path / "none")]) == 3
    with pytest.raises(SystemExit) as bad:
        main(["import-spark", loc, "every", "--from", ck, "--spark-operator-id", "-1"])
    assert bad.value.code == 2
