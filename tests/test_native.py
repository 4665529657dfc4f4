"""The C kernels are byte-for-byte equal to their pure-Python twins, and the fallback works."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statebackend.keys import kernels as _kernels

native = _kernels.native

# Any Unicode but lone surrogates (which are not valid UTF-8 and raise in both).
TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40)
EXTREME_I64 = st.one_of(st.sampled_from([0, 1, -1, 2**63 - 1, -2**63, 2**62, -2**62 - 1,
                                         63, 64, -64, -65, 8191, 8192]),
                        st.integers(-2**63, 2**63 - 1))
EXTREME_I32 = st.one_of(st.sampled_from([0, 1, -1, 2**31 - 1, -2**31]),
                        st.integers(-2**31, 2**31 - 1))


def test_native_extension_is_built_and_selected() -> None:
    assert native is not None, "build it: python setup.py build_ext --inplace (or pip install -e .)"
    if os.environ.get("STATEBACKEND_NO_NATIVE", "") in ("", "0"):
        assert _kernels.BACKEND == "native"
        for name in _kernels._NATIVE_NAMES:
            assert getattr(_kernels, name) is getattr(native, name), name


@st.composite
def columns(draw: st.DrawFn, n: int, for_encode: bool) -> tuple:
    """One random column spec of n rows, of any kind the kernel takes."""
    kinds = ["int", "f32", "f64"] if for_encode else ["i32", "i64"]
    kind = draw(st.sampled_from(kinds + ["obj", "obj_bytes", "arrow", "large_arrow"]))
    mask = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=n, max_size=n)))
    mask_arr = None if mask is None else np.array(mask, dtype=bool)
    if kind in ("i32", "i64", "int"):
        values = draw(st.lists(EXTREME_I32 if kind == "i32" else EXTREME_I64, min_size=n,
                               max_size=n))
        return (kind, np.array(values, dtype=np.int32 if kind == "i32" else np.int64), mask_arr)
    if kind in ("f32", "f64"):
        bits = draw(st.lists(st.integers(0, 2**32 - 1 if kind == "f32" else 2**64 - 1),
                             min_size=n, max_size=n))
        return (kind, np.array(bits, dtype=np.uint32 if kind == "f32" else np.uint64), mask_arr)
    items = draw(st.lists(st.one_of(st.none(), TEXT if kind != "obj_bytes" else st.binary(max_size=40)),
                          min_size=n, max_size=n))
    if kind in ("obj", "obj_bytes"):
        # None, NaN and pd.NA are all nulls in an object column.
        null = draw(st.sampled_from([None, float("nan"), pd.NA]))
        return ("obj", [null if v is None else v for v in items])
    # Arrow: a slice of a longer array, so offsets do not start at 0.
    pad = draw(st.integers(0, 3))
    arr = pa.array(["pad"] * pad + items, pa.large_string() if kind == "large_arrow" else pa.string())
    arr = arr.slice(pad)
    _, obuf, dbuf = arr.buffers()
    width = np.int64 if kind == "large_arrow" else np.int32
    offsets = (np.frombuffer(obuf, dtype=width)[arr.offset:arr.offset + n + 1] if obuf is not None
               else np.zeros(n + 1, dtype=width))
    data = np.frombuffer(dbuf, dtype=np.uint8) if dbuf is not None else np.empty(0, np.uint8)
    valid = None if arr.null_count == 0 else np.asarray(
        arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return ("a64" if kind == "large_arrow" else "a32", offsets, data, valid)


@st.composite
def hash_cases(draw: st.DrawFn) -> tuple:
    n = draw(st.integers(0, 25))
    cols = draw(st.lists(columns(n, for_encode=False), min_size=1, max_size=3))
    seeds = draw(st.lists(EXTREME_I32, min_size=n, max_size=n))
    max_p = draw(st.sampled_from([0, 1, 7, 128, 1000, 32768]))
    return cols, np.array(seeds, dtype=np.int32), max_p


@settings(max_examples=200, deadline=None)
@given(hash_cases())
def test_hash_columns_equals_twin(case: tuple) -> None:
    cols, seeds, max_p = case
    a, b = seeds.copy(), seeds.copy()
    native.hash_columns(cols, a, max_p)
    _kernels.py_hash_columns(cols, b, max_p)
    assert a.tolist() == b.tolist()
    if max_p:
        assert ((0 <= a) & (a < max_p)).all()


@st.composite
def encode_cases(draw: st.DrawFn) -> tuple:
    n = draw(st.integers(0, 25))
    cols = draw(st.lists(columns(n, for_encode=True), min_size=0, max_size=3))
    kgs = draw(st.lists(st.integers(0, 0xFFFF), min_size=n, max_size=n))
    return cols, np.array(kgs, dtype=np.int32)


@settings(max_examples=200, deadline=None)
@given(encode_cases())
def test_encode_keys_equals_twin(case: tuple) -> None:
    cols, kgs = case
    assert native.encode_keys(cols, kgs) == _kernels.py_encode_keys(cols, kgs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), TEXT), min_size=1, max_size=30),
       st.lists(EXTREME_I64, min_size=30, max_size=30))
def test_long_strings_and_extreme_ints(strs: list, ints: list) -> None:
    strs = [s * 50 if s else s for s in strs]  # long values: multi-byte length varints
    n = len(strs)
    cols_h = [("obj", strs), ("i64", np.array(ints[:n], np.int64), None)]
    a, b = np.full(n, 42, np.int32), np.full(n, 42, np.int32)
    native.hash_columns(cols_h, a, 128)
    _kernels.py_hash_columns(cols_h, b, 128)
    assert a.tolist() == b.tolist()
    cols_e = [("obj", strs), ("int", np.array(ints[:n], np.int64), None)]
    kgs = a.astype(np.int32)
    assert native.encode_keys(cols_e, kgs) == _kernels.py_encode_keys(cols_e, kgs)


BAD_HASH = [
    ([("i32", np.zeros(2, np.int32), None)], np.zeros(3, np.int32), ValueError),  # rows
    ([("i64", np.zeros(3, np.int32), None)], np.zeros(3, np.int32), (TypeError, ValueError)),
    ([("nope", np.zeros(3, np.int32), None)], np.zeros(3, np.int32), ValueError),
    ([("obj", ["a", 3, "c"])], np.zeros(3, np.int32), TypeError),
    ([("obj", ["a", "\ud800", "c"])], np.zeros(3, np.int32), UnicodeEncodeError),
    ([("obj", ["a"])], np.zeros(1, np.int64), TypeError),  # out not int32
]


@pytest.mark.parametrize("cols, out, exc", BAD_HASH)
def test_hash_errors_match(cols: list, out: np.ndarray, exc: type) -> None:
    with pytest.raises(exc):
        native.hash_columns(cols, out.copy(), 0)
    with pytest.raises(exc):
        _kernels.py_hash_columns(cols, out.copy(), 0)


@pytest.mark.parametrize("offsets", [[0, 2, 100], [0, 3, 2], [-1, 2, 3]])
def test_bad_arrow_offsets_raise_in_both(offsets: list[int]) -> None:
    # Out of the 4-byte data buffer, decreasing, negative: never read out of bounds.
    cols = [("a32", np.array(offsets, dtype=np.int32), np.frombuffer(b"abcd", np.uint8), None)]
    for hash_impl, encode_impl in ((native.hash_columns, native.encode_keys),
                                   (_kernels.py_hash_columns, _kernels.py_encode_keys)):
        with pytest.raises(ValueError, match="offsets"):
            hash_impl(cols, np.zeros(2, np.int32), 0)
        with pytest.raises(ValueError, match="offsets"):
            encode_impl(cols, np.zeros(2, np.int32))


def test_encode_errors_match() -> None:
    for impl in (native.encode_keys, _kernels.py_encode_keys):
        with pytest.raises(OverflowError):
            impl([("obj", ["a"])], np.array([0x10000], np.int32))
        with pytest.raises(TypeError):
            impl([("obj", ["a"])], np.array([1], np.int64))
        with pytest.raises(ValueError):
            impl([("i32", np.zeros(1, np.int32), None)], np.zeros(1, np.int32))  # hash-only kind


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "STATEBACKEND_NO_NATIVE"}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_env_var_forces_twins_without_warning() -> None:
    r = _run("import warnings; warnings.simplefilter('error');"
             "import statebackend.keys.kernels as k, statebackend.keys.grouping_key;"
             "print(k.BACKEND, k.hash_columns is k.py_hash_columns,"
             " k.encode_keys is k.py_encode_keys, k.native is not None)",
             STATEBACKEND_NO_NATIVE="1")
    assert r.returncode == 0, r.stderr
    # The twins are bound; the compiled module stays importable for comparisons.
    assert r.stdout.split() == ["python", "True", "True", "True"]


def _import_with(stub: str, check: str = "") -> tuple[str, str]:
    """Import the kernels in a fresh interpreter after ``stub`` (which replaces the
    extension module): what ``check`` prints on the first line, and the first warning."""
    code = ("import sys, types, warnings\n" + stub +
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    import statebackend.keys.kernels as k\n" + check +
            "msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]\n"
            "print(k.BACKEND, k.encode_keys is k.py_encode_keys, len(msgs)); print(msgs[0])\n")
    r = _run(code)
    assert r.returncode == 0, r.stderr
    first, message = r.stdout.splitlines()[:2]
    return first, message


def test_stale_extension_warns_and_falls_back() -> None:
    first, message = _import_with(
        "old = types.ModuleType('statebackend._native')\n"
        "old.hash_columns = old.encode_keys = lambda *a: None  # a build from before blocks\n"
        "sys.modules['statebackend._native'] = old\n")
    assert first == "python True 1"
    assert "older than this package" in message and "block_ids" in message


def test_missing_extension_warns_once_and_falls_back() -> None:
    first, message = _import_with(
        "sys.modules['statebackend._native'] = None  # makes the import fail\n",
        "    import statebackend.keys.groups as kg, statebackend.keys.grouping_key\n"
        "    assert kg.key_groups([['a', 'b']], ['string']).tolist() == "
        "[kg.key_group(['a'], ['string']), kg.key_group(['b'], ['string'])]\n")
    assert first == "python True 1"
    assert "native kernels unavailable" in message and "pip install -e ." in message


# --- value blocks -------------------------------------------------------------------------

GROUPING_KEYS = st.lists(st.binary(min_size=2, max_size=24), max_size=60, unique=True)


@settings(max_examples=60, deadline=None)
@given(GROUPING_KEYS, st.integers(1, 0xFFFF))
def test_block_ids_equal_twin(keys: list[bytes], nbuckets: int) -> None:
    a, b = np.zeros(len(keys), np.int64), np.zeros(len(keys), np.int64)
    native.block_ids(keys, a, nbuckets)
    _kernels.py_block_ids(keys, b, nbuckets)
    assert a.tolist() == b.tolist()
    for k, bid in zip(keys, a.tolist()):
        kg, bucket = divmod(bid, nbuckets)
        assert kg == int.from_bytes(k[:2], "big") and 0 <= bucket < nbuckets


def test_block_ids_spread_keys_over_buckets() -> None:
    keys = [b"\x00\x05" + str(i).encode() for i in range(16_000)]
    ids = np.zeros(len(keys), np.int64)
    native.block_ids(keys, ids, 16)
    counts = np.bincount(ids - 5 * 16, minlength=16)
    assert counts.min() > 800 and counts.max() < 1200  # ~1000 each


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.binary(max_size=300), st.binary(max_size=300), max_size=40))
def test_blocks_round_trip(entries: dict[bytes, bytes]) -> None:
    packed = _kernels.py_pack_block(entries)
    for unpack in (native.unpack_block, _kernels.py_unpack_block):
        out = unpack(packed)
        assert out == entries and list(out) == sorted(entries)
    # a block written by the native put from nothing is the same bytes
    keys = list(entries)
    made = native.blocks_put([None], np.zeros(len(keys), np.int64), keys,
                             [entries[k] for k in keys])
    assert made == [packed if entries else None]


@pytest.mark.parametrize("blob, what", [
    (b"", "version"),
    (b"\x02\x00", "version"),
    (b"\x01", "varint"),
    (b"\x01\x01\x03ab", "past its end"),
    (b"\x01\x01\x01a\x05xy", "past its end"),
    (b"\x01\x01\x01a\x01xz", "trailing"),
    (b"\x01\x02\x01a\x01x\x01a\x01y", "twice"),
    (b"\x01\x02\x01b\x01x\x01a\x01y", "out of order"),
    (b"\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "varint"),
    (b"\x01\x09\x01a\x01x", "entry count"),
])
def test_corrupt_blocks_raise_in_both(blob: bytes, what: str) -> None:
    slots = np.zeros(1, np.int64)
    calls = [(f, args) for f, args in (
        (native.unpack_block, (blob,)), (_kernels.py_unpack_block, (blob,)),
        (native.blocks_get, ([blob], slots, [b"a"])),
        (_kernels.py_blocks_get, ([blob], slots, [b"a"])),
        (native.blocks_put, ([blob], slots, [b"a"], [b"v"])),
        (_kernels.py_blocks_put, ([blob], slots, [b"a"], [b"v"])))]
    for f, args in calls:
        with pytest.raises(ValueError, match=what):
            f(*args)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_blocks_get_put_equal_twins_and_a_dict(data: st.DataObject) -> None:
    nblocks = data.draw(st.integers(1, 4))
    pool = data.draw(st.lists(st.binary(max_size=6), min_size=1, max_size=12, unique=True))
    stored = [data.draw(st.dictionaries(st.sampled_from(pool), st.binary(max_size=5),
                                        max_size=6)) for _ in range(nblocks)]
    blobs = [_kernels.py_pack_block(d) if d else None for d in stored]
    n = data.draw(st.integers(0, 30))
    keys = [data.draw(st.sampled_from(pool)) for _ in range(n)]  # duplicates on purpose
    slots = np.array([data.draw(st.integers(0, nblocks - 1)) for _ in keys], np.int64)
    values = [data.draw(st.one_of(st.none(), st.binary(max_size=5))) for _ in keys]
    got = native.blocks_get(blobs, slots, keys)
    assert got == _kernels.py_blocks_get(blobs, slots, keys)
    assert got == [stored[s].get(k) for s, k in zip(slots.tolist(), keys)]
    new = native.blocks_put(blobs, slots, keys, values)
    assert new == _kernels.py_blocks_put(blobs, slots, keys, values)
    expected = [dict(d) for d in stored]
    for s, k, v in zip(slots.tolist(), keys, values):  # the last of equal keys wins
        if v is None:
            expected[s].pop(k, None)
        else:
            expected[s][k] = v
    assert [native.unpack_block(b) if b is not None else {} for b in new] == expected
    assert [b is None for b in new] == [not d for d in expected]


def test_blocks_argument_errors_match() -> None:
    one = np.zeros(1, np.int64)
    for get, put in ((native.blocks_get, native.blocks_put),
                     (_kernels.py_blocks_get, _kernels.py_blocks_put)):
        with pytest.raises(IndexError):
            get([None], np.array([1], np.int64), [b"a"])
        with pytest.raises(IndexError):
            put([None], np.array([-1], np.int64), [b"a"], [b"v"])
        with pytest.raises(ValueError):
            get([None], np.array([0], np.int32), [b"a"])
        with pytest.raises(ValueError):
            put([None], one, [b"a"], [])
        with pytest.raises(TypeError):
            put([None], one, [b"a"], ["text"])
        with pytest.raises(TypeError):
            get([None], one, ["text"])
        with pytest.raises(TypeError):
            get(["text"], one, [b"a"])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(0, 20), st.binary(min_size=240, max_size=240))
def test_split_fixed_equals_twin(width: int, n: int, data: bytes) -> None:
    buf = data[:width * n]
    assert native.split_fixed(buf, width) == _kernels.py_split_fixed(buf, width)
    assert b"".join(native.split_fixed(buf, width)) == buf
    for impl in (native.split_fixed, _kernels.py_split_fixed):
        with pytest.raises(ValueError):
            impl(b"abc", 2)
        with pytest.raises(ValueError):
            impl(b"abc", 0)


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.binary(max_size=24), st.one_of(st.none(), st.binary(max_size=8)),
                       max_size=60))
def test_sorted_items_equals_twin_and_sorted(entries: dict[bytes, bytes | None]) -> None:
    # keys of up to 24 bytes: equal 16-byte prefixes (the kernel's shortcut) and keys that
    # are prefixes of others must still order bytewise
    keys, values = native.sorted_items(entries)
    assert (keys, values) == _kernels.py_sorted_items(entries)
    assert keys == sorted(entries) and values == [entries[k] for k in keys]


def test_sorted_items_orders_shared_prefixes_and_refuses_other_keys() -> None:
    entries = {b"k" * 16 + b"b": 1, b"k" * 16: 2, b"k" * 16 + b"a": 3, b"k" * 15 + b"\x00": 4,
               b"": 5, b"\xff": 6}
    assert native.sorted_items(entries)[0] == sorted(entries)
    for impl in (native.sorted_items, _kernels.py_sorted_items):
        with pytest.raises(TypeError):
            impl({"text": b"v"})
        with pytest.raises(TypeError):
            impl([(b"k", b"v")])
