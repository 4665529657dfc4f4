"""Rescaling under the carrier plan: a restart with another parallelism, in both
directions relative to Spark's shuffle partitions, when some of our partitions had no
rows in the last micro-batches and the driver did not complete the last one before the
restart (nobody calls ``complete`` between the runs)."""

from __future__ import annotations

import json

import pytest
from harness import check_batches, run_stream, running_counts, write_batches
from test_carrier import SCHEMA, few_keys
from test_carrier import backend as _backend
from test_carrier import count as _count

pytestmark = [pytest.mark.spark]


@pytest.mark.parametrize("shuffle,before,after", [(2, 2, 3), (2, 3, 2), (3, 4, 1)])
def test_restart_with_another_parallelism_and_idle_partitions(spark, tmp_path, shuffle,
                                                              before, after):
    data = few_keys(8)
    ref, totals = running_counts(data)
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    old = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))
    try:
        write_batches(inp, data[:5])
        out = run_stream(spark, inp, SCHEMA, _count(_backend(tmp_path, before)), ck)
        # no complete() here: the restart's planning must see to the last batch itself
        write_batches(inp, data[5:], start=5)
        be2 = _backend(tmp_path, after)
        out.update(run_stream(spark, inp, SCHEMA, _count(be2), ck))
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", old)
    check_batches(out, ref)

    be2.complete("counts", up_to=7)
    state = be2.read_state(spark, "counts").toPandas()
    counts = state[state["state_name"] == "count"]
    got = {r["key"]["k"]: json.loads(r["value"])["count"] for r in counts.to_dict("records")}
    assert got == totals
