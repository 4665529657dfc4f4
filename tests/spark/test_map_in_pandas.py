"""map_in_pandas: batch-at-a-time keyed state, checked against a pandas reference."""

from __future__ import annotations

import pandas as pd
import processors as P
import pytest
from harness import check_batches, random_batches, run_stream, running_counts, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = pytest.mark.spark


def make_backend(tmp_path) -> RocksDBStateBackend:
    return RocksDBStateBackend(str(tmp_path / "state"),
                               StateBackendOptions(parallelism=2, local_dir=str(tmp_path / "local")))


def test_vectorised_running_count_equals_pandas_reference(spark, tmp_path):
    data = random_batches(4, seed=29, rows=80, keys=25)
    write_batches(str(tmp_path / "in"), data)
    be = make_backend(tmp_path)
    ours = run_stream(spark, str(tmp_path / "in"), "k STRING, x BIGINT, ts TIMESTAMP",
                      lambda df: be.map_in_pandas(df, "k", P.vector_count, "k STRING, v BIGINT",
                                                  state_schema="c BIGINT", operator_id="vec"),
                      str(tmp_path / "ck"))
    check_batches(ours, running_counts(data)[0])
    be.complete("vec")
    assert be.coordinator("vec").latest().checkpoint_id == 3


def test_large_input_arrives_in_frames_of_frame_rows(spark, tmp_path):
    # Spark sends 8 rows per Arrow batch; with frame_rows=20 each task's ~40 rows reach the
    # function as frames of at least 20 rows (the last may be smaller), and the state read
    # by a later frame includes what earlier frames of the same batch wrote.
    data = random_batches(3, seed=41, rows=80, keys=25)
    write_batches(str(tmp_path / "in"), data)
    be = make_backend(tmp_path)
    conf = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(conf)
    spark.conf.set(conf, "8")
    try:
        ours = run_stream(spark, str(tmp_path / "in"), "k STRING, x BIGINT, ts TIMESTAMP",
                          lambda df: be.map_in_pandas(
                              df, "k", P.vector_count_frames,
                              "k STRING, v BIGINT, p INT, i INT, f INT", state_schema="c BIGINT",
                              operator_id="vec-frames", frame_rows=20),
                          str(tmp_path / "ck"))
    finally:
        spark.conf.set(conf, old)
    ref = running_counts(data)[0]
    several = 0
    for b, out in ours.items():
        per_task = out.groupby(["p", "i"])["f"].first().reset_index()
        for _, frames in per_task.groupby("p"):
            sizes = frames.sort_values("i")["f"].tolist()
            assert frames["i"].tolist() == sorted(frames["i"].tolist())
            assert all(n >= 20 for n in sizes[:-1]), sizes
            assert all(n < 20 + 8 for n in sizes), sizes  # handed over as soon as complete
            several += len(sizes) > 1
        assert sum(out.groupby(["p", "i"])["f"].first()) == len(data[b])
        # a key in two frames is output twice, its second count the batch's final one
        final = out.groupby("k")["v"].max().reset_index().sort_values(["k", "v"])
        check_batches({b: final.reset_index(drop=True)}, {b: ref[b]})
    assert several, "no task received more than one frame: the test did not test that"


@pytest.mark.parametrize("bad", [0, -5, 2.0, True, "10"])
def test_frame_rows_argument_is_checked(spark, tmp_path, bad):
    from statebackend.errors import OptionsError

    df = spark.createDataFrame([("a", 1)], "k STRING, x BIGINT")
    with pytest.raises(OptionsError, match="frame_rows"):
        make_backend(tmp_path).map_in_pandas(df, "k", P.vector_count, "k STRING, v BIGINT",
                                             frame_rows=bad)


def test_bigint_key_uses_sparks_key_groups(spark, tmp_path):
    # Non-string keys keep the key-group column Spark computes (pandas may hold them in
    # another form than Spark hashes); the task drops it before the user's code runs.
    import pyspark.sql.functions as F

    data = random_batches(4, seed=31, rows=80, keys=25)
    write_batches(str(tmp_path / "in"), data)
    be = make_backend(tmp_path)
    ours = run_stream(spark, str(tmp_path / "in"), "k STRING, x BIGINT, ts TIMESTAMP",
                      lambda df: be.map_in_pandas(
                          df.select((F.col("x") % 7).alias("n"), "x"), "n", P.vector_count_n,
                          "n BIGINT, v BIGINT", state_schema="c BIGINT", operator_id="vec-n"),
                      str(tmp_path / "ck"))
    by_n = [pd.DataFrame({"k": (d["x"] % 7).astype(str)}) for d in data]
    ref = running_counts(by_n)[0]
    got = {b: pd.DataFrame({"k": f["n"].astype(str), "v": f["v"]}).sort_values(["k", "v"])
           .reset_index(drop=True) for b, f in ours.items()}
    check_batches(got, ref)


def test_state_of_another_partitions_keys_is_refused(spark, tmp_path):
    data = random_batches(1, seed=37, rows=40, keys=40)
    write_batches(str(tmp_path / "in"), data)
    be = make_backend(tmp_path)
    with pytest.raises(Exception, match="their state lives in another partition"):
        run_stream(spark, str(tmp_path / "in"), "k STRING, x BIGINT, ts TIMESTAMP",
                   lambda df: be.map_in_pandas(df, "k", P.vector_touch_all, "k STRING, v BIGINT",
                                               operator_id="vec-bad"),
                   str(tmp_path / "ck"))
    # nothing was committed for the failed batch
    assert be.coordinator("vec-bad").latest() is None


def test_value_blocks_survive_restart_rescale_savepoint_and_read_state(spark, tmp_path):
    """Value blocks: the same output as the reference, across a restart with another
    parallelism (key groups move whole, and blocks live inside them) and from a savepoint;
    read_state expands the blocks into one row per key."""
    data = random_batches(5, seed=41, rows=120, keys=60)
    ref, totals = running_counts(data[:4])
    in_dir, state, local, ck = (str(tmp_path / d) for d in ("in", "state", "local", "ck"))

    def backend(p: int) -> RocksDBStateBackend:
        return RocksDBStateBackend(state, StateBackendOptions(parallelism=p, max_parallelism=16,
                                                              local_dir=local))

    def run(be: RocksDBStateBackend, blocks: int = 3) -> dict:
        return run_stream(spark, in_dir, "k STRING, x BIGINT, ts TIMESTAMP",
                          lambda df: be.map_in_pandas(df, "k", P.vector_count,
                                                      "k STRING, v BIGINT",
                                                      state_schema="c BIGINT",
                                                      operator_id="vec-blocks",
                                                      value_blocks=blocks),
                          ck)

    write_batches(in_dir, data[:2])
    first = run(backend(2))
    write_batches(in_dir, data[2:4], start=2)
    be = backend(3)
    second = run(be)
    check_batches({**first, **second}, ref)
    be.complete("vec-blocks")
    assert be.coordinator("vec-blocks").latest().parallelism == 3
    rows = be.read_state(spark, "vec-blocks", state_name="columnState").toPandas()
    got = {r["key"]["k"]: r["value"]["c"] for _, r in rows.iterrows()}
    assert got == totals
    # the distributed reader (above) gives exactly the driver reader's rows, in order
    for name in ("columnState", None):
        assert be.read_state(spark, "vec-blocks", state_name=name).collect() == \
            be.read_state(spark, "vec-blocks", state_name=name, distributed=False).collect()
    # a savepoint of block state starts a new query (parallelism 1) that goes on counting
    be.savepoint("vec-blocks", "sp")
    in2 = str(tmp_path / "in2")
    write_batches(in2, data[4:])
    be2 = RocksDBStateBackend(str(tmp_path / "state2"), StateBackendOptions(
        parallelism=1, max_parallelism=16, local_dir=str(tmp_path / "local2")),
        from_savepoint=f"{state}/vec-blocks/_savepoints/sp")
    third = run_stream(spark, in2, "k STRING, x BIGINT, ts TIMESTAMP",
                       lambda df: be2.map_in_pandas(df, "k", P.vector_count,
                                                    "k STRING, v BIGINT", state_schema="c BIGINT",
                                                    operator_id="vec-blocks", value_blocks=3),
                       str(tmp_path / "ck2"))
    check_batches(third, {0: running_counts(data)[0][4]})
    # the layout is part of the state: another block count is refused, not misread
    write_batches(in_dir, data[4:], start=4)
    with pytest.raises(Exception, match="value_blocks"):
        run(be, blocks=5)
    be.complete("vec-blocks")
    assert be.coordinator("vec-blocks").latest().checkpoint_id == 3  # nothing committed


@pytest.mark.parametrize("bad", [0, -1, 70_000, 2.5, True])
def test_value_blocks_argument_is_checked(spark, tmp_path, bad):
    from statebackend.errors import OptionsError

    df = spark.createDataFrame([("a", 1)], "k STRING, x BIGINT")
    with pytest.raises(OptionsError, match="value_blocks"):
        make_backend(tmp_path).map_in_pandas(df, "k", P.vector_count, "k STRING, v BIGINT",
                                             value_blocks=bad)
