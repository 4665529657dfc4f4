"""Native kernels against their pure-Python twins, per kernel and input kind (rows/s).

Run with pytest-benchmark::

    python -m pytest benchmarks/bench_kernels.py --benchmark-enable

or as a script for a compact table of rows/s and speed-ups (what native/README.md quotes)::

    python benchmarks/bench_kernels.py
"""

from __future__ import annotations

import random
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from statebackend.keys import kernels as _kernels
from statebackend.keys.groups import column_specs

N_STR = 100_000
N_INT = 1_000_000


def _strings(n: int) -> list[str]:
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-é"
    return [f"user-{rng.randrange(10**9)}-" + "".join(rng.choices(alphabet, k=rng.randrange(0, 12)))
            for _ in range(n)]


def _cases() -> dict[str, tuple[list[tuple], list[tuple], int]]:
    """name -> (hash specs, encode specs, rows), built once."""
    strs = _strings(N_STR)
    ints = np.random.default_rng(7).integers(-2**62, 2**62, N_INT)
    cases = {
        "str_list": column_specs([strs], ["string"]),
        "str_arrow": column_specs([pa.array(strs)], ["string"]),
        "int64": column_specs([ints], ["bigint"]),
        "int32": column_specs([ints.astype(np.int32)], ["int"]),
        "str_int64": column_specs([strs, ints[:N_STR]], ["string", "bigint"]),
    }
    return cases


_CASES: dict[str, Any] = {}


def case(name: str) -> tuple[list[tuple], list[tuple], int]:
    if not _CASES:
        _CASES.update(_cases())
    return _CASES[name]


IMPLS = {
    "native": (lambda: _kernels.native.hash_columns, lambda: _kernels.native.encode_keys),
    "python": (lambda: _kernels.py_hash_columns, lambda: _kernels.py_encode_keys),
}


def _hash_fn(impl: str, name: str) -> tuple[Callable[[], None], int]:
    specs, _, n = case(name)
    fn = IMPLS[impl][0]()
    out = np.empty(n, dtype=np.int32)

    def run() -> None:
        out.fill(42)
        fn(specs, out, 128)
    return run, n


def _encode_fn(impl: str, name: str) -> tuple[Callable[[], Any], int]:
    hspecs, especs, n = case(name)
    kgs = np.full(n, 42, dtype=np.int32)
    _kernels.py_hash_columns(hspecs, kgs, 128)  # real key groups (either impl: same result)
    fn = IMPLS[impl][1]()
    if name in ("int64", "int32"):  # encoding a million keys in Python takes long: use 100k
        especs = [(k, v[:N_STR], m) for k, v, m in especs]
        kgs = kgs[:N_STR]
        n = N_STR
    return (lambda: fn(especs, kgs)), n


@pytest.fixture(autouse=True)
def _need_native() -> None:
    assert _kernels.native is not None, "build the extension first: pip install -e ."


def _bench(benchmark: Any, group: str, made: tuple[Callable[[], Any], int]) -> None:
    run, n = made
    benchmark.group = group
    benchmark.extra_info["rows"] = n
    benchmark(run)


@pytest.mark.parametrize("impl", ["native", "python"])
@pytest.mark.parametrize("name", ["str_list", "str_arrow", "int64", "int32", "str_int64"])
def test_hash_columns(benchmark: Any, impl: str, name: str) -> None:
    _bench(benchmark, f"hash_columns[{name}]", _hash_fn(impl, name))


@pytest.mark.parametrize("impl", ["native", "python"])
@pytest.mark.parametrize("name", ["str_list", "str_arrow", "int64", "str_int64"])
def test_encode_keys(benchmark: Any, impl: str, name: str) -> None:
    _bench(benchmark, f"encode_keys[{name}]", _encode_fn(impl, name))


def _end_to_end_fn(impl: str, name: str) -> tuple[Callable[[], Any], int]:
    """``key_groups`` on a pandas Series / numpy column: conversion plus kernel."""
    import pandas as pd

    from statebackend.keys import groups as keygroups

    col: Any = pd.Series(_strings(N_STR)) if name == "str_series" else (
        np.random.default_rng(7).integers(-2**62, 2**62, N_INT))
    t = "string" if name == "str_series" else "bigint"
    fn = IMPLS[impl][0]()

    def run() -> None:
        saved = _kernels.hash_columns
        _kernels.hash_columns = fn
        try:
            keygroups.key_groups([col], [t], 128)
        finally:
            _kernels.hash_columns = saved
    return run, len(col)


@pytest.mark.parametrize("impl", ["native", "python"])
@pytest.mark.parametrize("name", ["str_series", "int64_numpy"])
def test_key_groups_end_to_end(benchmark: Any, impl: str, name: str) -> None:
    _bench(benchmark, f"key_groups[{name}]", _end_to_end_fn(impl, name))


# --- value blocks: one partition's 1,024 blocks holding 50,000 keys, 43,000 of them asked

N_BLOCK_KEYS = 50_000
N_ASKED = 43_000


def _blocks_case() -> tuple[list[bytes | None], np.ndarray, list[bytes], list[bytes]]:
    """(stored blocks, slot per asked key, asked keys, new values), as in one task."""
    if "blocks" not in _CASES:
        keys = [(i % 64).to_bytes(2, "big") + b"\x11user-%d" % i for i in range(N_BLOCK_KEYS)]
        ids = np.empty(len(keys), np.int64)
        _kernels.native.block_ids(keys, ids, 16)
        stored: dict[int, dict[bytes, bytes]] = {}
        for k, b in zip(keys, ids.tolist()):
            stored.setdefault(b, {})[k] = b"\x00" + (len(k) * 7).to_bytes(8, "little")
        order = sorted(stored)
        slot_of = {b: i for i, b in enumerate(order)}
        blobs: list[bytes | None] = [_kernels.py_pack_block(stored[b]) for b in order]
        asked = random.Random(7).sample(range(N_BLOCK_KEYS), N_ASKED)
        qkeys = [keys[i] for i in asked]
        slots = np.array([slot_of[int(ids[i])] for i in asked], np.int64)
        values = [b"\x00" + i.to_bytes(8, "little") for i in asked]
        _CASES["blocks"] = (blobs, slots, qkeys, values)
    return _CASES["blocks"]


def _blocks_fn(impl: str, name: str) -> tuple[Callable[[], Any], int]:
    blobs, slots, keys, values = _blocks_case()
    mod: Any = _kernels.native if impl == "native" else _kernels
    prefix = "" if impl == "native" else "py_"
    if name == "get":
        get = getattr(mod, prefix + "blocks_get")
        return (lambda: get(blobs, slots, keys)), len(keys)
    put = getattr(mod, prefix + "blocks_put")
    return (lambda: put(blobs, slots, keys, values)), len(keys)


@pytest.mark.parametrize("impl", ["native", "python"])
@pytest.mark.parametrize("name", ["get", "put"])
def test_value_blocks(benchmark: Any, impl: str, name: str) -> None:
    _bench(benchmark, f"blocks_{name}", _blocks_fn(impl, name))


# --- sorted_items: one task's dirty entries (43,000 encoded keys in groupby order) --------


def _sorted_items_fn(impl: str, name: str) -> tuple[Callable[[], Any], int]:
    if "dirty" not in _CASES:
        keys = sorted(b"\x0cuser-%07d" % i for i in random.Random(3).sample(range(10**6), N_ASKED))
        # key group first: the text order of a groupby is not the bytes order of the keys
        _CASES["dirty"] = {(zlib.crc32(k) % 128).to_bytes(2, "big") + k: b"\x00" * 9
                           for k in keys}
    entries = _CASES["dirty"]
    fn = _kernels.native.sorted_items if impl == "native" else _kernels.py_sorted_items
    return (lambda: fn(entries)), len(entries)


@pytest.mark.parametrize("impl", ["native", "python"])
def test_sorted_items(benchmark: Any, impl: str) -> None:
    _bench(benchmark, "sorted_items", _sorted_items_fn(impl, "dict"))


def _best(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    """Print rows/s of both implementations and the speed-up, per kernel and input."""
    rows = []
    for kernel, names, make in (("hash_columns", ["str_list", "str_arrow", "int64", "int32",
                                                  "str_int64"], _hash_fn),
                                ("encode_keys", ["str_list", "str_arrow", "int64", "str_int64"],
                                 _encode_fn),
                                ("key_groups", ["str_series", "int64_numpy"], _end_to_end_fn),
                                ("blocks", ["get", "put"], _blocks_fn),
                                ("sorted_items", ["dict"], _sorted_items_fn)):
        for name in names:
            rates = {}
            for impl in ("native", "python"):
                fn, n = make(impl, name)
                rates[impl] = n / _best(fn, 5 if impl == "native" else 2)
            rows.append((kernel, name, rates["native"], rates["python"],
                         rates["native"] / rates["python"]))
    print(f"{'kernel':<13} {'input':<10} {'native rows/s':>14} {'python rows/s':>14} {'speed-up':>9}")
    for kernel, name, nat, py, up in rows:
        print(f"{kernel:<13} {name:<10} {nat:>14,.0f} {py:>14,.0f} {up:>8.1f}x")


if __name__ == "__main__":
    sys.exit(main())
