"""to_rocksdict_options: every profile opens a real database, and the settings take effect.

RocksDB writes the options it actually runs with to an ``OPTIONS-<n>`` file in the
database directory; the tests parse it to check what each profile and override did.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from rocksdict import Options

from statebackend.options import PREDEFINED_PROFILES, StateBackendOptions
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.rocksdb.options import (
    PROFILES,
    effective_settings,
    memory_split,
    shared_memory,
    to_rocksdict_options,
)

S = StateBackendOptions
MIB = 1 << 20
Sections = dict[str, dict[str, str]]


def read_options_file(db_dir: Path) -> Sections:
    """The newest OPTIONS-<n> file of a database as {section: {key: value}}."""
    files = sorted(db_dir.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    assert files, f"no OPTIONS file in {db_dir}"
    sections: Sections = {}
    current: dict[str, str] = {}
    for line in files[-1].read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[(.*)\]", line)
        if m:
            current = sections.setdefault(m.group(1), {})
        elif "=" in line:
            k, v = line.split("=", 1)
            current[k.strip()] = v.strip()
    return sections


def open_write_read(path: Path, opts: StateBackendOptions) -> Sections:
    """Open with ``opts``, write and read two column families, reopen, return OPTIONS."""
    db_options = to_rocksdict_options(opts)
    with RocksDBInstance(str(path), db_options=db_options) as db:
        db.write({"default": {b"k1": b"v1"},
                  "state": {bytes([0, i]): b"x" * 100 for i in range(200)}})
        db.flush()
        assert db.multi_get("default", [b"k1", b"nope"]) == [b"v1", None]
        assert sum(1 for _ in db.scan_prefix("state", b"\x00")) == 200
    with RocksDBInstance(str(path), db_options=to_rocksdict_options(opts)) as db:
        assert db.multi_get("state", [bytes([0, 7])]) == [b"x" * 100]
    return read_options_file(path)


def cf(sections: Sections, name: str = "default") -> dict[str, str]:
    return sections[f'CFOptions "{name}"']


def table(sections: Sections, name: str = "default") -> dict[str, str]:
    return sections[f'TableOptions/BlockBasedTable "{name}"']


def test_profiles_cover_every_predefined_name() -> None:
    assert set(PROFILES) == set(PREDEFINED_PROFILES)


@pytest.mark.parametrize("bounded", [True, False], ids=["bounded", "unbounded"])
@pytest.mark.parametrize("profile", PREDEFINED_PROFILES)
def test_each_profile_opens_and_takes_effect(tmp_path: Path, profile: str, bounded: bool) -> None:
    o = S(predefined_profile=profile, bounded_memory=bounded)
    sections = open_write_read(tmp_path / "db", o)
    db_opts = sections["DBOptions"]
    for name in ("default", "state"):  # new column families get the same settings
        assert table(sections, name)["filter_policy"].startswith("bloomfilter")
        assert table(sections, name)["cache_index_and_filter_blocks"] == str(bounded).lower()
    if profile == "DEFAULT":
        assert db_opts["max_open_files"] == "-1" and db_opts["max_background_jobs"] == "2"
        assert table(sections)["block_size"] == "4096"
    else:
        assert db_opts["max_open_files"] == "-1"
        assert db_opts["max_background_jobs"] == "4"  # increase_parallelism(4)
    if profile.startswith("SPINNING"):
        for name in ("default", "state"):
            assert cf(sections, name)["compaction_style"] == "kCompactionStyleLevel"
            assert cf(sections, name)["level_compaction_dynamic_level_bytes"] == "true"
    if profile == "SPINNING_DISK_OPTIMIZED_HIGH_MEM":
        c = cf(sections, "state")
        assert table(sections, "state")["block_size"] == str(128 * 1024)
        assert c["write_buffer_size"] == str(64 * MIB)
        assert c["max_write_buffer_number"] == "4"
        assert c["min_write_buffer_number_to_merge"] == "3"
        assert c["target_file_size_base"] == str(256 * MIB)
        assert c["max_bytes_for_level_base"] == str(1024 * MIB)


def test_default_profile_is_rocksdb_defaults(tmp_path: Path) -> None:
    # Without a bloom filter and bounded memory, DEFAULT must write exactly the OPTIONS
    # that plain raw-mode rocksdict options write.
    ours = open_write_read(tmp_path / "ours",
                           S(bloom_filter_bits_per_key=None, bounded_memory=False))
    with RocksDBInstance(str(tmp_path / "plain"), db_options=Options(raw_mode=True)) as db:
        db.write({"state": {b"a": b"b"}})
    plain = read_options_file(tmp_path / "plain")
    for section in ("DBOptions", 'CFOptions "default"', 'CFOptions "state"',
                    'TableOptions/BlockBasedTable "state"'):
        assert ours[section] == plain[section], section


def test_block_cache_capacity(tmp_path: Path) -> None:
    with RocksDBInstance(str(tmp_path / "a"), db_options=to_rocksdict_options(
            S(predefined_profile="SPINNING_DISK_OPTIMIZED_HIGH_MEM", bounded_memory=False))) as db:
        assert db.property_int("rocksdb.block-cache-capacity") == 256 * MIB
    with RocksDBInstance(str(tmp_path / "b"), db_options=to_rocksdict_options(
            S(block_cache_size="48m", bounded_memory=False))) as db:
        assert db.property_int("rocksdb.block-cache-capacity") == 48 * MIB


def test_explicit_fields_override_the_profile(tmp_path: Path) -> None:
    o = S(predefined_profile="spinning_disk_optimized_high_mem", bounded_memory=False,
          block_size="16k", write_buffer_size="8m", max_write_buffer_number=3,
          max_open_files=500, max_background_jobs=1, compaction_style="universal",
          bloom_filter_bits_per_key=None, block_cache_size="16m")
    sections = open_write_read(tmp_path / "db", o)
    assert sections["DBOptions"]["max_open_files"] == "500"
    assert sections["DBOptions"]["max_background_jobs"] == "1"
    c = cf(sections)
    assert c["compaction_style"] == "kCompactionStyleUniversal"
    assert c["write_buffer_size"] == str(8 * MIB)
    assert c["max_write_buffer_number"] == "3"
    # The profile's 3 must stay below the explicit 3 buffers; RocksDB agrees.
    assert c["min_write_buffer_number_to_merge"] == "2"
    assert effective_settings(o).min_write_buffer_number_to_merge == 2
    assert table(sections)["block_size"] == "16384"
    assert table(sections)["filter_policy"] == "nullptr"  # None turns the filter off
    s = effective_settings(o)
    assert s.block_cache_size == 16 * MIB and s.level_compaction_dynamic_level_bytes is None


def test_compression_per_level(tmp_path: Path) -> None:
    codecs = ("none", "snappy", "lz4", "zstd", "zlib", "bz2", "lz4hc")
    sections = open_write_read(tmp_path / "db", S(compression_per_level=codecs))
    assert cf(sections)["compression_per_level"] == (
        "kNoCompression:kSnappyCompression:kLZ4Compression:kZSTD:kZlibCompression:"
        "kBZip2Compression:kLZ4HCCompression")
    short = open_write_read(tmp_path / "db2", S(compression_per_level=("none", "zstd")))
    assert cf(short, "state")["compression_per_level"] == "kNoCompression:kZSTD"


def test_raw_mode_and_create_flags(tmp_path: Path) -> None:
    open_write_read(tmp_path / "db", S())
    assert json.loads((tmp_path / "db" / "rocksdict-config.json").read_text())["raw_mode"] is True
    sections = read_options_file(tmp_path / "db")
    assert sections["DBOptions"]["create_if_missing"] == "true"
    assert sections["DBOptions"]["create_missing_column_families"] == "true"


# --- bounded memory ---------------------------------------------------------------------


def test_memory_split_like_flink() -> None:
    assert memory_split(300 * MIB, 0.5) == (250 * MIB, 100 * MIB)
    cache, wb = memory_split(256 * MIB, 0.5)
    # Peak = cache capacity + memtable overshoot of up to half the write buffer limit.
    assert cache + wb // 2 <= 256 * MIB
    assert memory_split(90 * MIB, 0.25)[1] == 15 * MIB


def test_effective_settings_under_bounded_memory() -> None:
    s = effective_settings(S(predefined_profile="SPINNING_DISK_OPTIMIZED_HIGH_MEM"))
    assert s.block_cache_size is None  # the shared cache replaces the profile's 256m
    assert s.block_size == 128 * 1024 and s.bloom_filter_bits_per_key == 10.0


def test_shared_memory_is_one_per_budget_and_thread_safe() -> None:
    budget = 37 * MIB  # a budget no other test uses, so this test creates it
    barrier = threading.Barrier(8)
    got: list[object] = []

    def grab() -> None:
        barrier.wait()
        got.append(shared_memory(budget, 0.5))

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(g is got[0] for g in got)
    assert shared_memory(budget, 0.5) is got[0]
    assert shared_memory(budget, 0.4) is not got[0]
    assert shared_memory(budget + MIB, 0.5) is not got[0]


def test_instances_share_the_bounded_cache_and_charge_memtables(tmp_path: Path) -> None:
    o = S(memory_budget="48m", write_buffer_ratio=0.5)
    shared = shared_memory(o.memory_budget, o.write_buffer_ratio)
    assert (shared.cache_capacity, shared.write_buffer_capacity) == memory_split(48 * MIB, 0.5)
    assert shared.write_buffer_manager.get_buffer_size() == shared.write_buffer_capacity
    with RocksDBInstance(str(tmp_path / "a"), db_options=to_rocksdict_options(o)) as a, \
            RocksDBInstance(str(tmp_path / "b"), db_options=to_rocksdict_options(o)) as b:
        for db in (a, b):
            assert db.property_int("rocksdb.block-cache-capacity") == shared.cache_capacity
        before = shared.write_buffer_manager.get_usage()
        a.write({"s": {i.to_bytes(4, "big"): b"v" * 200 for i in range(5000)}})
        b.write({"s": {i.to_bytes(4, "big"): b"w" * 200 for i in range(5000)}})
        used = shared.write_buffer_manager.get_usage()
        assert used > before  # both instances' memtables count against one manager
        # Memtable memory is charged to the cache: its usage covers the write buffers.
        assert shared.cache.get_usage() >= used
        assert a.multi_get("s", [(42).to_bytes(4, "big")]) == [b"v" * 200]
