"""Translation of :class:`~statebackend.options.StateBackendOptions` to rocksdict.

:func:`to_rocksdict_options` is the one place where our options become RocksDB settings.
It applies, in this order:

1. raw mode, ``create_if_missing`` and ``create_missing_column_families`` (always);
2. the predefined profile (:data:`PROFILES`);
3. every explicit tuning field that is not None, overriding the profile;
4. bounded memory: the process-wide shared block cache and write buffer manager.

Predefined profiles (modelled on Flink's ``PredefinedOptions``)
----------------------------------------------------------------
``DEFAULT``
    Nothing beyond RocksDB's own defaults (and raw mode).
``SPINNING_DISK_OPTIMIZED``
    ``increase_parallelism(4)`` (4 background threads, ``max_background_jobs=4``),
    ``max_open_files=-1``, level compaction with
    ``level_compaction_dynamic_level_bytes=true``.
``SPINNING_DISK_OPTIMIZED_HIGH_MEM``
    Everything of ``SPINNING_DISK_OPTIMIZED``, plus ``block_cache_size=256m`` (only when
    ``bounded_memory`` is off: the shared cache replaces it), ``block_size=128k``,
    ``write_buffer_size=64m``, ``max_write_buffer_number=4``,
    ``min_write_buffer_number_to_merge=3``, ``target_file_size_base=256m``,
    ``max_bytes_for_level_base=1g`` and a bloom filter of 10 bits per key.
``FLASH_SSD_OPTIMIZED``
    ``increase_parallelism(4)`` and ``max_open_files=-1``.

The bloom filter is on in every profile because ``bloom_filter_bits_per_key`` defaults
to 10; setting it to None disables it whatever the profile.

Bounded memory (``bounded_memory=True``, the default)
-----------------------------------------------------
Every instance in a Python worker process shares one :class:`rocksdict.Cache` and one
:class:`rocksdict.WriteBufferManager` (created lazily, one pair per distinct
``(memory_budget, write_buffer_ratio)``), and memtable memory is charged to that cache,
so block cache, index and filter blocks and memtables stay under one limit. The budget
``M`` is split as Flink splits it, with write buffer ratio ``r`` (default 0.5):

* cache capacity ``= (3 - r) / 3 * M``  (213 MiB of the default 256 MiB),
* write buffer manager limit ``= 2 * r / 3 * M``  (85 MiB).

RocksDB lets memtables run up to 1.5x the write buffer manager's limit before its
flushes catch up; the overshoot beyond the limit (``r / 3 * M``) plus the cache capacity
(which already counts the memtables up to the limit) is ``M``. Index and filter blocks
are cached in (and charged to) the shared cache, with L0 and top-level ones pinned.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompactionStyle,
    DBCompressionType,
    Options,
    WriteBufferManager,
)

from ..options import StateBackendOptions

__all__ = [
    "PROFILES",
    "ProfileSettings",
    "SharedMemory",
    "effective_settings",
    "memory_split",
    "shared_memory",
    "to_rocksdict_options",
]

_KIB = 1024
_MIB = 1024 * _KIB
_GIB = 1024 * _MIB


@dataclass(frozen=True)
class ProfileSettings:
    """RocksDB settings of a profile, or the effective settings of an options object.

    None means "leave RocksDB's default".
    """

    increase_parallelism: int | None = None
    max_open_files: int | None = None
    max_background_jobs: int | None = None
    compaction_style: str | None = None
    level_compaction_dynamic_level_bytes: bool | None = None
    block_cache_size: int | None = None
    block_size: int | None = None
    write_buffer_size: int | None = None
    max_write_buffer_number: int | None = None
    min_write_buffer_number_to_merge: int | None = None
    target_file_size_base: int | None = None
    max_bytes_for_level_base: int | None = None
    bloom_filter_bits_per_key: float | None = None
    compression_per_level: tuple[str, ...] | None = None


_SPINNING = ProfileSettings(increase_parallelism=4, max_open_files=-1, compaction_style="level",
                            level_compaction_dynamic_level_bytes=True)

PROFILES: dict[str, ProfileSettings] = {
    "DEFAULT": ProfileSettings(),
    "SPINNING_DISK_OPTIMIZED": _SPINNING,
    "SPINNING_DISK_OPTIMIZED_HIGH_MEM": replace(
        _SPINNING, block_cache_size=256 * _MIB, block_size=128 * _KIB,
        write_buffer_size=64 * _MIB, max_write_buffer_number=4,
        min_write_buffer_number_to_merge=3, target_file_size_base=256 * _MIB,
        max_bytes_for_level_base=1 * _GIB, bloom_filter_bits_per_key=10.0),
    "FLASH_SSD_OPTIMIZED": ProfileSettings(increase_parallelism=4, max_open_files=-1),
}
"""What each predefined profile sets (see the module documentation)."""

# Tuning fields of StateBackendOptions that override the profile field of the same name.
_OVERRIDABLE = ("max_open_files", "max_background_jobs", "compaction_style", "block_cache_size",
                "block_size", "write_buffer_size", "max_write_buffer_number",
                "compression_per_level")


def effective_settings(opts: StateBackendOptions) -> ProfileSettings:
    """The profile of ``opts`` with every explicit (non-None) tuning field applied on top.

    Under bounded memory ``block_cache_size`` is None: the shared cache replaces it. A
    profile's ``min_write_buffer_number_to_merge`` is lowered below an explicit, smaller
    ``max_write_buffer_number``.
    """
    settings = PROFILES[opts.predefined_profile]
    changes: dict[str, Any] = {name: getattr(opts, name) for name in _OVERRIDABLE
                                  if getattr(opts, name) is not None}
    # The field defaults to 10 bits and None is the only way to turn the filter off, so
    # its value always wins over the profile's.
    changes["bloom_filter_bits_per_key"] = opts.bloom_filter_bits_per_key
    if opts.bounded_memory:
        changes["block_cache_size"] = None
    settings = replace(settings, **changes)
    mwb, merge = settings.max_write_buffer_number, settings.min_write_buffer_number_to_merge
    if mwb is not None and merge is not None and merge >= mwb:
        # RocksDB would silently lower it anyway (a memtable must stay free for writes);
        # doing it here keeps effective_settings equal to what RocksDB runs with.
        settings = replace(settings, min_write_buffer_number_to_merge=max(1, mwb - 1))
    if settings.compaction_style not in (None, "level"):
        # Dynamic level sizing is a level-compaction setting; a profile's True must not
        # leak into universal/fifo.
        settings = replace(settings, level_compaction_dynamic_level_bytes=None)
    return settings


# --- bounded memory: one cache and write buffer manager per process -------------------


@dataclass(frozen=True)
class SharedMemory:
    """The process-wide block cache and write buffer manager for one memory budget."""

    cache: Cache
    write_buffer_manager: WriteBufferManager
    cache_capacity: int
    write_buffer_capacity: int


def memory_split(memory_budget: int, write_buffer_ratio: float) -> tuple[int, int]:
    """``(cache capacity, write buffer manager limit)`` in bytes for a budget.

    Parameters
    ----------
    memory_budget : int
        Total bytes for RocksDB in one process.
    write_buffer_ratio : float
        Share of the budget for memtables, 0 < ratio < 1.

    Returns
    -------
    tuple of int
        ``((3 - r) / 3 * M, 2 * r / 3 * M)``; see the module documentation for why.
    """
    cache = int((3 - write_buffer_ratio) * memory_budget / 3)
    write_buffers = int(2 * memory_budget * write_buffer_ratio / 3)
    return cache, write_buffers


_SHARED: dict[tuple[int, float], SharedMemory] = {}
_SHARED_LOCK = threading.Lock()


def shared_memory(memory_budget: int, write_buffer_ratio: float) -> SharedMemory:
    """The shared cache and write buffer manager of this process for a budget.

    Created on first use and kept for the life of the process (RocksDB requires the cache
    to outlive every instance using it). Thread-safe: concurrent callers get one object.
    """
    key = (int(memory_budget), float(write_buffer_ratio))
    shared = _SHARED.get(key)
    if shared is not None:
        return shared
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            cache_capacity, wb_capacity = memory_split(*key)
            cache = Cache(cache_capacity)
            # allow_stall=False: a full budget triggers flushes rather than blocking writers,
            # as in Flink; the 1.5x headroom in memory_split covers the overshoot.
            wbm = WriteBufferManager.new_write_buffer_manager_with_cache(wb_capacity, False, cache)
            shared = SharedMemory(cache, wbm, cache_capacity, wb_capacity)
            _SHARED[key] = shared
    return shared


# --- the translation ---------------------------------------------------------------------

_COMPACTION = {"level": DBCompactionStyle.level, "universal": DBCompactionStyle.universal,
               "fifo": DBCompactionStyle.fifo}
_CODECS = {"none": DBCompressionType.none, "snappy": DBCompressionType.snappy,
           "lz4": DBCompressionType.lz4, "lz4hc": DBCompressionType.lz4hc,
           "zstd": DBCompressionType.zstd, "zlib": DBCompressionType.zlib,
           "bz2": DBCompressionType.bz2}


def to_rocksdict_options(opts: StateBackendOptions) -> Options:
    """rocksdict ``Options`` (database and column families) for ``opts``.

    Parameters
    ----------
    opts : StateBackendOptions
        Validated options; its profile and tuning fields are applied as described in the
        module documentation.

    Returns
    -------
    rocksdict.Options
        Raw mode, ``create_if_missing`` and ``create_missing_column_families`` set. Pass it
        as ``db_options`` to :class:`~statebackend.rocksdb.instance.RocksDBInstance`; every
        column family uses the same settings.
    """
    s = effective_settings(opts)
    o = Options(raw_mode=True)
    o.create_if_missing(True)
    o.create_missing_column_families(True)

    if s.increase_parallelism is not None:
        o.increase_parallelism(s.increase_parallelism)
    # After increase_parallelism, which also sets max_background_jobs: explicit wins.
    if s.max_background_jobs is not None:
        o.set_max_background_jobs(s.max_background_jobs)
    if s.max_open_files is not None:
        o.set_max_open_files(s.max_open_files)
    if s.compaction_style is not None:
        o.set_compaction_style(_COMPACTION[s.compaction_style]())
    if s.level_compaction_dynamic_level_bytes is not None:
        o.set_level_compaction_dynamic_level_bytes(s.level_compaction_dynamic_level_bytes)
    if s.write_buffer_size is not None:
        o.set_write_buffer_size(s.write_buffer_size)
    if s.max_write_buffer_number is not None:
        o.set_max_write_buffer_number(s.max_write_buffer_number)
    if s.min_write_buffer_number_to_merge is not None:
        o.set_min_write_buffer_number_to_merge(s.min_write_buffer_number_to_merge)
    if s.target_file_size_base is not None:
        o.set_target_file_size_base(s.target_file_size_base)
    if s.max_bytes_for_level_base is not None:
        o.set_max_bytes_for_level_base(s.max_bytes_for_level_base)
    if s.compression_per_level is not None:
        o.set_compression_per_level([_CODECS[c]() for c in s.compression_per_level])

    table = BlockBasedOptions()
    if s.block_size is not None:
        table.set_block_size(s.block_size)
    if s.bloom_filter_bits_per_key is not None:
        # Full (not block-based) filters: one filter per SST, fewer probes per lookup.
        # RocksDB takes a double here; rocksdict's stub says int.
        table.set_bloom_filter(s.bloom_filter_bits_per_key, False)  # type: ignore[arg-type]
    if opts.bounded_memory:
        shared = shared_memory(opts.memory_budget, opts.write_buffer_ratio)
        table.set_block_cache(shared.cache)
        # Index and filter blocks live in (and are charged to) the bounded cache instead
        # of unbounded heap; pinning L0 and top-level blocks keeps lookups from thrashing.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        table.set_pin_top_level_index_and_filter(True)
        o.set_write_buffer_manager(shared.write_buffer_manager)
    elif s.block_cache_size is not None:
        table.set_block_cache(Cache(s.block_cache_size))
    o.set_block_based_table_factory(table)
    if opts.rocksdb_statistics:
        # Block cache hits and misses, write stall and compaction times for the metrics
        # (statebackend.metrics.ROCKSDB_STATISTICS). Opt-in: at RocksDB's default level it
        # costs +3% instructions per key per batch on the cheapest workload (noop) and
        # +6.6% on value blocks (benchmarks/bench_instructions.py, BENCHMARKS.md).
        o.enable_statistics()
    return o
