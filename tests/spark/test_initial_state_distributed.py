"""A distributed initial state: the initial-state DataFrame reaches our partitions by key
group through the executors (staged in durable storage), never through the driver, and
applies on the query's first run only, as Spark's."""

from __future__ import annotations

import pandas as pd
import processors as P
import pytest
from harness import run_stream, watch_driver, write_batches
from pyspark.sql import functions as F

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.errors import OptionsError
from statebackend.task.initial_state import STAGE_DIR

pytestmark = pytest.mark.spark

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"
N_INIT = 20_000


def _batch(keys: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"k": keys, "x": [1] * len(keys), "ts": pd.Timestamp("2026-01-01")})


@pytest.fixture
def backend(tmp_path) -> RocksDBStateBackend:
    # the shuffle plan runs every partition in every micro-batch, as Spark applies the
    # initial state of every key in batch 0; under the carrier a partition without input
    # applies its share at its first run (README "Known differences")
    return RocksDBStateBackend(str(tmp_path / "state"), StateBackendOptions(
        parallelism=2, local_dir=str(tmp_path / "local"), placement="shuffle"))


def _init(spark):
    # made by Spark, not by this process: key<i> starts at 1000 + i
    return (spark.range(N_INIT)
            .select(F.concat(F.lit("key"), F.col("id").cast("string")).alias("k"),
                    (F.col("id") + 1000).alias("init")))


def test_initial_state_never_reaches_the_driver(spark, tmp_path, backend, monkeypatch):
    input_dir = str(tmp_path / "input")
    write_batches(input_dir, [_batch(["key1", "key7", "key7", "new"]), _batch(["key1", "key19999"])])
    init = _init(spark)
    collected: list[int] = []
    with monkeypatch.context() as m:
        watch_driver(m, type(init), collected)
        stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(input_dir)
        out = backend.transform_with_state(stream.groupBy("k"), P.InitialCount(), OUT, "Update",
                                           "None", initialState=init.groupBy("k"), operator_id="ic")
    # what the driver received while planning: one row per partition naming a staged file
    assert 0 < sum(collected) <= 2
    got: dict[int, pd.DataFrame] = {}

    def sink(batch_df, batch_id):
        got[batch_id] = batch_df.toPandas().sort_values("k").reset_index(drop=True)

    q = (out.writeStream.foreachBatch(sink).outputMode("update")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert got[0].to_dict("list") == {"k": ["key1", "key7", "new"], "v": [1002, 1009, 1]}
    assert got[1].to_dict("list") == {"k": ["key1", "key19999"], "v": [1003, 20_999 + 1]}
    # every initial key got its state, in the partition that owns it
    backend.complete("ic")
    counts = backend.read_state(spark, "ic", state_name="count")
    assert counts.count() == N_INIT + 1


def test_initial_state_applies_on_the_first_run_only(spark, tmp_path, backend):
    input_dir = str(tmp_path / "input")
    write_batches(input_dir, [_batch(["key1"])])
    init = spark.createDataFrame(pd.DataFrame({"k": ["key1", "key2"], "init": [100, 200]}))
    ck = str(tmp_path / "ck")

    def build(df):
        return backend.transform_with_state(df.groupBy("k"), P.InitialCount(), OUT, "Update",
                                            "None", initialState=init.groupBy("k"),
                                            operator_id="once")

    first = run_stream(spark, input_dir, SCHEMA, build, ck)
    assert first[0].to_dict("list") == {"k": ["key1"], "v": [101]}
    # once a checkpoint is complete, the owner's collection deletes the staged files
    assert _staged(backend, tmp_path) == []
    # the restarted query (same checkpoint) keeps its state and stages nothing again
    write_batches(input_dir, [_batch(["key1", "key2"])], start=1)
    second = run_stream(spark, input_dir, SCHEMA, build, ck)
    assert second[1].to_dict("list") == {"k": ["key1", "key2"], "v": [102, 201]}
    assert _staged(backend, tmp_path) == []


def _staged(backend, tmp_path) -> list[str]:
    """Files under the operator's staging directory, once the query's last micro-batch is
    complete and the collection that follows a completion has run."""
    backend.complete("once")
    backend.coordinator("once").wait_for_gc()
    root = tmp_path / "state" / "once" / STAGE_DIR
    return [str(p) for p in root.rglob("*") if p.is_file()]


def test_initial_state_key_types_must_match(spark, tmp_path, backend):
    stream = spark.readStream.schema(SCHEMA).parquet(str(tmp_path))
    init = spark.range(3).select(F.col("id").alias("k"), F.lit(1).alias("init"))
    with pytest.raises(OptionsError, match="grouped by \\['k'\\] of types \\['bigint'\\]"):
        backend.transform_with_state(stream.groupBy("k"), P.InitialCount(), OUT, "Update", "None",
                                     initialState=init.groupBy("k"), operator_id="types")
