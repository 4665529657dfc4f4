"""Any Spark schema (nested to depth 3) and any values of it: what is stored is what is read
back, exactly (types, Row field names, nulls at every level), in the codec and through
``transform_with_state`` on Spark."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nested_types import StoreAndReadBack, rows_of, same, schemas

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.keys.values import compile_codec
from statebackend.model.schema import parse_ddl


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_codec_reads_back_what_was_put(data):
    schema = data.draw(schemas(depth=3))
    row = data.draw(rows_of(schema))
    codec = compile_codec(schema, "state 'v'")
    got = codec.decode(codec.encode(row))
    assert same(got, row), (schema.ddl(), row, got)
    # the DDL written into manifests describes the same schema
    assert parse_ddl(schema.ddl()).ddl() == schema.ddl()


@pytest.mark.spark
@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_transform_with_state_reads_back_what_was_put(spark, tmp_path_factory, data):
    schema = data.draw(schemas(depth=3))
    values = data.draw(st.lists(rows_of(schema), min_size=1, max_size=4))
    tmp = tmp_path_factory.mktemp("nested")
    backend = RocksDBStateBackend(str(tmp / "state"),
                                  StateBackendOptions(parallelism=2, local_dir=str(tmp / "local")))
    proc = StoreAndReadBack(schema.ddl(), values)
    df = spark.createDataFrame(pd.DataFrame({"i": list(range(len(values)))}))
    out_schema = "i BIGINT, ok BOOLEAN, got STRING"
    for _ in range(2):  # epoch 0 stores, epoch 1 reads back
        out = backend.transform_with_state(df.groupBy("i"), proc, out_schema, "Update",
                                           "None", operator_id="rt").toPandas()
        backend.complete("rt")
    assert sorted(out["i"]) == list(range(len(values)))
    bad = out[~out["ok"]]
    assert bad.empty, (schema.ddl(), [(values[i], g) for i, g in zip(bad["i"], bad["got"])])
