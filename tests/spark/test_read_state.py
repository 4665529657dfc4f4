"""``backend.read_state`` after a streaming run returns exactly the state a pandas
reference predicts, for value, list and map states (one processor holding all three)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import processors as P
import pytest
from harness import run_stream, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.errors import CheckpointNotFoundError, StateError
from statebackend.storage import open_store, read_manifest

pytestmark = pytest.mark.spark

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"
KEYS = [f"k{i}" for i in range(9)]


def batches(n: int = 3, seed: int = 5) -> list[pd.DataFrame]:
    # every key once per batch: list order is then batch order, whatever Spark's row order
    rng = np.random.default_rng(seed)
    return [pd.DataFrame({"k": KEYS, "x": rng.integers(0, 10, len(KEYS)).astype("int64"),
                          "ts": pd.Timestamp("2026-01-01")}) for _ in range(n)]


def reference(data: list[pd.DataFrame]) -> tuple[dict, dict, dict]:
    counts: dict[str, int] = {}
    lists: dict[str, list[int]] = {}
    maps: dict[tuple[str, int], int] = {}
    for pdf in data:
        for k, x in zip(pdf["k"], pdf["x"]):
            counts[k] = counts.get(k, 0) + 1
            lists.setdefault(k, []).append(int(x))
            sub = (k, int(x) % 3)
            maps[sub] = maps.get(sub, 0) + 1
    return counts, lists, maps


@pytest.fixture(scope="module", params=["incremental", "changelog"])
def run(spark, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("read-state")
    data = batches()
    write_batches(str(root / "in"), data)
    be = RocksDBStateBackend(str(root / "state"),
                             StateBackendOptions(parallelism=2, local_dir=str(root / "local"),
                                                 checkpoint_mode=request.param))

    run_stream(spark, str(root / "in"), SCHEMA,
               lambda df: be.transform_with_state(df.groupBy("k"), P.AllStates(), OUT,
                                                  operator_id="all"),
               str(root / "ck"))
    be.complete()
    return be, data


def test_value_state_as_typed_columns(spark, run):
    be, data = run
    df = be.read_state(spark, "all", state_name="count")
    assert df.columns == ["partition_id", "key", "state_name", "user_key", "value",
                          "expiration_ms"]
    rows = df.collect()
    assert {r.key.k: r.value["count"] for r in rows} == reference(data)[0]
    assert {r.state_name for r in rows} == {"count"}
    assert all(r.user_key is None and r.expiration_ms is None for r in rows)
    assert {r.partition_id for r in rows} == {0, 1}


def test_list_state_one_row_per_element_in_order(spark, run):
    be, data = run
    rows = be.read_state(spark, "all", state_name="items").collect()
    got: dict[str, list[int]] = {}
    for r in rows:  # rows of one key come in list order
        got.setdefault(r.key.k, []).append(r.value.x)
    assert got == reference(data)[1]


def test_map_state_user_keys_and_values(spark, run):
    be, data = run
    rows = be.read_state(spark, "all", state_name="m").collect()
    assert {(r.key.k, r.user_key.sub): r.value.c for r in rows} == reference(data)[2]


def test_every_state_with_json_values_and_an_older_checkpoint(spark, run):
    be, data = run
    rows = be.read_state(spark, "all", checkpoint_id=0).collect()
    counts, lists, maps = reference(data[:1])
    assert sorted(r.state_name for r in rows) == sorted(
        ["count"] * len(counts) + ["items"] * len(lists) + ["m"] * len(maps))
    got = {(r.state_name, r.key.k, r.user_key): json.loads(r.value) for r in rows}
    for k in KEYS:
        assert got["count", k, None] == {"count": counts[k]}
        assert got["items", k, None] == {"x": lists[k][0]}
    for (k, sub), c in maps.items():
        assert got["m", k, json.dumps({"sub": sub})] == {"c": c}
    with pytest.raises(StateError, match="has no state 'nope'"):
        be.read_state(spark, "all", state_name="nope")
    with pytest.raises(CheckpointNotFoundError):
        be.read_state(spark, "all", checkpoint_id=42)


def test_checkpoint_metrics_from_the_python_api(run):
    be, data = run
    s = be.checkpoint_metrics("all")
    assert s.checkpoint_id == len(data) - 1
    assert s.rows == len(data[-1]) and s.keys == len(KEYS)
    assert len(s.partitions) == 2 and s.full_size == sum(p.full_size for p in s.partitions)
    assert s.restore_sources and sum(s.restore_sources.values()) == 2
    assert s.rocksdb["estimated_keys"] >= len(KEYS)
    # object-store requests: a PUT per file written plus the manifest's, and no listing
    # but the ownership proof's (one of _writers/ per partition, a bounded directory);
    # a checkpoint materialized in its critical path (materialize_inline_ratio) also
    # writes its materialization's manifest
    store = open_store(be.checkpoint_location)
    inline = {m.partition: int(bool((m.metrics.get("changelog") or {})
                                    .get("materialized_inline")))
              for m in (read_manifest(store, rel, operator_id="all")
                        for rel in be.coordinator("all").latest().manifests.values())}
    assert s.requests["checkpoint"]["put"] == \
        s.files_uploaded + len(s.partitions) + sum(inline.values())
    assert s.requests["checkpoint"]["list"] == len(s.partitions) and "restore" in s.requests
    for p in s.partitions:
        assert p.requests["checkpoint"]["put"] == p.files_uploaded + 1 + inline[p.partition]
    for p in s.partitions:  # where each task's time went, stage by stage
        assert set(p.task_ms) == {"input", "restore", "group", "process", "flush"}
        assert all(v >= 0 for v in p.task_ms.values())
        # after the input arrived, the stages all lie between the trigger and publication
        after_input = sum(v for k, v in p.task_ms.items() if k != "input")
        assert after_input <= p.end_to_end_ms + 1
