"""``statebackend read`` and ``statebackend changes`` write every nested type (structs,
structs of structs, arrays, arrays of structs, maps, maps of structs, struct map keys)
to Parquet with the state's own types, and read back equal to what was stored; CSV and
the all-states JSON keep struct field names. Both checkpoint modes."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statebackend.cli import main

OP = "nest"
MAXP = 32
VALUE = ("s STRUCT<a: INT, b: STRUCT<c: STRING, d: DOUBLE>>, arr ARRAY<BIGINT>, "
         "m MAP<STRING, INT>, sa ARRAY<STRUCT<x: INT, y: DATE>>, "
         "ms MAP<INT, STRUCT<p: DECIMAL(10,2)>>, n BIGINT")


def value_of(i: int, b: int) -> tuple:
    """Key i's value at batch b, with nulls at every depth for some keys."""
    return ((i, (f"c{i}-{b}", i / 2)), [i, b, None], {"x": i, "y": None},
            [(i, dt.date(2026, 1, 1 + i)), None],
            {i: (decimal.Decimal(f"{i}.{b}5"),), -1: None},
            None if i % 3 == 0 else i * 10 + b) if i % 4 else (None, None, None, None, None, i)


def build(root: str, mode: str) -> str:
    """Two checkpoints of one partition: batch 0 writes keys 0..5, batch 1 rewrites 1..2,
    deletes key 3 and adds key 6."""
    from statebackend.checkpoint import PartitionCheckpointer
    from statebackend.checkpoint.materialize import wait_for_materializations
    from statebackend.coordinator import CheckpointCoordinator
    from statebackend.keys.grouping_key import encode_grouping_key
    from statebackend.keys.groups import key_group
    from statebackend.options import StateBackendOptions
    from statebackend.state.backend import KeyedStateBackend
    from statebackend.storage import open_store

    store = open_store(f"{root}/durable", backoff_s=0.0)
    kw = {"checkpoint_mode": mode} if mode == "changelog" else {}
    opts = StateBackendOptions(max_parallelism=MAXP, local_dir=f"{root}/local", **kw)
    coord = CheckpointCoordinator(store, OP, parallelism=1, max_parallelism=MAXP)
    for b, (put, delete) in enumerate([(range(6), ()), ((1, 2, 6), (3,))]):
        cp = PartitionCheckpointer(store, OP, 0, opts, f"{root}/local")
        inst, _ = cp.restore(None if b == 0 else coord.restore(b - 1).manifests[0])
        be = KeyedStateBackend(inst, clock=lambda: 0)
        v = be.value_state("v", VALUE)
        mm = be.map_state("mm", "uk STRUCT<p: INT, q: STRING>", "val STRUCT<r: ARRAY<INT>>")
        for i in [*put, *delete]:
            be.set_current_key(encode_grouping_key((f"k{i}",), ["string"],
                                                   key_group([f"k{i}"], ["string"], MAXP)))
            if i in delete:
                v.clear()
                continue
            v.update(value_of(i, b))
            mm.updateValue(((i, f"q{i}"),), (([i, None],),))
        be.flush()
        cp.checkpoint(inst, b, f"a{b}", (0, MAXP - 1), be.descriptors())
        inst.close()
        wait_for_materializations()
        assert coord.try_complete(b) is not None
    coord.close()
    return f"{root}/durable"


@pytest.fixture(scope="module", params=["incremental", "changelog"])
def url(request, tmp_path_factory) -> str:
    return build(str(tmp_path_factory.mktemp(f"nested-{request.param}")), request.param)


def cli(*argv: str) -> str:
    out = io.StringIO()
    assert main([*argv, "--key-types", "string"], out=out) == 0, out.getvalue()
    return out.getvalue()


def as_stored(v):
    """A value read back from Parquet in the shape it was stored in (structs as tuples,
    maps as dicts, arrays as lists)."""
    if isinstance(v, dict):
        return tuple(as_stored(x) for x in v.values())
    if isinstance(v, list) and v and all(isinstance(e, tuple) and len(e) == 2 for e in v):
        return {k: as_stored(x) for k, x in v}  # a map: (key, value) pairs
    if isinstance(v, list):
        return [as_stored(x) for x in v]
    return v


def expected_values(batch: int) -> dict[str, tuple]:
    keys = range(6) if batch == 0 else [0, 1, 2, 4, 5, 6]
    return {f"k{i}": value_of(i, 1 if batch == 1 and i in (1, 2, 6) else 0) for i in keys}


@pytest.mark.parametrize("checkpoint", [0, 1])
def test_read_parquet_round_trips_every_nested_type(url, tmp_path, checkpoint):
    out = str(tmp_path / "v.parquet")
    cli("read", url, OP, "--state", "v", "--checkpoint", str(checkpoint), "-o", out)
    schema = pq.read_schema(out)
    assert schema.field("value.s").type == pa.struct(
        [("a", pa.int32()), ("b", pa.struct([("c", pa.string()), ("d", pa.float64())]))])
    assert schema.field("value.arr").type.value_type == pa.int64()
    assert schema.field("value.m").type == pa.map_(pa.string(), pa.int32())
    assert schema.field("value.ms").type.item_type == pa.struct([("p", pa.decimal128(10, 2))])
    rows = pq.read_table(out).to_pylist()
    fields = ["s", "arr", "m", "sa", "ms", "n"]
    got = {r["key.key_0"]: tuple(as_stored(r[f"value.{f}"]) for f in fields) for r in rows}
    assert got == expected_values(checkpoint)
    assert pd.read_parquet(out)["expiration_ms"].isna().all()  # pandas reads it too


def test_read_parquet_map_state_with_struct_user_keys(url, tmp_path):
    out = str(tmp_path / "mm.parquet")
    cli("read", url, OP, "--state", "mm", "-o", out)
    rows = pq.read_table(out).to_pylist()
    assert {(r["user_key.uk"]["p"], r["user_key.uk"]["q"]): r["value.val"] for r in rows} == \
        {(i, f"q{i}"): {"r": [i, None]} for i in range(7)}


def test_csv_and_all_states_json_keep_struct_field_names(url, tmp_path):
    cli("read", url, OP, "--state", "v", "-o", str(tmp_path / "v.csv"))
    frame = pd.read_csv(tmp_path / "v.csv")
    row = frame[frame["key.key_0"] == "k1"].iloc[0]
    assert json.loads(row["value.s"]) == {"a": 1, "b": {"c": "c1-1", "d": 0.5}}
    assert json.loads(row["value.ms"]) == {"1": {"p": "1.15"}, "-1": None}
    cli("read", url, OP, "-o", str(tmp_path / "all.parquet"))
    frame = pd.read_parquet(tmp_path / "all.parquet")
    mm = frame[(frame["state_name"] == "mm") & (frame["key.key_0"] == "k2")].iloc[0]
    assert json.loads(mm["user_key"]) == {"uk": {"p": 2, "q": "q2"}}
    assert json.loads(mm["value"]) == {"val": {"r": [2, None]}}


def test_changes_parquet_round_trips_nested_values(url, tmp_path):
    out = str(tmp_path / "c.parquet")
    cli("changes", url, OP, "--from", "0", "--to", "1", "--state", "v", "-o", out)
    rows = pq.read_table(out).to_pylist()
    fields = ["s", "arr", "m", "sa", "ms", "n"]
    puts = {r["key.key_0"]: tuple(as_stored(r[f"value.{f}"]) for f in fields)
            for r in rows if r["operation"] == "put"}
    assert puts == {f"k{i}": value_of(i, 1) for i in (1, 2, 6)}
    assert {r["key.key_0"] for r in rows if r["operation"] == "delete"} == {"k3"}
    assert all(r["value.s"] is None for r in rows if r["operation"] == "delete")
