"""State written under several schema versions, some partitions still on the old one,
through everything that reads durable state: the driver reader and the CLI, a savepoint
and a restore from it, and a rescale, in both checkpoint modes. Each gives every value
through the newest schema."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from savepoint_helpers import MAXP, OP, encoded_keys, opts

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.cli import main as cli_main
from statebackend.coordinator import CheckpointCoordinator
from statebackend.keys.ranges import key_group_range
from statebackend.read.rows import load_savepoint, read_rows
from statebackend.restore.rescale import restore_from_savepoint, restore_rescaled
from statebackend.savepoint.reader import SavepointReader
from statebackend.savepoint.writer import create_savepoint, savepoint_dir
from statebackend.state.backend import KeyedStateBackend

V1 = "c INT, s STRUCT<a: INT, b: STRING>"
V2 = "note STRING, s STRUCT<b: STRING, a: BIGINT, z: DOUBLE>, c BIGINT"
N = 40


def build(store, tmp_path: Path, mode: str) -> tuple[CheckpointCoordinator, dict]:
    """Checkpoint 0: both partitions write ``V1`` values (a value and a list state).
    Checkpoint 1: partition 0 runs the new code (``V2``) and rewrites half its keys;
    partition 1 runs no new code (its descriptor stays ``V1``). The reference: every key's
    value through ``V2``."""
    o = opts(tmp_path, checkpoint_mode=mode)
    coord = CheckpointCoordinator(store, OP, parallelism=2, max_parallelism=MAXP,
                                  num_retained=2)
    keys = encoded_keys(N)
    ref: dict = {}
    for b in range(2):
        for p in range(2):
            rng = key_group_range(p, 2, MAXP)
            mine = [k for k in keys if int.from_bytes(k[:2], "big") in rng]
            cp = PartitionCheckpointer(store, OP, p, o, str(tmp_path / "local"))
            inst, _ = cp.restore(None if b == 0 else coord.restore(b - 1).manifests[p])
            be = KeyedStateBackend(inst, clock=lambda: 0)
            if b == 0:
                v, li = be.value_state("v", V1), be.list_state("l", V1)
                for i, k in enumerate(mine):
                    be.set_current_key(k)
                    v.update((i, (i, f"b{i}")))
                    li.put([(i, None)])
                    ref[k] = ((None, (f"b{i}", i, None), i), [(None, None, i)])
            elif p == 0:
                v, li = be.value_state("v", V2), be.list_state("l", V2)
                for i, k in enumerate(mine[::2]):
                    be.set_current_key(k)
                    v.update(("new", ("nb", -i, 0.5), 10 ** 12 + i))
                    li.appendValue(("new", None, 7))
                    ref[k] = (("new", ("nb", -i, 0.5), 10 ** 12 + i),
                              ref[k][1] + [("new", None, 7)])
            be.flush()
            cp.checkpoint(inst, b, f"a{b}", (rng.start, rng.end), be.descriptors())
            inst.close()
        assert coord.try_complete(b) is not None
    return coord, ref


def plain(v):
    if isinstance(v, tuple):
        return tuple(plain(x) for x in v)
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def read_backend(be: KeyedStateBackend, keys: list[bytes]) -> dict:
    v, li = be.value_state("v", V2), be.list_state("l", V2)
    out = {}
    for k in keys:
        be.set_current_key(k)
        if v.get() is not None:
            out[k] = (plain(v.get()), plain(list(li.get())))
    return out


def from_rows(rows) -> dict:
    by_name = {f"k{i}": k for i, k in enumerate(encoded_keys(N))}
    out: dict = {}
    for r in rows:
        k = by_name[r.key[0]]
        val, lst = out.get(k, (None, []))
        if r.state_name == "v":
            val = plain(r.value)
        elif r.state_name == "l":
            lst = lst + [plain(r.value)]
        out[k] = (val, lst)
    return out


@pytest.fixture(params=["incremental", "changelog"])
def built(request, store, tmp_path):
    coord, ref = build(store, tmp_path, request.param)
    return coord, ref, request.param


def test_driver_reader_and_cli_read_every_version(store, tmp_path, built):
    coord, ref, _ = built
    got = from_rows(read_rows(store, OP, key_types=["string"]))
    assert got == ref
    out = tmp_path / "out.parquet"
    assert cli_main(["read", str(tmp_path / "durable"), OP, "--key-types", "string",
                     "-o", str(out)]) == 0
    df = pd.read_parquet(out)
    df = df[df["state_name"] == "v"]
    assert len(df) == N
    by_name = {f"k{i}": k for i, k in enumerate(encoded_keys(N))}
    for key, value in zip(df["key.key_0"], df["value"]):
        v = json.loads(value)
        want = ref[by_name[key]][0]
        # the struct s as an object with its field names, in the current order b, a, z
        assert (v["note"], v["s"], v["c"]) == (want[0], dict(zip("baz", want[1])), want[2])
        assert list(v["s"]) == ["b", "a", "z"]


def test_savepoint_and_restore_from_it(store, tmp_path, built):
    coord, ref, _ = built
    sp = create_savepoint(store, OP, "sp")
    d = {s.name: s for s in sp.states}["v"]
    assert d.value_schema == V2 and len(d.history) == 1  # both versions, merged
    assert from_rows(read_rows(store, OP, key_types=["string"],
                               view=load_savepoint(store, OP, "sp", key_types=["string"]))) \
        == ref
    r = SavepointReader(store.child(OP).child(savepoint_dir("sp")))
    for new_p in (1, 3):
        got: dict = {}
        for p in range(new_p):
            cp = PartitionCheckpointer(store, OP, p, opts(tmp_path), str(tmp_path / f"sp{new_p}"))
            inst, _ = restore_from_savepoint(cp, r, new_p, MAXP)
            got.update(read_backend(KeyedStateBackend(inst, clock=lambda: 0),
                                    encoded_keys(N)))
            inst.close()
        assert got == ref


def test_rescale_reads_every_version(store, tmp_path, built):
    coord, ref, mode = built
    record = coord.latest()
    got: dict = {}
    for p in range(1):
        cp = PartitionCheckpointer(store, OP, p, opts(tmp_path, checkpoint_mode=mode),
                                   str(tmp_path / "local"))
        inst, _, _ = restore_rescaled(cp, record, 1, MAXP, str(tmp_path / "local"))
        got.update(read_backend(KeyedStateBackend(inst, clock=lambda: 0), encoded_keys(N)))
        inst.close()
    assert got == ref


def test_change_feed_across_a_schema_change(store, tmp_path, built):
    """Checkpoint 0 -> 1: the puts of partition 0's new code, decoded with the new schema
    (the feed reads changelogs in changelog mode, compares snapshots otherwise)."""
    from statebackend.read.changes import change_rows, plan_changes

    coord, ref, _ = built
    plan = plan_changes(store, OP, 0, 1, key_types=["string"])
    rows = list(change_rows(store, OP, 0, 1, "v", plan=plan))
    by_name = {f"k{i}": k for i, k in enumerate(encoded_keys(N))}
    puts = {by_name[r.key[0]]: plain(r.value) for r in rows if r.operation == "put"}
    assert puts and puts == {k: v[0] for k, v in ref.items() if v[0][0] == "new"}
