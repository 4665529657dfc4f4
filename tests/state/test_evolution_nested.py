"""Schema evolution at depth: structs of structs, arrays of structs, maps with struct
values and structs holding arrays and maps evolve by the same rules as top-level fields
(widening, added, removed and reordered fields), and incompatible changes anywhere are
refused naming the nested field's path.

The property test draws a type tree, a sequence of compatible changes applied at any
depth, and values; after each change every value written so far reads back as
:func:`project` (a pure function over Python values, the reference) says.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statebackend.errors import SchemaEvolutionError
from statebackend.read.rows import read_partition
from tests.state.test_evolution import Env, K, plain

# A type: a primitive name, ("struct", ((name, type), ...)), ("array", element) or
# ("map", key primitive, value). A schema is the fields of a top-level struct.
Type = Any
Fields = tuple[tuple[str, Type], ...]

_INTS = {"tinyint": (-128, 127), "smallint": (-2 ** 15, 2 ** 15 - 1),
         "int": (-2 ** 31, 2 ** 31 - 1), "bigint": (-2 ** 63, 2 ** 63 - 1)}
_WIDER = {"tinyint": ["smallint", "int", "bigint", "double"], "smallint": ["int", "bigint"],
          "int": ["bigint", "double"], "bigint": ["double"], "float": ["double"],
          "double": [], "string": []}
_PRIMS = sorted(_WIDER)


# --- the reference ------------------------------------------------------------------------


def project(v: Any, old: Type, new: Type) -> Any:
    """``v``, written as type ``old``, read as type ``new``: struct fields matched by name
    (an added one None, a removed one gone), arrays and map values element-wise, integral
    to floating point as float."""
    if v is None:
        return None
    if isinstance(old, str):
        return float(v) if new in ("float", "double") else v
    if old[0] == "struct":
        was = {n: (x, t) for (n, t), x in zip(old[1], v, strict=True)}
        return tuple(project(*was[n], t) if n in was else None for n, t in new[1])
    if old[0] == "array":
        return [project(x, old[1], new[1]) for x in v]
    return {k: project(x, old[2], new[2]) for k, x in v.items()}


def ddl(t: Type) -> str:
    if isinstance(t, str):
        return t.upper()
    if t[0] == "struct":
        return "STRUCT<" + ", ".join(f"{n}: {ddl(x)}" for n, x in t[1]) + ">"
    if t[0] == "array":
        return f"ARRAY<{ddl(t[1])}>"
    return f"MAP<{t[1].upper()}, {ddl(t[2])}>"


def schema_ddl(fields: Fields) -> str:
    return ", ".join(f"{n} {ddl(t)}" for n, t in fields)


def depth(t: Type) -> int:
    if isinstance(t, str):
        return 0
    inner = [x for _, x in t[1]] if t[0] == "struct" else [t[-1]]
    return 1 + max(depth(x) for x in inner)


# --- drawing types, values and changes ---------------------------------------------------


def draw_type(draw: Any, names: Any, at_least: int, budget: int) -> Type:
    """A type of depth ``at_least`` to ``budget``."""
    if at_least <= 0 and (budget <= 0 or draw(st.booleans())):
        return draw(st.sampled_from(_PRIMS))
    kind = draw(st.sampled_from(["struct", "array", "map"]))
    sub = (at_least - 1, budget - 1)
    if kind == "array":
        return ("array", draw_type(draw, names, *sub))
    if kind == "map":
        return ("map", draw(st.sampled_from(["string", "int"])), draw_type(draw, names, *sub))
    n = draw(st.integers(1, 3))
    return ("struct", tuple((next(names), draw_type(draw, names, *sub) if i == 0 else
                             draw_type(draw, names, 0, budget - 1)) for i in range(n)))


def draw_value(draw: Any, t: Type) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return None
    if t in _INTS:
        return draw(st.integers(*_INTS[t]))
    if t == "float":
        return draw(st.integers(-1000, 1000)) / 4  # exact in float32
    if t == "double":
        return draw(st.floats(allow_nan=False))
    if t == "string":
        return draw(st.text(max_size=4))
    if t[0] == "struct":
        return tuple(draw_value(draw, x) for _, x in t[1])
    if t[0] == "array":
        return [draw_value(draw, t[1]) for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3])))]
    keys = st.text(max_size=3) if t[1] == "string" else st.integers(-5, 5)
    return {k: draw_value(draw, t[2]) for k in draw(st.lists(keys, min_size=draw(st.sampled_from([0, 1, 1])),
                                                       max_size=3, unique=True))}


def spots(t: Type, want: str) -> list[tuple[Any, ...]]:
    """Paths (steps: a field name, ``element`` or ``value``) to every struct (``want`` is
    "struct") or every primitive outside map keys ("prim") in ``t``."""
    if isinstance(t, str):
        return [()] if want == "prim" else []
    here = [()] if want == "struct" and t[0] == "struct" else []
    if t[0] == "struct":
        inner = [((n,), x) for n, x in t[1]]
    else:
        inner = [(("element",) if t[0] == "array" else ("value",), t[-1])]
    return here + [step + p for step, x in inner for p in spots(x, want)]


def at(t: Type, path: tuple[Any, ...], change: Callable[[Type], Type]) -> Type:
    """``t`` with the type at ``path`` replaced by ``change`` of it."""
    if not path:
        return change(t)
    step, rest = path[0], path[1:]
    if step == "element":
        return ("array", at(t[1], rest, change))
    if step == "value":
        return ("map", t[1], at(t[2], rest, change))
    return ("struct", tuple((n, at(x, rest, change) if n == step else x) for n, x in t[1]))


def draw_change(draw: Any, names: Any, top: Type) -> Type:
    """``top`` (the schema as a struct) after one compatible change at any depth."""
    change = draw(st.sampled_from(["add", "remove", "reorder", "widen"]))
    if change == "widen":
        path = draw(st.sampled_from(spots(top, "prim")))
        return at(top, path, lambda p: draw(st.sampled_from([p, *_WIDER[p]])))
    path = draw(st.sampled_from(spots(top, "struct")))

    def edit(s: Type) -> Type:
        fields = list(s[1])
        if change == "add":
            fields.insert(draw(st.integers(0, len(fields))),
                          (next(names), draw_type(draw, names, 0, 2)))
        elif change == "remove" and len(fields) > 1:
            fields.pop(draw(st.integers(0, len(fields) - 1)))
        elif change == "reorder":
            fields = draw(st.permutations(fields))
        return ("struct", tuple(fields))
    return at(top, path, edit)


@st.composite
def nested_evolutions(draw: Any) -> tuple[str, list[tuple[Type, dict[tuple[int, int], Any]]]]:
    """A state kind and steps: each a schema (a struct type) and the values written under
    it (``(key index, slot) -> row``; the slot is a map state's user key)."""
    kind = draw(st.sampled_from(["value", "list", "map"]))
    names = iter(f"f{i}" for i in range(1000))
    top: Type = ("struct", ((next(names), draw_type(draw, names, 3, 4)),))
    for _ in range(draw(st.integers(0, 2))):
        top = ("struct", (*top[1], (next(names), draw_type(draw, names, 0, 2))))
    steps = []
    for _ in range(draw(st.integers(2, 4))):
        writes = {(k, draw(st.integers(0, 1)) if kind == "map" else 0):
                  tuple(draw_value(draw, t) for _, t in top[1])  # a row is never None
                  for k in draw(st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True))}
        steps.append((top, writes))
        top = draw_change(draw, names, top)
    steps.append((top, {}))
    return kind, steps


def declare(e: Env, kind: str, top: Type, text: str | None = None) -> Any:
    """State "s" of ``kind`` declared after a restart, with the schema ``top`` (or the DDL
    ``text``)."""
    b = e.reopen()
    text = text or schema_ddl(top[1])
    return (b.value_state("s", text) if kind == "value" else b.list_state("s", text)
            if kind == "list" else b.map_state("s", "k INT", text))


def read(kind: str, s: Any, slot: int) -> Any:
    if kind == "value":
        return plain(s.get())
    if kind == "list":
        return plain(list(s.get()))
    value = plain(s.getValue((slot,)))
    assert plain(dict(s.iterator()))[(slot,)] == value  # the scan reads it the same
    return value


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(nested_evolutions())
def test_nested_schemas_evolve_at_every_depth_and_read_everything_back(
        case: tuple[str, list[tuple[Type, dict[tuple[int, int], Any]]]]) -> None:
    kind, steps = case
    assert depth(steps[0][0]) >= 4  # the top struct, then at least 3 nested levels
    model: dict[tuple[int, int], list[tuple[Any, Type]]] = {}  # written rows and types
    with tempfile.TemporaryDirectory() as d:
        e = Env(d + "/db")
        try:
            for top, writes in steps:
                s = declare(e, kind, top)
                b = e.backend
                for (k, slot), written in sorted(model.items()):
                    b.set_current_key(K[k])
                    expected = [project(r, t, top) for r, t in written]
                    assert read(kind, s, slot) == (expected if kind == "list" else
                                                   expected[-1])
                for (k, slot), row in writes.items():
                    b.set_current_key(K[k])
                    if kind == "value":
                        s.update(row)
                    elif kind == "list":
                        s.appendValue(row)  # a list mixes elements of several versions
                    else:
                        s.updateValue((slot,), row)
                    old = model.get((k, slot), []) if kind == "list" else []
                    model[(k, slot)] = [*old, (row, top)]
            # read_state's decoder reads every version as the last schema too
            top = steps[-1][0]
            b = e.reopen()
            desc = {x.name: x for x in b.descriptors()}["s"]
            got: dict[tuple[int, int], list[Any]] = {}
            for r in read_partition(b._instance, 0, ["bigint"], [desc]):
                slot = r.user_key[0] if kind == "map" else 0
                got.setdefault((r.key[0], slot), []).append(plain(r.value))
            assert got == {kv: [project(r, t, top) for r, t in w] for kv, w in model.items()}
        finally:
            e.close()


# --- incompatible changes at depth: refused naming the nested field's path ---------------

#: (kind, old, new, field named, change named)
NESTED_INCOMPATIBLE = [
    ("value", "s STRUCT<l: ARRAY<STRUCT<x: BIGINT, y: STRING>>>",
     "s STRUCT<l: ARRAY<STRUCT<y: STRING, x: INT>>>", "s.l.element.x", "narrowing BIGINT to INT"),
    ("list", "s STRUCT<t: STRUCT<m: MAP<INT, STRING>>>",
     "s STRUCT<t: STRUCT<m: MAP<BIGINT, STRING>>>", "s.t.m.key",
     "changing the map key type INT to BIGINT"),
    ("map", "m MAP<STRING, STRUCT<a: INT>>", "m MAP<STRING, STRUCT<a: INT, b: INT NOT NULL>>",
     "m.value.b", "adding NOT NULL field 'b'"),
    ("value", "a ARRAY<MAP<STRING, STRUCT<x: STRUCT<y: STRING>>>>",
     "a ARRAY<MAP<STRING, STRUCT<x: STRUCT<y: INT>>>>", "a.element.value.x.y",
     "changing type STRING to INT"),
    ("list", "m MAP<STRING, ARRAY<DOUBLE>>", "m MAP<STRING, ARRAY<FLOAT>>",
     "m.value.element", "narrowing DOUBLE to FLOAT"),
    ("map", "s STRUCT<k: MAP<STRUCT<a: INT>, INT>>", "s STRUCT<k: MAP<STRUCT<a: BIGINT>, INT>>",
     "s.k.key", "changing the map key type"),  # widening a key is a key change too
    ("value", "s STRUCT<t: STRUCT<u: INT>>", "s STRUCT<t: ARRAY<INT>>", "s.t",
     "changing type STRUCT<u: INT> to ARRAY<INT>"),
    ("value", "s STRUCT<t: STRUCT<u: INT>>", "s STRUCT<t: STRUCT<u: INT NOT NULL>>", "s.t.u",
     "making a nullable field NOT NULL"),
]


@pytest.mark.parametrize("kind,old,new,field,change", NESTED_INCOMPATIBLE,
                         ids=[f"{c[0]}:{c[3]}" for c in NESTED_INCOMPATIBLE])
def test_incompatible_nested_change_is_refused_naming_its_path(
        kind: str, old: str, new: str, field: str, change: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        e = Env(d + "/db")
        try:
            declare(e, kind, (), text=old)
            with pytest.raises(SchemaEvolutionError) as info:
                declare(e, kind, (), text=new)
            err = info.value
            assert err.state == "s" and err.field == field, (err.field, str(err))
            assert change in str(err) and field in str(err)
            # refused, nothing changed: the old schema still opens
            declare(e, kind, (), text=old)
        finally:
            e.close()


def test_a_nested_change_is_checked_against_every_earlier_version() -> None:
    """A nested field removed and added back narrower: the values of the version that
    still had it are BIGINT."""
    with tempfile.TemporaryDirectory() as d:
        e = Env(d + "/db")
        try:
            declare(e, "value", (), text="s ARRAY<STRUCT<a: BIGINT, b: INT>>")
            declare(e, "value", (), text="s ARRAY<STRUCT<b: INT>>")
            with pytest.raises(SchemaEvolutionError, match="narrowing BIGINT to INT") as info:
                declare(e, "value", (), text="s ARRAY<STRUCT<b: INT, a: INT>>")
            assert info.value.field == "s.element.a"
        finally:
            e.close()
