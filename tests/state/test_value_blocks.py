"""Value blocks (``BlockState``, ``KeyedColumnState(value_blocks=N)``) hold exactly what
one-entry-per-key state holds, survive flushes and reopening, and refuse what they cannot
do: another block count or layout for stored state, corrupt blocks, a max_parallelism
change."""

from __future__ import annotations

import struct
import tempfile

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statebackend.errors import CorruptStateError, IncompatibleStateError, SchemaError, StateError
from statebackend.keys.grouping_key import encode_grouping_key
from statebackend.keys.groups import key_group
from statebackend.keys.kernels import block_ids, unpack_block
from statebackend.read.rows import read_partition
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.savepoint.migrate import KeyRehasher
from statebackend.state import KeyedStateBackend
from statebackend.state.value import BlockState, dense_unique
from statebackend.task.vector import STATE_NAME, KeyedColumnState

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
MAXP = 128


def gkey(i: int) -> bytes:
    return encode_grouping_key((i,), ["bigint"], key_group([i], ["bigint"], MAXP))


def open_backend(path: str) -> tuple[RocksDBInstance, KeyedStateBackend]:
    inst = RocksDBInstance(path)
    return inst, KeyedStateBackend(inst)


def close(inst: RocksDBInstance, b: KeyedStateBackend) -> None:
    b.close()
    inst.close()


OPS = st.lists(st.tuples(st.sampled_from(["put", "del", "flush", "reopen", "get"]),
                         st.lists(st.integers(0, 40), max_size=25),
                         st.integers(-3, 3)), max_size=14)


@SETTINGS
@given(OPS, st.sampled_from([1, 3, 64]))
def test_block_state_equals_a_dict(ops: list[tuple[str, list[int], int]], blocks: int) -> None:
    """Random puts/deletes (duplicates inside a call: the last wins), flushes and reopens."""
    model: dict[bytes, bytes] = {}
    with tempfile.TemporaryDirectory() as d:
        inst, b = open_backend(d + "/db")
        s = b.block_state("v", "n BIGINT", blocks)
        for op, ids, x in ops:
            keys = [gkey(i) for i in ids]
            if op == "put":
                vals = [s.codec.encode((x * 100 + i,)) for i in ids]
                s.put_entries(keys, vals)
                model.update(zip(keys, vals))
            elif op == "del":
                s.put_entries(keys, [None] * len(keys))
                for k in keys:
                    model.pop(k, None)
            elif op == "flush":
                b.flush()
            elif op == "reopen":
                b.flush()
                close(inst, b)
                inst, b = open_backend(d + "/db")
                s = b.block_state("v", "n BIGINT", blocks)
            probe = [gkey(i) for i in range(42)]
            assert s.get_entries(probe) == [model.get(k) for k in probe]
        b.flush()
        stored = dict(inst.scan_prefix("v", b""))
        # one RocksDB entry per non-empty block, inside its keys' key group, holding them
        ids = np.zeros(len(model), np.int64)
        block_ids(list(model), ids, blocks)
        assert sorted(stored) == sorted({struct.pack(">HH", *divmod(int(i), blocks))
                                         for i in ids})
        held = {k: v for raw in stored.values() for k, v in unpack_block(raw).items()}
        assert held == model
        close(inst, b)


def test_block_state_declaration_is_checked() -> None:
    with tempfile.TemporaryDirectory() as d:
        inst, b = open_backend(d + "/db")
        s = b.block_state("v", "n BIGINT", 8)
        assert b.block_state("v", "n BIGINT", 8) is s
        with pytest.raises(SchemaError, match="blocks"):
            b.block_state("v", "n BIGINT", 16)
        with pytest.raises(SchemaError):
            b.value_state("v", "n BIGINT")
        for bad in (0, 70_000, 2.0, True):
            with pytest.raises(StateError, match="blocks"):
                b.block_state("w", "n BIGINT", bad)
        s.put_entries([gkey(1)], [s.codec.encode((5,))])
        b.flush()
        close(inst, b)
        inst, b = open_backend(d + "/db")  # the stored descriptor keeps the block count
        with pytest.raises(SchemaError, match="blocks"):
            b.block_state("v", "n BIGINT", 4)
        assert [x.blocks for x in b.descriptors() if x.name == "v"] == [8]
        assert b.block_state("v", "n BIGINT", 8).get_entries([gkey(1)]) == [
            b._states["v"].codec.encode((5,))]
        close(inst, b)


def test_corrupt_block_is_a_typed_error() -> None:
    with tempfile.TemporaryDirectory() as d:
        inst, b = open_backend(d + "/db")
        s = b.block_state("v", "n BIGINT", 4)
        s.put_entries([gkey(1), gkey(2)], [s.codec.encode((1,)), s.codec.encode((2,))])
        b.flush()
        block_key = next(iter(dict(inst.scan_prefix("v", b""))))
        inst.write({"v": {block_key: b"\x01\x05garbage"}})
        close(inst, b)
        inst, b = open_backend(d + "/db")
        s = b.block_state("v", "n BIGINT", 4)
        with pytest.raises(CorruptStateError, match="corrupt"):
            s.get_entries([gkey(1), gkey(2)])
        with pytest.raises(CorruptStateError, match="corrupt"):
            list(read_partition(inst, 0, ["bigint"], b.descriptors()))
        close(inst, b)


# --- KeyedColumnState over blocks vs one entry per key --------------------------------------


COLUMN_OPS = st.lists(st.tuples(st.sampled_from(["put", "put-rows", "del", "flush"]),
                                st.lists(st.integers(0, 300), max_size=60),
                                st.integers(-2, 2)), max_size=10)


@SETTINGS
@given(COLUMN_OPS, st.sampled_from(["bigint", "string"]))
def test_column_state_blocks_equal_per_key(ops: list[tuple[str, list[int], int]],
                                           key_type: str) -> None:
    def keys_of(ids: list[int]) -> pd.Series:
        vals = ids if key_type == "bigint" else [f"user-{i}" for i in ids]
        return pd.Series(vals, name="k", dtype="int64" if key_type == "bigint" else object)

    with tempfile.TemporaryDirectory() as d:
        ia, a = open_backend(d + "/a")
        ib, b = open_backend(d + "/b")
        ddl = "c BIGINT, x DOUBLE"
        per_key = KeyedColumnState(a, ["k"], [key_type], ddl, MAXP)
        blocked = KeyedColumnState(b, ["k"], [key_type], ddl, MAXP, value_blocks=2)
        for op, ids, x in ops:
            keys = keys_of(ids)
            for c in (per_key, blocked):
                if op == "put":  # the whole-column path
                    c.put(keys, pd.DataFrame({"c": np.arange(len(ids), dtype=np.int64) + x,
                                              "x": np.full(len(ids), x / 2)}))
                elif op == "put-rows":  # the row path, with nulls
                    c.put(keys, [(i, None) if x < 0 else (None, float(i)) for i in ids])
                elif op == "del":
                    c.delete(keys)
            if op == "flush":
                a.flush()
                b.flush()
            probe = keys_of(list(range(0, 302, 3)))
            pd.testing.assert_frame_equal(blocked.get(probe), per_key.get(probe))
            assert blocked.exists(probe).tolist() == per_key.exists(probe).tolist()
        a.flush()
        b.flush()
        rows_a = sorted((r.key, r.value) for r in read_partition(ia, 0, [key_type],
                                                                 a.descriptors()))
        rows_b = sorted((r.key, r.value) for r in read_partition(ib, 0, [key_type],
                                                                 b.descriptors()))
        assert rows_b == rows_a  # read_state sees the same state through the blocks
        assert isinstance(b._states[STATE_NAME], BlockState)
        close(ia, a)
        close(ib, b)


def test_column_state_layout_cannot_change_under_stored_state() -> None:
    with tempfile.TemporaryDirectory() as d:
        inst, b = open_backend(d + "/db")
        KeyedColumnState(b, ["k"], ["bigint"], "c BIGINT", MAXP).put(
            pd.Series([1, 2], name="k"), pd.Series([1, 2]))
        b.flush()
        close(inst, b)
        inst, b = open_backend(d + "/db")
        with pytest.raises(SchemaError, match="value_blocks"):
            KeyedColumnState(b, ["k"], ["bigint"], "c BIGINT", MAXP, value_blocks=4)
        close(inst, b)


def test_column_state_blocks_put_checks_lengths() -> None:
    with tempfile.TemporaryDirectory() as d:
        inst, b = open_backend(d + "/db")
        c = KeyedColumnState(b, ["k"], ["bigint"], "c BIGINT", MAXP, value_blocks=4)
        with pytest.raises(StateError, match="2 keys and 1 values"):
            c.put(pd.Series([1, 2], name="k"), [(1,)])
        assert c.exists(pd.Series([1, 2], name="k")).tolist() == [False, False]
        close(inst, b)


def test_max_parallelism_change_refuses_blocks() -> None:
    rehasher = KeyRehasher(["bigint"], MAXP, 256, {STATE_NAME: "blocks"})
    with pytest.raises(IncompatibleStateError, match="value_blocks"):
        rehasher.grouping_key(STATE_NAME, b"\x00\x05\x00\x01")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 300), st.integers(0, 2**40)), max_size=50))
def test_dense_unique_equals_numpy(values: list[int]) -> None:
    ids = np.array(values, dtype=np.int64)
    distinct, slots = dense_unique(ids)
    want_distinct, want_slots = np.unique(ids, return_inverse=True)
    assert distinct.tolist() == want_distinct.tolist()
    assert slots.dtype == np.int64 and slots.tolist() == want_slots.reshape(-1).tolist()


def test_block_state_refuses_the_per_key_api() -> None:
    with tempfile.TemporaryDirectory() as d:
        inst, b = open_backend(d + "/db")
        s = b.block_state("v", "n BIGINT", 4)
        b.set_current_key(gkey(1))
        for call in (s.get, s.exists, s.clear, lambda: s.update((1,)),
                     lambda: s.get_many([gkey(1)]), lambda: s.put_many([gkey(1)], [(1,)])):
            with pytest.raises(StateError, match="blocks"):
                call()
        assert s.get_entries([gkey(1)]) == [None]
        close(inst, b)


def test_column_state_without_value_blocks_keeps_the_stored_layout() -> None:
    keys = pd.Series([1, 2, 3], name="k")
    with tempfile.TemporaryDirectory() as d:
        inst, b = open_backend(d + "/db")
        KeyedColumnState(b, ["k"], ["bigint"], "c BIGINT", MAXP, value_blocks=4).put(
            keys, pd.Series([10, 20, 30]))
        b.flush()
        close(inst, b)
        inst, b = open_backend(d + "/db")
        c = KeyedColumnState(b, ["k"], ["bigint"], "c BIGINT", MAXP)  # no value_blocks
        assert isinstance(b._states[STATE_NAME], BlockState)
        assert b._states[STATE_NAME].blocks == 4
        assert c.get(keys)["c"].tolist() == [10, 20, 30]
        with pytest.raises(SchemaError, match="value_blocks"):
            KeyedColumnState(b, ["k"], ["bigint"], "c BIGINT", MAXP, value_blocks=8)
        close(inst, b)
    with tempfile.TemporaryDirectory() as d:  # new state without the argument: per key
        inst, b = open_backend(d + "/db")
        KeyedColumnState(b, ["k"], ["bigint"], "c BIGINT", MAXP).put(keys, pd.Series([1, 2, 3]))
        assert not isinstance(b._states[STATE_NAME], BlockState)
        close(inst, b)
