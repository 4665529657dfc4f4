"""Level sizes derived from the state an instance holds, and the logical size estimate.

``level_sizing`` is pure; ``RocksDBInstance.size_levels`` sets its result on the open
column families (RocksDB writes a new OPTIONS file on every SetOptions, which the tests
read); a workload of overwrites shows what the sizing is for: obsolete versions stay near
a tenth of the data instead of RocksDB's fixed 256 MiB (here: its 25.6 MiB lower bound).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from statebackend.options import StateBackendOptions
from statebackend.rocksdb import options as rocks_options
from statebackend.rocksdb.instance import RocksDBInstance, _table_properties
from statebackend.rocksdb.options import (
    FILE_SIZE_CEILING,
    ROCKSDB_DEFAULTS,
    SIZED_FROM,
    level_sizing,
    to_rocksdict_options,
)
from tests.test_rocksdb_options import read_options_file

MIB = 1 << 20


def S(**kw) -> StateBackendOptions:  # noqa: N802 - reads like the class it builds
    """Options in incremental mode, the one level sizing applies to (whatever mode the
    suite runs in), unless ``kw`` names another."""
    kw.setdefault("checkpoint_mode", "incremental")
    return StateBackendOptions(**kw)


def test_sizes_follow_the_bottom_level() -> None:
    got = level_sizing(S(), 512 * MIB)
    assert got == {"max_bytes_for_level_base": str(64 * MIB),
                   "target_file_size_base": str(8 * MIB)}
    # below RocksDB's own base, level 0 compacts straight into the bottom: left alone
    assert level_sizing(S(), SIZED_FROM - 1) is None
    assert level_sizing(S(), SIZED_FROM) is not None
    # a state shrunk below it after being sized gets RocksDB's own sizes back
    assert level_sizing(S(), 100 * MIB, applied_for=512 * MIB) == ROCKSDB_DEFAULTS
    big = level_sizing(S(), 64 * 1024 * MIB)
    assert big is not None and big["target_file_size_base"] == str(FILE_SIZE_CEILING)
    assert big["max_bytes_for_level_base"] == str(8 * 1024 * MIB)


def test_resized_only_when_the_bottom_level_moved_by_a_quarter() -> None:
    assert level_sizing(S(), 1200 * MIB, applied_for=1000 * MIB) is None
    assert level_sizing(S(), 800 * MIB, applied_for=1000 * MIB) is None
    assert level_sizing(S(), 1260 * MIB, applied_for=1000 * MIB) is not None
    assert level_sizing(S(), 740 * MIB, applied_for=1000 * MIB) is not None


@pytest.mark.parametrize("opts", [
    S(level_sizing=False),
    S(compaction_style="universal"),
    S(compaction_style="fifo"),
    # the profile sizes the base level itself (1 GiB): an explicit choice wins
    S(predefined_profile="SPINNING_DISK_OPTIMIZED_HIGH_MEM"),
    # a materialization would upload every slice rewritten since the previous one
    S(checkpoint_mode="changelog", materialize_inline_ratio=0),
])
def test_nothing_derived_when_off_or_sized_elsewhere(opts: StateBackendOptions) -> None:
    assert level_sizing(opts, 512 * MIB) is None


def test_changelog_mode_sizes_levels_when_it_materializes_small_snapshots_inline() -> None:
    # materialize_inline_ratio > 0 materializes about every batch, as incremental mode
    # uploads: the slices a sized compaction rewrites are uploaded a few at a time
    opts = StateBackendOptions.from_spark_conf({
        "spark.statebackend.checkpoint-mode": "changelog",
        "spark.statebackend.materialize-inline-ratio": "2"})
    assert opts.materialize_inline_ratio == 2.0
    assert level_sizing(opts, 512 * MIB) == level_sizing(S(), 512 * MIB) is not None


def test_level_sizing_from_spark_conf() -> None:
    opts = StateBackendOptions.from_spark_conf(
        {"spark.statebackend.rocksdb.level-sizing": "false"})
    assert opts.level_sizing is False
    assert StateBackendOptions().level_sizing is True


def _cf_option(db_dir: Path, cf: str, key: str) -> str:
    return read_options_file(db_dir)[f'CFOptions "{cf}"'][key]


def _load(db: RocksDBInstance, cf: str, n: int, value: int = 1024, seed: int = 0) -> None:
    rng = random.Random(seed)
    for start in range(0, n, 5000):
        db.write({cf: {i.to_bytes(8, "big"): rng.randbytes(value)
                       for i in range(start, min(n, start + 5000))}})


def _settle(db: RocksDBInstance) -> None:
    """Wait for RocksDB's background flushes and compactions to finish."""
    for _ in range(3000):
        busy = [db.property_int(p, cf) for cf in db.column_family_names()
                for p in ("rocksdb.compaction-pending", "rocksdb.num-running-compactions",
                          "rocksdb.num-running-flushes")]
        if not any(busy):
            return
        time.sleep(0.01)


@pytest.fixture
def sized_from_1mib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Level sizing from 1 MiB of bottom level instead of 256 MiB: the regime of large
    state at a size a unit test can write."""
    monkeypatch.setattr(rocks_options, "SIZED_FROM", MIB)


def test_size_levels_sets_each_column_family_from_its_own_data(
        tmp_path: Path, sized_from_1mib: None) -> None:
    opts = S()
    path = tmp_path / "db"
    with RocksDBInstance(str(path), db_options=to_rocksdict_options(opts)) as db:
        db.column_family("small")
        _load(db, "big", 20_000)
        db.flush()
        _settle(db)
        changed = db.size_levels(opts)
        big = db.property_int("rocksdb.estimate-live-data-size", "big")
        assert big is not None and big > 20_000 * 1024
        assert set(changed) == {"big"}  # the empty one stays under the threshold
        assert _cf_option(path, "big", "max_bytes_for_level_base") == str(big // 8)
        assert _cf_option(path, "big", "target_file_size_base") == str(big // 64)
        assert _cf_option(path, "small", "max_bytes_for_level_base") == str(256 * MIB)
        # nothing moved: nothing set again; sizing off: nothing set
        assert db.size_levels(opts) == {}
        assert db.size_levels(S(level_sizing=False)) == {}
        # grown past a quarter: derived again from its own size, the other CF unchanged
        _load(db, "big", 40_000, seed=1)
        db.flush()
        _settle(db)
        grown = db.property_int("rocksdb.estimate-live-data-size", "big")
        assert grown is not None and grown > 1.25 * big
        assert set(db.size_levels(opts)) == {"big"}
        assert _cf_option(path, "big", "max_bytes_for_level_base") == str(grown // 8)
        assert _cf_option(path, "big", "target_file_size_base") == str(grown // 64)
        assert _cf_option(path, "small", "max_bytes_for_level_base") == str(256 * MIB)


def test_size_levels_gives_rocksdb_its_sizes_back_below_the_threshold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = S()
    path = tmp_path / "db"
    with RocksDBInstance(str(path), db_options=to_rocksdict_options(opts)) as db:
        _load(db, "s", 4000)
        db.flush()
        _settle(db)
        monkeypatch.setattr(rocks_options, "SIZED_FROM", MIB)
        assert set(db.size_levels(opts)) == {"s"}
        monkeypatch.setattr(rocks_options, "SIZED_FROM", 256 * MIB)
        assert db.size_levels(opts) == {"s": ROCKSDB_DEFAULTS}
        assert _cf_option(path, "s", "max_bytes_for_level_base") == str(256 * MIB)
        assert _cf_option(path, "s", "target_file_size_base") == str(FILE_SIZE_CEILING)
        assert db.size_levels(opts) == {}


def test_logical_bytes_counts_live_entries_not_obsolete_versions(tmp_path: Path) -> None:
    with RocksDBInstance(str(tmp_path / "db"), db_options=to_rocksdict_options(S())) as db:
        assert db.logical_bytes() == 0
        _load(db, "s", 4000, value=1000)
        db.flush()
        db.column_family("s").compact_range(None, None)  # to the bottom level, as over time
        _settle(db)
        exact = 4000 * (8 + 1000)
        assert abs(db.logical_bytes() - exact) <= 0.01 * exact
        # a quarter overwritten and flushed: more SST bytes, the same live entries
        db.write({"s": {i.to_bytes(8, "big"): os.urandom(1000) for i in range(0, 4000, 4)}})
        db.flush()
        sst = db.property_int("rocksdb.live-sst-files-size", "s")
        assert sst is not None and sst > 1.2 * exact
        assert abs(db.logical_bytes() - exact) <= 0.03 * exact


def test_table_properties_text() -> None:
    text = ("# data blocks=3; # entries=102000; raw key size=2448000; "
            "raw average key size=24.000000; filter policy name=N/A")
    assert _table_properties(text) == {"# data blocks": 3, "# entries": 102000,
                                       "raw key size": 2448000}
    assert _table_properties(None) == {}


def _overwrites(path: Path, opts: StateBackendOptions, keys: int, rounds: int, churn: float,
                level_base: int | None = None) -> list[float]:
    """SST bytes over the data after each round of overwrites (sized every round, as the
    task does at each checkpoint); ``level_base``: RocksDB's fixed base level size."""
    rng = random.Random(1)
    exact = keys * (8 + 1024)
    out = []
    db_options = to_rocksdict_options(opts)
    if level_base is not None:
        db_options.set_max_bytes_for_level_base(level_base)
    with RocksDBInstance(str(path), db_options=db_options) as db:
        _load(db, "s", keys)
        db.flush()
        _settle(db)
        for _ in range(rounds):
            db.size_levels(opts)
            picked = rng.sample(range(keys), int(keys * churn))
            db.write({"s": {i.to_bytes(8, "big"): rng.randbytes(1024) for i in picked}})
            db.flush()
            _settle(db)
            out.append(db.property_int("rocksdb.live-sst-files-size", "s") / exact)
    return out


def test_sizing_bounds_obsolete_versions_under_overwrites(
        tmp_path: Path, sized_from_1mib: None) -> None:
    # 80 MB of data under a fixed 40 MiB base level: RocksDB's 256 MiB over a 500 MB
    # partition, scaled down. 2% churn per round, 30 rounds: the level above the bottom
    # fills and drains several times.
    sized = _overwrites(tmp_path / "sized", S(), 80_000, 30, 0.02)
    fixed = _overwrites(tmp_path / "fixed", S(level_sizing=False), 80_000, 30, 0.02,
                        level_base=40 * MIB)
    assert max(sized[10:]) <= 1.3, sized
    assert max(fixed[10:]) > max(sized[10:]) + 0.1, (fixed, sized)
    # bounded in steady state: the last third no higher than the middle third's peak
    assert max(sized[20:]) <= max(sized[10:20]) + 0.05, sized


def test_a_bulk_load_is_compacted_before_the_snapshot(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from statebackend.rocksdb import instance as rocks_instance

    monkeypatch.setattr(rocks_instance, "BULK_LOAD_MIN_BYTES", 4 * MIB)
    with RocksDBInstance(str(tmp_path / "db"), db_options=to_rocksdict_options(S())) as db:
        assert db.compact_bulk_load() is False  # empty
        _load(db, "s", 8000)  # 8 MB, all of it in level 0 once flushed
        db.flush()
        assert db.property_int("rocksdb.num-files-at-level0", "s")
        assert db.compact_bulk_load() is True
        assert db.property_int("rocksdb.num-files-at-level0", "s") == 0
        # a batch of 1% of the state: left to RocksDB's own compactions
        _load(db, "s", 80, seed=2)
        db.flush()
        assert db.compact_bulk_load() is False
        assert db.property_int("rocksdb.num-files-at-level0", "s") == 1


def test_a_load_still_in_the_memtables_is_flushed_and_compacted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a load smaller than the write buffer: the snapshot's flush would put all of it in
    # level 0, to be rewritten (and uploaded again) by the first level-0 compaction
    from statebackend.rocksdb import instance as rocks_instance

    monkeypatch.setattr(rocks_instance, "BULK_LOAD_MIN_BYTES", 2 * MIB)
    with RocksDBInstance(str(tmp_path / "db"), db_options=to_rocksdict_options(S())) as db:
        _load(db, "s", 3000)  # 3 MB, in the 64 MB memtable
        assert not db.property_int("rocksdb.num-files-at-level0", "s")
        assert db.compact_bulk_load() is True
        assert db.property_int("rocksdb.num-files-at-level0", "s") == 0
        assert db.property_int("rocksdb.cur-size-all-mem-tables", "s") < MIB
        assert db.property_int("rocksdb.live-sst-files-size", "s") > 2 * MIB
        # once SST files exist the memtables are not counted (in changelog mode they hold
        # many batches' writes): even 3 MB more is left to RocksDB
        _load(db, "s", 3000, seed=2)
        assert db.compact_bulk_load() is False
        db.flush()
        assert db.property_int("rocksdb.num-files-at-level0", "s") == 1
