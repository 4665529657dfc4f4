"""Keyed state hot paths: per-row vs batched access, vectorised calls, codecs.

Run with ``python -m pytest benchmarks/bench_state.py --benchmark-enable``. Each
benchmarked call processes ``N`` keys (or rows); ops/s = N / mean time, also stored in
``extra_info['ops_per_s']``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statebackend.keys.values import RowCodec
from statebackend.model.schema import parse_ddl
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.state import KeyedStateBackend

N = 10_000
KEYS = [(i % 128).to_bytes(2, "big") + b"user-%06d" % i for i in range(N)]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedStateBackend]:
    path: Path = tmp_path_factory.mktemp("bench-state") / "db"
    inst = RocksDBInstance(str(path))
    b = KeyedStateBackend(inst, clock=lambda: 1_000)
    b.value_state("count", "count BIGINT, last STRING").put_many(
        KEYS, [(i, "seen") for i in range(N)])
    lst = b.list_state("events", "id BIGINT")
    m = b.map_state("m", "k STRING", "v BIGINT")
    for i, k in enumerate(KEYS):
        b.set_current_key(k)
        lst.put([(i,), (i + 1,)])
        m.updateValue(("a",), (i,))
    b.flush()
    inst.flush()  # memtables -> SST files: reads go through the block cache like real state
    yield b
    b.close()
    inst.close()


def _fresh_reads(b: KeyedStateBackend) -> None:
    """Empty the read caches so every run measures RocksDB reads, not dict hits."""
    b.flush()
    for c in b._clean.values():
        c.clear()


def _run(benchmark: Any, b: KeyedStateBackend, fn: Callable[[], None], n: int = N) -> None:
    benchmark.pedantic(fn, setup=lambda: _fresh_reads(b), rounds=5, iterations=1)
    benchmark.extra_info["ops_per_s"] = round(n / benchmark.stats.stats.mean)


# --- value state -------------------------------------------------------------------------


def test_value_get_update_per_row(benchmark: Any, backend: KeyedStateBackend) -> None:
    count = backend.value_state("count", "count BIGINT, last STRING")

    def run() -> None:
        for k in KEYS:
            backend.set_current_key(k)
            c = count.get()
            count.update(((c[0] if c else 0) + 1, "seen"))
        backend.flush()

    _run(benchmark, backend, run)


def test_value_get_update_prefetched(benchmark: Any, backend: KeyedStateBackend) -> None:
    count = backend.value_state("count", "count BIGINT, last STRING")

    def run() -> None:
        backend.prefetch(KEYS, ["count"])
        for k in KEYS:
            backend.set_current_key(k)
            c = count.get()
            count.update(((c[0] if c else 0) + 1, "seen"))
        backend.flush()

    _run(benchmark, backend, run)


def test_value_get_many_put_many(benchmark: Any, backend: KeyedStateBackend) -> None:
    count = backend.value_state("count", "count BIGINT, last STRING")

    def run() -> None:
        old = count.get_many(KEYS)
        count.put_many(KEYS, [((c[0] if c else 0) + 1, "seen") for c in old])
        backend.flush()

    _run(benchmark, backend, run)


# --- list and map state ---------------------------------------------------------------------


@pytest.mark.parametrize("prefetch", [False, True], ids=["per-row", "prefetched"])
def test_list_append_and_read(benchmark: Any, backend: KeyedStateBackend, prefetch: bool) -> None:
    lst = backend.list_state("events", "id BIGINT")

    def run() -> None:
        if prefetch:
            backend.prefetch(KEYS, ["events"])
        for i, k in enumerate(KEYS):
            backend.set_current_key(k)
            lst.put([(i,), (i + 1,)])  # keep the lists short across rounds
            lst.appendValue((i,))
            for _ in lst.get():
                pass
        backend.flush()

    _run(benchmark, backend, run)


def test_map_update_and_get(benchmark: Any, backend: KeyedStateBackend) -> None:
    m = backend.map_state("m", "k STRING", "v BIGINT")

    def run() -> None:
        for i, k in enumerate(KEYS):
            backend.set_current_key(k)
            v = m.getValue(("a",))
            m.updateValue(("a",), ((v[0] if v else 0) + i,))
        backend.flush()

    _run(benchmark, backend, run)


def test_map_iterate(benchmark: Any, backend: KeyedStateBackend) -> None:
    m = backend.map_state("m", "k STRING", "v BIGINT")

    def run() -> None:
        for k in KEYS:
            backend.set_current_key(k)
            for _ in m.iterator():
                pass

    _run(benchmark, backend, run)


# --- codec -------------------------------------------------------------------------------

_CODEC = RowCodec(parse_ddl("count BIGINT, last STRING, score DOUBLE, flag BOOLEAN"), "bench")
_ROWS = [(i, f"user-{i}", i * 0.5, i % 2 == 0) for i in range(N)]
_ENCODED = [_CODEC.encode(r) for r in _ROWS]
_FIXED = RowCodec(parse_ddl("a BIGINT, b BIGINT, c DOUBLE"), "bench")
_FIXED_ROWS = [(i, -i, i * 0.25) for i in range(N)]


def _codec_run(benchmark: Any, fn: Callable[[], Any]) -> None:
    benchmark.pedantic(fn, rounds=10, iterations=1)
    benchmark.extra_info["ops_per_s"] = round(N / benchmark.stats.stats.mean)


def test_codec_encode(benchmark: Any) -> None:
    enc = _CODEC.encode
    _codec_run(benchmark, lambda: [enc(r) for r in _ROWS])


def test_codec_decode(benchmark: Any) -> None:
    dec = _CODEC.decode
    _codec_run(benchmark, lambda: [dec(b) for b in _ENCODED])


def test_codec_encode_fixed_width(benchmark: Any) -> None:
    enc = _FIXED.encode
    _codec_run(benchmark, lambda: [enc(r) for r in _FIXED_ROWS])
