"""RocksDBInstance.multi_get: point reads or one scan, the same answer either way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from statebackend.options import StateBackendOptions
from statebackend.rocksdb import instance as inst_mod
from statebackend.rocksdb.instance import SCAN_MIN_KEYS, RocksDBInstance, scan_is_cheaper
from statebackend.rocksdb.options import to_rocksdict_options


def key(i: int) -> bytes:
    return (i % 128).to_bytes(2, "big") + b"k%07d" % i


def test_scan_is_chosen_only_for_large_requests_of_most_of_the_family() -> None:
    assert not scan_is_cheaper(SCAN_MIN_KEYS - 1, 10)  # small requests: point reads
    assert scan_is_cheaper(SCAN_MIN_KEYS, 0)
    assert scan_is_cheaper(10_000, 40_000)
    assert not scan_is_cheaper(10_000, 40_001)  # the scan would hold > 4x the request


@pytest.mark.parametrize("scan", [True, False])
def test_multi_get_equals_point_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      scan: bool) -> None:
    chosen: list[bool] = []
    real = inst_mod.scan_is_cheaper

    def spy(wanted: int, held: int) -> bool:
        chosen.append(real(wanted, held) if scan else False)
        return chosen[-1]

    monkeypatch.setattr(inst_mod, "scan_is_cheaper", spy)
    rng = np.random.default_rng(7)
    with RocksDBInstance(str(tmp_path / "db"),
                         db_options=to_rocksdict_options(StateBackendOptions())) as db:
        # flushed files, overwrites in a later file, deletes (tombstones), and writes
        # still in the memtable: every place a value can come from or be hidden in
        db.write({"s": {key(i): b"a%d" % i for i in range(6000)}, "other": {key(1): b"x"}})
        db.flush()
        db.write({"s": {key(i): b"b%d" % i for i in range(0, 6000, 3)}})
        db.flush()
        db.write({"s": {key(i): None for i in range(0, 6000, 7)}})
        db.write({"s": {key(i): b"c%d" % i for i in range(6000, 6500)}})
        wanted = [key(int(i)) for i in rng.permutation(7000)[:5000]] + [key(1), key(1)]
        got = db.multi_get("s", wanted)
        cf = db.column_family("s")
        assert got == [cf.get(k) for k in wanted]
        assert any(v is None for v in got) and any(v is not None for v in got)
        assert chosen == [scan]  # the path under test really ran
        assert db.multi_get("s", []) == []


def test_large_writes_in_key_order_give_the_same_state(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Large batches are applied in key order (compiled sorted_items); the state must be
    # exactly what the unsorted path writes: puts, overwrites, deletes, several families.
    from statebackend.keys import kernels as _kernels

    sorted_calls: list[int] = []
    real = _kernels.sorted_items

    def spy(entries):  # the compiled kernel when built, else the twin: both must be right
        sorted_calls.append(len(entries))
        return real(entries) if _kernels.BACKEND == "native" else _kernels.py_sorted_items(entries)

    monkeypatch.setattr(_kernels, "sorted_items", spy)
    monkeypatch.setattr(_kernels, "BACKEND", "native")
    order = [int(i) for i in np.random.default_rng(11).permutation(3000)]
    contents = []
    for threshold in (1, 10**9):
        monkeypatch.setattr(inst_mod, "SORTED_WRITE_MIN_ENTRIES", threshold)
        sorted_calls.clear()
        with RocksDBInstance(str(tmp_path / f"db{threshold}")) as db:
            db.write({"s": {key(i): b"a%d" % i for i in order},
                      "t": {key(i): b"t" for i in order[:50]}})
            db.flush()
            db.write({"s": {**{key(i): None for i in order[:700]},
                            **{key(i): b"b%d" % i for i in order[700:1500]}}})
            contents.append({cf: dict(db.column_family(cf).items()) for cf in ("s", "t")})
        assert bool(sorted_calls) == (threshold == 1)
    assert contents[0] == contents[1]
    assert len(contents[0]["s"]) == 2300 and contents[0]["s"][key(order[800])] == b"b%d" % order[800]


def test_writes_without_the_log_are_in_a_checkpoint(tmp_path: Path) -> None:
    """A restore replays without RocksDB's write-ahead log: the checkpoint taken next
    (flush, then hard links) must hold those writes."""
    inst = RocksDBInstance(str(tmp_path / "db"))
    try:
        inst.write({"default": {key(i): b"v%d" % i for i in range(1000)}}, wal=False)
        inst.write({"default": {key(3): None}}, wal=False)
        inst.create_native_checkpoint(str(tmp_path / "cp"))
    finally:
        inst.close()
    back = RocksDBInstance(str(tmp_path / "cp"))
    try:
        got = dict(back.column_family("default").items())
    finally:
        back.close()
    assert got == {key(i): b"v%d" % i for i in range(1000) if i != 3}
