"""Restarting a query with new code whose state schemas changed: compatible changes keep
every old value (the results equal a reference over all the input, and read_state shows
the old values through the new schema); an incompatible change stops the query before
any write. transformWithState in both flavours, applyInPandasWithState, map_in_pandas."""

from __future__ import annotations

import os

import evolution_procs as E
import processors as P
import pytest
from harness import check_batches, random_batches, run_stream, running_counts, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.task.vector import STATE_NAME

pytestmark = pytest.mark.spark

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"


def make_backend(tmp_path) -> RocksDBStateBackend:
    return RocksDBStateBackend(str(tmp_path / "state"),
                               StateBackendOptions(parallelism=2,
                                                   local_dir=str(tmp_path / "local")))


def two_runs(spark, tmp_path, build_v1, build_v2, keys_after: int = 9):
    """Batches 0-1 with version 1 of the code, then a restart (a new backend object, as a
    new driver would build) and batches 2-3 with version 2 over keys k0..k<keys_after-1>."""
    data = random_batches(2, seed=3, rows=40, keys=9)
    later = random_batches(2, seed=4, rows=30, keys=keys_after)
    write_batches(str(tmp_path / "in"), data)
    out1 = run_stream(spark, str(tmp_path / "in"), SCHEMA, build_v1(make_backend(tmp_path)),
                      str(tmp_path / "ck"))
    write_batches(str(tmp_path / "in"), later, start=2)
    be = make_backend(tmp_path)
    out2 = run_stream(spark, str(tmp_path / "in"), SCHEMA, build_v2(be), str(tmp_path / "ck"))
    return be, data + later, {**out1, **out2}


def test_transform_with_state_every_kind_keeps_its_values(spark_no_data, tmp_path):
    spark = spark_no_data  # ProcessingTime mode (TTL): no-data micro-batches off (conftest)
    be, data, out = two_runs(
        spark, tmp_path,
        lambda be: lambda df: be.transform_with_state(df.groupBy("k"), E.CountV1(), OUT,
                                                      "Update", "ProcessingTime",
                                                      operator_id="tws"),
        lambda be: lambda df: be.transform_with_state(df.groupBy("k"), E.CountV2(), OUT,
                                                      "Update", "ProcessingTime",
                                                      operator_id="tws"),
        keys_after=5)
    ref, totals = running_counts(data)
    check_batches(out, ref)  # the counts went on from the old values
    be.complete("tws")
    acc = {r.key.k: r.value for r in be.read_state(spark, "tws", state_name="acc").collect()}
    assert {k: v.n for k, v in acc.items()} == totals
    for k, v in acc.items():
        touched = k in set(data[2]["k"]) | set(data[3]["k"])
        assert v.note == ("v2" if touched else "old")  # untouched: old values, projected
        if not touched:  # meta.a: the row count of the key's last batch (v1 wrote it)
            last = [int((pdf["k"] == k).sum()) for pdf in data[:2] if (pdf["k"] == k).any()]
            assert v.meta.b is None and v.meta.a == last[-1]
    xs: dict[str, list] = {}
    for r in be.read_state(spark, "tws", state_name="xs").collect():
        xs.setdefault(r.key.k, []).append((r.value.y, r.value.x, r.expiration_ms is None))
    expected: dict[str, list] = {}
    for b, pdf in enumerate(data):
        for k, x in zip(pdf["k"], pdf["x"]):
            expected.setdefault(k, []).append(("v2" if b >= 2 else None, int(x), b < 2))
    assert {k: sorted(v, key=repr) for k, v in xs.items()} == \
        {k: sorted(v, key=repr) for k, v in expected.items()}
    m = {(r.key.k, r.user_key.sub): r.value.c
         for r in be.read_state(spark, "tws", state_name="m").collect()}
    ref_m: dict = {}
    for pdf in data:
        for k, x in zip(pdf["k"], pdf["x"]):
            ref_m[k, int(x) % 3] = ref_m.get((k, int(x) % 3), 0) + 1
    assert m == ref_m


def test_incompatible_change_fails_in_the_task_when_planned_before_the_state(spark_no_data,
                                                                            tmp_path):
    """The backstop: a query planned while no checkpoint existed (the driver had nothing
    to check) meets state written since; its first task refuses the change before any
    write."""
    spark = spark_no_data  # ProcessingTime mode (TTL): no-data micro-batches off (conftest)
    os.makedirs(tmp_path / "in")
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(
        str(tmp_path / "in"))
    be3 = make_backend(tmp_path)
    planned = be3.transform_with_state(df.groupBy("k"), E.CountNarrowed(), OUT, "Update",
                                       "ProcessingTime", operator_id="tws")
    be, data, out = two_runs(
        spark, tmp_path,
        lambda be: lambda df: be.transform_with_state(df.groupBy("k"), E.CountV1(), OUT,
                                                      "Update", "ProcessingTime",
                                                      operator_id="tws"),
        lambda be: lambda df: be.transform_with_state(df.groupBy("k"), E.CountV2(), OUT,
                                                      "Update", "ProcessingTime",
                                                      operator_id="tws"))
    be.complete("tws")
    latest = be.coordinator("tws").latest().checkpoint_id
    write_batches(str(tmp_path / "in"), random_batches(1, seed=9), start=4)
    with pytest.raises(Exception, match="narrowing BIGINT to SMALLINT") as info:
        run_stream(spark, str(tmp_path / "in"), SCHEMA, lambda _df: planned,
                   str(tmp_path / "ck"))
    assert "SchemaEvolutionError" in str(info.value) and "'acc'" in str(info.value)
    assert "field 'n'" in str(info.value)
    # Nothing of the failed batch reached durable storage, and the state still reads.
    assert not os.path.exists(tmp_path / "state" / "tws" / f"chk-{latest + 1}")
    assert make_backend(tmp_path).coordinator("tws").latest().checkpoint_id == latest
    assert len(be3.read_state(spark, "tws", state_name="acc").collect()) == 9


def test_row_flavour_restart(spark, tmp_path):
    be, data, out = two_runs(
        spark, tmp_path,
        lambda be: lambda df: be.transform_with_state(df.groupBy("k"), E.RowCountV1(), OUT,
                                                      operator_id="row", flavour="row"),
        lambda be: lambda df: be.transform_with_state(df.groupBy("k"), E.RowCountV2(), OUT,
                                                      operator_id="row", flavour="row"))
    check_batches(out, running_counts(data)[0])


def test_apply_in_pandas_with_state_restart(spark, tmp_path):
    be, data, out = two_runs(
        spark, tmp_path,
        lambda be: lambda df: be.apply_in_pandas_with_state(
            df.groupBy("k"), E.count_v1, OUT, "n INT", "Update", "NoTimeout",
            operator_id="apply"),
        lambda be: lambda df: be.apply_in_pandas_with_state(
            df.groupBy("k"), E.count_v2, OUT, "extra STRING, n BIGINT", "Update", "NoTimeout",
            operator_id="apply"))
    check_batches(out, running_counts(data)[0])


def test_map_in_pandas_restart(spark, tmp_path):
    be, data, out = two_runs(
        spark, tmp_path,
        lambda be: lambda df: be.map_in_pandas(df, "k", P.vector_count, OUT,
                                               state_schema="c INT", operator_id="vec"),
        lambda be: lambda df: be.map_in_pandas(df, "k", E.vector_count_v2, OUT,
                                               state_schema="d DOUBLE, c BIGINT",
                                               operator_id="vec"))
    ref, totals = running_counts(data)
    check_batches(out, ref)
    be.complete("vec")
    rows = be.read_state(spark, "vec", state_name=STATE_NAME).collect()
    assert {r.key.k: r.value.c for r in rows} == totals
