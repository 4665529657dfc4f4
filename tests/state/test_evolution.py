"""Schema evolution of stored state: compatible changes read every old value through the
schema it was written with (nothing rewritten), incompatible ones are refused when the
state is declared, before any write; readers outside the backend (read_state's decoder,
rescale's merge, savepoints) see every version."""

from __future__ import annotations

import datetime as dt
import decimal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statebackend.errors import CorruptStateError, SchemaError, SchemaEvolutionError
from statebackend.keys.grouping_key import encode_grouping_key
from statebackend.keys.groups import key_group
from statebackend.model.manifest import StateDescriptor
from statebackend.read.rows import read_partition
from statebackend.restore.rescale import merge_global
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.state import KeyedStateBackend
from statebackend.state.evolution import (
    NO_EXPIRY,
    Versions,
    evolve,
    merge_descriptors,
    version_id,
)
from statebackend.task.vector import KeyedColumnState

MAXP = 128


def gkey(i: int) -> bytes:
    return encode_grouping_key((i,), ["bigint"], key_group([i], ["bigint"], MAXP))


K = [gkey(i) for i in range(6)]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


class Env:
    def __init__(self, path: str) -> None:
        self.path = path
        self.clock = Clock()
        self.inst = RocksDBInstance(path)
        self.backend = KeyedStateBackend(self.inst, clock=self.clock)

    def reopen(self) -> KeyedStateBackend:
        """A restart: the task closes, a new one opens the same state with new code."""
        self.backend.close()
        self.inst.close()
        self.inst = RocksDBInstance(self.path)
        self.backend = KeyedStateBackend(self.inst, clock=self.clock)
        return self.backend

    def raw(self, cf: str) -> dict[bytes, bytes]:
        if cf not in self.inst.column_family_names():
            return {}
        return dict(self.inst.scan_range(cf, b"", None))

    def close(self) -> None:
        if not self.backend.closed:
            self.backend.close()
        self.inst.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(str(tmp_path / "db"))
    yield e
    e.close()


def rows(b: KeyedStateBackend, name: str) -> list[Any]:
    """What read_state's decoder gives for state ``name`` (value column per entry)."""
    b.flush()
    d = {x.name: x for x in b.descriptors()}[name]
    return [(r.user_key, r.value, r.expiration_ms)
            for r in read_partition(b._instance, 0, ["bigint"], [d])]


# --- every kind of state, each compatible change ---------------------------------------

#: (old schema, old value, new schema, the old value read through the new schema)
COMPATIBLE = [
    ("a INT", (7,), "a INT, b STRING", (7, None)),                      # added field
    ("a INT, b STRING", (7, "x"), "b STRING", ("x",)),                 # removed field
    ("a INT, b STRING", (7, "x"), "b STRING, a INT", ("x", 7)),        # reordered
    ("a INT", (7,), "a BIGINT", (7,)),                                  # int -> long
    ("a FLOAT", (1.5,), "a DOUBLE", (1.5,)),                            # float -> double
    ("a SMALLINT", (3,), "a DOUBLE", (3.0,)),                           # short -> double
    ("a INT NOT NULL", (7,), "a INT", (7,)),                            # NOT NULL -> nullable
    ("a DECIMAL(5,2)", (decimal.Decimal("1.25"),), "a DECIMAL(10,3)",
     (decimal.Decimal("1.25"),)),                                       # decimal widening
    ("a DATE", (dt.date(2024, 1, 2),), "a TIMESTAMP", (dt.datetime(2024, 1, 2),)),
    ("a STRING, b BINARY", ("é", b"x"), "a BINARY, b STRING", ("é".encode(), "x")),
    ("a INT, b STRING", (7, "x"), "c STRING, a BIGINT", (None, 7)),    # rename = drop + add
    ("a INT", (7,), "a INT, b INT NOT NULL DEFAULT 5, c STRING DEFAULT 'it\\'s'",
     (7, 5, "it's")),                                                  # added with defaults
    ("s STRUCT<x: INT>", ((1,),), "s STRUCT<x: INT, y: DOUBLE DEFAULT -0.5>",
     ((1, -0.5),)),                                                    # nested default
    # nested: structs of structs, arrays, map values evolve by the same rules
    ("s STRUCT<x: INT, y: STRUCT<p: INT, q: STRING>>",
     ((1, (2, "q")),),
     "s STRUCT<y: STRUCT<q: STRING, p: BIGINT, r: DOUBLE>, z: STRING>",
     (((("q", 2, None)), None),)),
    ("l ARRAY<INT>", ([1, None, 3],), "l ARRAY<DOUBLE>", ([1.0, None, 3.0],)),
    ("l ARRAY<STRUCT<x: INT, y: STRING>>", ([(1, "a"), None],),
     "l ARRAY<STRUCT<y: STRING, z: INT>>", ([("a", None), None],)),
    ("m MAP<STRING, INT>", ({"k": 1},), "m MAP<STRING, BIGINT>", ({"k": 1},)),
    ("m MAP<INT, STRUCT<x: FLOAT>>", ({5: (0.5,)},),
     "m MAP<INT, STRUCT<x: DOUBLE, y: ARRAY<INT>>>", ({5: (0.5, None)},)),
]


def plain(v: Any) -> Any:
    """Rows (tuples with field names) as tuples, recursively, to compare with literals."""
    if isinstance(v, tuple):
        return tuple(plain(x) for x in v)
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v


@pytest.mark.parametrize("old,value,new,expected", COMPATIBLE,
                         ids=[f"{c[0]}->{c[2]}" for c in COMPATIBLE])
def test_every_kind_reads_old_values_through_a_compatible_change(
        env: Env, old: str, value: tuple, new: str, expected: tuple) -> None:
    b = env.backend
    v, li = b.value_state("v", old), b.list_state("l", old)
    m = b.map_state("m", "k INT", old)
    r = b.reducing_state("r", old, lambda a, _: a)
    for key in K[:2]:
        b.set_current_key(key)
        v.update(value)
        li.put([value, value])
        m.updateValue((1,), value)
        r.add(value)
    b.flush()
    stored = {cf: env.raw(cf) for cf in ("v", "l", "m", "r")}
    b = env.reopen()
    v, li = b.value_state("v", new), b.list_state("l", new)
    m = b.map_state("m", "k INT", new)
    r = b.reducing_state("r", new, lambda a, _: a)
    b.set_current_key(K[0])
    assert plain(v.get()) == expected
    assert plain(list(li.get())) == [expected, expected]
    assert plain(m.getValue((1,))) == expected
    assert plain(list(m.iterator())) == [((1,), expected)]
    assert plain(r.get()) == expected
    # New values are written with the new schema, next to the old ones.
    b.set_current_key(K[2])
    v.update(expected)
    li.put([expected])
    li.appendValue(expected)
    b.set_current_key(K[1])
    li.appendValue(expected)  # an old list gains an element of the new version
    assert plain(list(li.get())) == [expected] * 3
    b.flush()
    # Reading converted nothing in place: the entries not written again are the old bytes.
    assert env.raw("v")[K[1]] == stored["v"][K[1]]
    assert env.raw("l")[K[0]] == stored["l"][K[0]]
    assert env.raw("m") == stored["m"] and env.raw("r") == stored["r"]
    b = env.reopen()
    v, li = b.value_state("v", new), b.list_state("l", new)
    for key in (K[0], K[1], K[2]):
        b.set_current_key(key)
        assert plain(v.get()) == expected
    # read_state's decoder reads every version as the current schema.
    assert [plain(x[1]) for x in rows(b, "v")] == [expected] * 3
    assert [plain(x[1]) for x in rows(b, "l")] == [expected] * 7  # 2 + 3 + 2
    assert [(plain(x[0]), plain(x[1])) for x in rows(b, "m")] == [((1,), expected)] * 2


def test_three_versions_in_one_state_and_going_back(env: Env) -> None:
    b = env.backend
    s = b.value_state("s", "a INT")
    b.set_current_key(K[0])
    s.update((1,))
    b = env.reopen()
    s = b.value_state("s", "a BIGINT, b STRING")
    b.set_current_key(K[1])
    s.update((2, "two"))
    b = env.reopen()
    s = b.value_state("s", "b STRING, c DOUBLE, a BIGINT")
    b.set_current_key(K[2])
    s.update(("three", 3.0, 3))
    b = env.reopen()
    d = {x.name: x for x in b.descriptors()}["s"]
    assert len(d.history) == 2
    s = b.value_state("s", "a BIGINT, b STRING")  # back to version 2: dropping c
    got = []
    for key in K[:3]:
        b.set_current_key(key)
        got.append(s.get())
    assert got == [(1, None), (2, "two"), (3, "three")]
    d2 = {x.name: x for x in b.descriptors()}["s"]
    assert d2.schema_id == version_id("a BIGINT, b STRING", False)  # the id it had before
    with pytest.raises(SchemaEvolutionError, match="narrowing BIGINT to INT"):
        env.reopen().value_state("s", "a INT")  # version 2 and 3 values are BIGINT


def test_ttl_added_and_removed(env: Env) -> None:
    b, clock = env.backend, env.clock
    s = b.value_state("s", "a INT")
    li = b.list_state("l", "a INT")
    m = b.map_state("m", "k INT", "a INT")
    b.set_current_key(K[0])
    s.update((1,))
    li.put([(1,)])
    m.updateValue((0,), (1,))
    b = env.reopen()
    # Adding a TTL: old values have no expiry (they live until written again).
    s = b.value_state("s", "a INT", ttl_ms=100)
    li = b.list_state("l", "a INT", ttl_ms=100)
    m = b.map_state("m", "k INT", "a INT", ttl_ms=100)
    b.set_current_key(K[1])
    s.update((2,))
    li.put([(2,)])
    m.updateValue((0,), (2,))
    b.set_current_key(K[0])
    li.appendValue((3,))  # the old element is written again, still without an expiry
    b.flush()
    assert {x[1]: x[2] is None for x in rows(b, "l")} == {(1,): True, (2,): False,
                                                           (3,): False}
    clock.now += 1_000
    assert b.purge_expired() == 4  # the new values only (K1's three, K0's appended one)
    assert s.get() == (1,) and list(li.get()) == [(1,)] and m.getValue((0,)) == (1,)
    b.set_current_key(K[1])
    assert s.get() is None and not li.exists() and m.getValue((0,)) is None
    assert [x[2] for x in rows(b, "s")] == [None]  # no expiry shown for a value without
    b.set_current_key(K[2])
    s.update((4,))  # expires at now + 100
    b = env.reopen()
    # Removing the TTL: nothing expires any more, expired-but-unpurged values included.
    s = b.value_state("s", "a INT")
    clock.now += 1_000
    b.set_current_key(K[2])
    assert s.get() == (4,)
    assert b.purge_expired() == 0
    b.set_current_key(K[0])
    assert s.get() == (1,)
    assert sorted(x[1] for x in rows(b, "s")) == [(1,), (4,)]


def test_added_state_and_removed_state(env: Env) -> None:
    b = env.backend
    old = b.value_state("old", "a INT")
    b.set_current_key(K[0])
    old.update((1,))
    b = env.reopen()
    new = b.value_state("new", "a STRING")  # "old" not declared: it stays as it is
    b.set_current_key(K[0])
    new.update(("x",))
    b = env.reopen()
    b.set_current_key(K[0])
    assert b.value_state("old", "a INT").get() == (1,)
    assert b.value_state("new", "a STRING").get() == ("x",)


# --- incompatible changes: refused at declaration, nothing written ---------------------

#: (kind, old, new, field named, change named)
INCOMPATIBLE = [
    ("value", "a BIGINT", "a INT", "a", "narrowing BIGINT to INT"),
    ("value", "a DOUBLE", "a FLOAT", "a", "narrowing DOUBLE to FLOAT"),
    ("value", "a STRING", "a INT", "a", "changing type STRING to INT"),
    ("value", "a INT", "a INT NOT NULL", "a", "making a nullable field NOT NULL"),
    ("value", "a INT", "a INT, b INT NOT NULL", "b", "adding NOT NULL field 'b'"),
    ("value", "a INT", "b INT NOT NULL", "b", "a rename is a removal plus an addition"),
    ("value", "a DECIMAL(10,2)", "a DECIMAL(10,3)", "a", "narrowing DECIMAL(10,2)"),
    ("list", "s STRUCT<x: STRUCT<y: BIGINT>>", "s STRUCT<x: STRUCT<y: INT>>", "s.x.y",
     "narrowing BIGINT to INT"),
    ("list", "l ARRAY<BIGINT>", "l ARRAY<INT>", "l.element", "narrowing"),
    ("value", "m MAP<INT, STRING>", "m MAP<BIGINT, STRING>", "m.key",
     "changing the map key type INT to BIGINT"),
    ("map", "m MAP<STRING, DOUBLE>", "m MAP<STRING, FLOAT>", "m.value", "narrowing"),
    ("mapkey", "k INT", "k BIGINT", "user key", "changing the map's user key schema"),
    ("kind", "a INT", "a INT", "", "changing the state's kind from value to list"),
]


@pytest.mark.parametrize("kind,old,new,field,change", INCOMPATIBLE,
                         ids=[f"{c[0]}:{c[1]}->{c[2]}" for c in INCOMPATIBLE])
def test_incompatible_change_is_refused_before_any_write(
        env: Env, kind: str, old: str, new: str, field: str, change: str) -> None:
    b = env.backend

    def declare(schema: str, evolved: bool) -> Any:
        if kind == "list":
            return b.list_state("s", schema)
        if kind == "map":
            return b.map_state("s", "k INT", schema)
        if kind == "mapkey":
            return b.map_state("s", schema, "v INT")
        if kind == "kind" and evolved:
            return b.list_state("s", schema)
        return b.value_state("s", schema)

    declare(old, False)
    b.flush()
    before = {cf: env.raw(cf) for cf in env.inst.column_family_names()}
    b = env.reopen()
    with pytest.raises(SchemaEvolutionError) as info:
        declare(new, True)
    err = info.value
    assert isinstance(err, SchemaError)  # and so a TypeError, as before
    assert err.state == "s" and err.field == field and "'s'" in str(err)
    assert change in str(err) and ("Keep" in str(err) or "Use another" in str(err))
    b.flush()
    env.close()
    env.inst = RocksDBInstance(env.path)
    env.backend = KeyedStateBackend(env.inst)
    assert {cf: env.raw(cf) for cf in env.inst.column_family_names()} == before


def test_a_change_is_checked_against_every_earlier_version(env: Env) -> None:
    b = env.backend
    b.value_state("s", "a BIGINT")
    b = env.reopen()
    b.value_state("s", "b STRING")  # a removed: BIGINT values of a remain stored
    b = env.reopen()
    with pytest.raises(SchemaEvolutionError, match="narrowing BIGINT to INT"):
        b.value_state("s", "a INT, b STRING")


def test_states_written_before_schema_versions_are_refused(env: Env) -> None:
    """A descriptor without schema_id (a pre-release layout: values carry no id) is no
    longer read: opening the state says which format it found and what to do."""
    import json

    from statebackend.errors import FormatVersionError
    from statebackend.keys.values import compile_codec
    from statebackend.model.schema import parse_ddl

    legacy = json.dumps({"name": "s", "kind": "value", "value_schema": "a INT",
                         "user_key_schema": None, "ttl_ms": None}).encode()
    env.inst.write({"_meta": {b"state/s": legacy},
                    "s": {K[0]: compile_codec(parse_ddl("a INT"), "x").encode((5,))}})
    with pytest.raises(FormatVersionError, match="pre-release.*state 's'|state 's'.*pre-release"):
        env.reopen()


def test_unknown_schema_id_is_corrupt_state() -> None:
    d = evolve(None, StateDescriptor("s", "value", "a INT"))
    with pytest.raises(CorruptStateError, match="schema id"):
        Versions(d).read(b"\xff\xff\x00\x01\x00\x00\x00")


# --- map_in_pandas: whole-column values and value blocks -------------------------------


@pytest.mark.parametrize("blocks", [None, 4])
def test_map_in_pandas_state_schema_evolves(tmp_path: Path, blocks: int | None) -> None:
    e = Env(str(tmp_path / "db"))
    try:
        keys = pd.Series([1, 2, 3], name="k")
        cs = KeyedColumnState(e.backend, ["k"], ["bigint"], "c INT", MAXP, value_blocks=blocks)
        cs.put(keys, pd.DataFrame({"c": [10, 20, 30]}))
        e.backend.flush()
        b = e.reopen()
        cs = KeyedColumnState(b, ["k"], ["bigint"], "c BIGINT, d DOUBLE", MAXP,
                              value_blocks=blocks)
        cs.put(pd.Series([3], name="k"), pd.DataFrame({"c": [33], "d": [0.5]}))
        got = cs.get(pd.Series([1, 2, 3, 4], name="k"))
        assert got["c"].tolist()[:3] == [10, 20, 33] and pd.isna(got["c"].tolist()[3])
        assert pd.isna(got["d"].tolist()[0]) and got["d"].tolist()[2] == 0.5
        b = e.reopen()
        with pytest.raises(SchemaEvolutionError, match="narrowing BIGINT to INT"):
            KeyedColumnState(b, ["k"], ["bigint"], "c INT", MAXP, value_blocks=blocks)
    finally:
        e.close()


# --- descriptors merged across partitions (rescale, savepoints, readers) ---------------


def test_descriptors_of_partitions_that_evolved_apart_merge(tmp_path: Path) -> None:
    v1 = evolve(None, StateDescriptor("s", "value", "a INT"))
    v2 = evolve(v1, StateDescriptor("s", "value", "a INT, b STRING"))
    v3 = evolve(v2, StateDescriptor("s", "value", "b STRING"))
    assert merge_descriptors(v1, v3) == v3 and merge_descriptors(v3, v1) == v3
    assert merge_descriptors(v2, v3) == v3
    other = evolve(None, StateDescriptor("s", "value", "z STRING"))
    assert merge_descriptors(v1, other) is None  # unrelated histories: a conflict
    # Rescale: partition A stopped at v1 (its values), partition B went on to v3.
    a, bb = Env(str(tmp_path / "a")), Env(str(tmp_path / "b"))
    try:
        s = a.backend.value_state("s", "a INT")
        a.backend.set_current_key(K[0])
        s.update((1,))
        a.backend.flush()
        bb.backend.value_state("s", "a INT")
        bb.reopen().value_state("s", "a INT, b STRING")
        s = bb.reopen().value_state("s", "b STRING")
        bb.backend.set_current_key(K[1])
        s.update(("x",))
        bb.backend.flush()
        for src, dst in ((a, bb), (bb, a)):  # either one can be the base
            src.backend.close()
            dst.backend.close()
            merge_global(src.inst, dst.inst)
            dst.inst.write({"s": src.raw("s")})
            src.backend = KeyedStateBackend(src.inst)
            b = dst.backend = KeyedStateBackend(dst.inst)
            s = b.value_state("s", "b STRING")
            got = []
            for key in K[:2]:
                b.set_current_key(key)
                got.append(s.get())
            assert got == [(None,), ("x",)]
    finally:
        a.close()
        bb.close()


def test_merging_descriptors_of_both_layouts_is_refused() -> None:
    from statebackend.errors import IncompatibleStateError
    from statebackend.state.evolution import descriptor_json, merge_meta_entry

    d = evolve(None, StateDescriptor("s", "value", "a INT"))
    legacy = StateDescriptor("s", "value", "a INT")
    assert merge_descriptors(d, d) is d
    assert merge_descriptors(d, legacy) is None and merge_descriptors(legacy, d) is None
    assert merge_meta_entry(b"timer_service", b"rocksdb", b"heap") == b"rocksdb"
    with pytest.raises(IncompatibleStateError, match="pre-release"):  # FormatVersionError
        merge_meta_entry(b"state/s", descriptor_json(d), descriptor_json(legacy))
    assert NO_EXPIRY == (1 << 63) - 1


# --- property: a schema, a sequence of compatible changes, values; all read back -------

_TYPES = {"tinyint": (-128, 127), "smallint": (-2 ** 15, 2 ** 15 - 1),
          "int": (-2 ** 31, 2 ** 31 - 1), "bigint": (-2 ** 63, 2 ** 63 - 1)}
_WIDER = {"tinyint": ["smallint", "int", "bigint", "double"], "smallint": ["int", "bigint"],
          "int": ["bigint", "double"], "bigint": ["double"], "float": ["double"],
          "double": [], "string": []}


def _value(draw: Any, t: str) -> Any:
    if t in _TYPES:
        lo, hi = _TYPES[t]
        return draw(st.none() | st.integers(lo, hi))
    if t == "float":
        return draw(st.none() | st.integers(-1000, 1000).map(lambda x: x / 4))
    if t == "double":
        return draw(st.none() | st.floats(allow_nan=False))
    return draw(st.none() | st.text(max_size=5))


def _ddl(fields: list[tuple[str, str]], nested: bool) -> str:
    flat = ", ".join(f"{n} {t.upper()}" for n, t in fields)
    if not nested:
        return flat
    return "s STRUCT<" + ", ".join(f"{n}: {t.upper()}" for n, t in fields) + ">"


@st.composite
def evolutions(draw: Any) -> tuple[str, bool, list[Any]]:
    """A kind, whether the fields sit in a struct, and steps: each a schema (list of
    ``(name, type)``) and values written under it (key index -> dict of field values)."""
    kind = draw(st.sampled_from(["value", "list", "map"]))
    nested = draw(st.booleans())
    names = iter(f"f{i}" for i in range(100))
    fields = [(next(names), draw(st.sampled_from(list(_WIDER))))
              for _ in range(draw(st.integers(1, 4)))]
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        writes = {}
        for k in draw(st.lists(st.integers(0, 5), max_size=4, unique=True)):
            writes[k] = {n: _value(draw, t) for n, t in fields}
        steps.append((list(fields), writes))
        change = draw(st.sampled_from(["add", "remove", "reorder", "widen", "ttl"]))
        if change == "add":
            fields.append((next(names), draw(st.sampled_from(list(_WIDER)))))
        elif change == "remove" and len(fields) > 1:
            fields.pop(draw(st.integers(0, len(fields) - 1)))
        elif change == "reorder":
            fields = draw(st.permutations(fields))
        elif change == "widen":
            i = draw(st.integers(0, len(fields) - 1))
            wider = _WIDER[fields[i][1]]
            if wider:
                fields[i] = (fields[i][0], draw(st.sampled_from(wider)))
    steps.append((list(fields), {}))
    return kind, nested, steps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(evolutions(), st.booleans())
def test_any_sequence_of_compatible_changes_reads_everything_back(
        case: tuple[str, bool, list[Any]], ttl_toggles: bool) -> None:
    kind, nested, steps = case
    model: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as d:
        e = Env(d + "/db")
        try:
            for i, (fields, writes) in enumerate(steps):
                b = e.reopen()
                ddl = _ddl(fields, nested)
                ttl = 10 ** 9 if ttl_toggles and i % 2 else None
                s = (b.value_state("s", ddl, ttl) if kind == "value" else
                     b.list_state("s", ddl, ttl) if kind == "list" else
                     b.map_state("s", "k INT", ddl, ttl))
                # The reference: every stored value projected onto this schema by name.
                for k in model:
                    model[k] = {n: (None if model[k].get(n) is None else
                                    float(model[k][n]) if t in ("float", "double")
                                    else model[k][n]) for n, t in fields}
                for k, vals in sorted(model.items()):
                    b.set_current_key(K[k])
                    expected = tuple(vals[n] for n, _ in fields)
                    got = (s.get() if kind == "value" else
                           (list(s.get()) or [None])[0] if kind == "list" else
                           s.getValue((1,)))
                    assert got is not None
                    got = tuple(got[0]) if nested else tuple(got)
                    assert got == expected
                for k, vals in writes.items():
                    b.set_current_key(K[k])
                    row = tuple(vals[n] for n, _ in fields)
                    value = (row,) if nested else row
                    if kind == "value":
                        s.update(value)
                    elif kind == "list":
                        s.put([value])
                    else:
                        s.updateValue((1,), value)
                    model[k] = dict(vals)
            b = e.reopen()
            fields = steps[-1][0]
            s_desc = {x.name: x for x in b.descriptors()}["s"]
            got_rows = {r.key[0]: r.value for r in read_partition(
                b._instance, 0, ["bigint"], [s_desc])}
            for k, vals in model.items():
                expected = tuple(vals[n] for n, _ in fields)
                got = got_rows[k]
                assert (tuple(got[0]) if nested else tuple(got)) == expected
        finally:
            e.close()


def test_default_clause_parses_round_trips_and_is_checked() -> None:
    from pyspark.sql.types import IntegerType, StructField, StructType

    from statebackend.model.schema import parse_ddl, to_schema

    s = parse_ddl("a INT DEFAULT -3, b STRING NOT NULL DEFAULT 'it\\'s', c BOOLEAN DEFAULT TRUE,"
                  " d DECIMAL(5,2) DEFAULT 1.5, e DOUBLE DEFAULT 2e3, f INT DEFAULT NULL")
    assert parse_ddl(s.ddl()) == s
    assert [f.default_value() for f in s.fields] == [-3, "it's", True, decimal.Decimal("1.5"),
                                                     2000.0, None]
    with pytest.raises(SchemaError, match="DEFAULT 'x' is not a value of type INT"):
        parse_ddl("a INT DEFAULT 'x'")
    spark = StructType([StructField("a", IntegerType(), False, {"EXISTS_DEFAULT": "42"})])
    assert to_schema(spark).ddl() == "a INT NOT NULL DEFAULT 42"
