"""An incompatible state schema change fails on the driver, at the call that plans the
query (``transform_with_state`` in both flavours, ``apply_in_pandas_with_state``,
``map_in_pandas``), before any task runs: the error names the state, the field, the change
and what to do, and nothing under the checkpoint location changes."""

from __future__ import annotations

import os

import evolution_procs as E
import processors as P
import pytest
from harness import random_batches, run_stream, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.errors import SchemaEvolutionError

pytestmark = pytest.mark.spark

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"


def make_backend(tmp_path) -> RocksDBStateBackend:
    return RocksDBStateBackend(str(tmp_path / "state"),
                               StateBackendOptions(parallelism=2,
                                                   local_dir=str(tmp_path / "local")))


def files_of(root) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: relative path -> (size, mtime in ns)."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            st = os.stat(os.path.join(d, n))
            out[os.path.relpath(os.path.join(d, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


def stream(spark, tmp_path):
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(
        str(tmp_path / "in"))


def first_run(spark, tmp_path, build) -> None:
    """Two micro-batches with version 1 of the code, completed."""
    write_batches(str(tmp_path / "in"), random_batches(2, seed=3, rows=40, keys=9))
    be = make_backend(tmp_path)
    run_stream(spark, str(tmp_path / "in"), SCHEMA, build(be), str(tmp_path / "ck"))
    # both micro-batches completed as committed: a late progress event of the run then
    # has nothing left to rewrite while the test compares the files
    be.complete(up_to=1)
    write_batches(str(tmp_path / "in"), random_batches(1, seed=4), start=2)


def refused_at_the_call(spark, tmp_path, call) -> SchemaEvolutionError:
    """``call(backend, stream_df)`` raises SchemaEvolutionError and writes nothing."""
    before = files_of(tmp_path / "state")
    be = make_backend(tmp_path)
    with pytest.raises(SchemaEvolutionError) as info:
        call(be, stream(spark, tmp_path))
    assert files_of(tmp_path / "state") == before
    assert not spark.streams.active  # no query was started
    return info.value


def test_transform_with_state_refused_at_the_call(spark_no_data, tmp_path):
    # ProcessingTime mode: under availableNow the first run could not end with no-data
    # micro-batches on (conftest.spark_no_data)
    spark = spark_no_data
    first_run(spark, tmp_path, lambda be: lambda df: be.transform_with_state(
        df.groupBy("k"), E.CountV1(), OUT, "Update", "ProcessingTime", operator_id="tws"))
    err = refused_at_the_call(spark, tmp_path, lambda be, df: be.transform_with_state(
        df.groupBy("k"), E.CountNarrowed(), OUT, "Update", "ProcessingTime",
        operator_id="tws"))
    assert (err.state, err.field, err.change) == ("acc", "n", "narrowing INT to SMALLINT")
    assert "delete_state('acc')" in str(err) and "field 'n' of state 'acc'" in str(err)
    # the user's processor object was not touched by the driver's init
    proc = E.CountV1()
    make_backend(tmp_path).transform_with_state(stream(spark, tmp_path).groupBy("k"), proc,
                                                OUT, "Update", "ProcessingTime",
                                                operator_id="tws")
    assert not hasattr(proc, "acc")


def test_row_flavour_refused_at_the_call(spark, tmp_path):
    first_run(spark, tmp_path, lambda be: lambda df: be.transform_with_state(
        df.groupBy("k"), E.RowCountV1(), OUT, operator_id="row", flavour="row"))
    err = refused_at_the_call(spark, tmp_path, lambda be, df: be.transform_with_state(
        df.groupBy("k"), E.CountNarrowed(), OUT, "Update", "ProcessingTime",
        operator_id="row", flavour="row"))
    assert (err.state, err.field) == ("acc", "n")


def test_apply_in_pandas_with_state_refused_at_the_call(spark, tmp_path):
    first_run(spark, tmp_path, lambda be: lambda df: be.apply_in_pandas_with_state(
        df.groupBy("k"), E.count_v1, OUT, "n INT", "Update", "NoTimeout", operator_id="apply"))
    err = refused_at_the_call(spark, tmp_path, lambda be, df: be.apply_in_pandas_with_state(
        df.groupBy("k"), E.count_v1, OUT, "n STRING", "Update", "NoTimeout",
        operator_id="apply"))
    assert (err.state, err.field, err.change) == ("groupState", "n",
                                                  "changing type INT to STRING")
    # a compatible change is planned (and its query runs on from the old values)
    out = run_stream(spark, str(tmp_path / "in"), SCHEMA,
                     lambda df: make_backend(tmp_path).apply_in_pandas_with_state(
                         df.groupBy("k"), E.count_v2, OUT, "extra STRING, n BIGINT",
                         "Update", "NoTimeout", operator_id="apply"),
                     str(tmp_path / "ck"))
    assert list(out) == [2]


@pytest.mark.parametrize("change,expected", [
    ({"state_schema": "c STRING"}, ("columnState", "c", "changing type INT to STRING")),
    ({"state_schema": "c INT", "value_blocks": 4}, ("columnState", "", None)),
])
def test_map_in_pandas_refused_at_the_call(spark, tmp_path, change, expected):
    first_run(spark, tmp_path, lambda be: lambda df: be.map_in_pandas(
        df, "k", P.vector_count, OUT, state_schema="c INT", operator_id="vec"))
    err = refused_at_the_call(spark, tmp_path, lambda be, df: be.map_in_pandas(
        df, "k", P.vector_count, OUT, operator_id="vec", **change))
    assert (err.state, err.field) == expected[:2]
    if expected[2] is not None:
        assert err.change == expected[2]
    else:  # the layout: the message says to keep the value_blocks setting
        assert "value_blocks" in str(err)
