"""Translation of :class:`~statebackend.options.StateBackendOptions` to rocksdict.

:func:`to_rocksdict_options` is the one place where our options become RocksDB settings.
It applies, in this order:

1. raw mode, ``create_if_missing`` and ``create_missing_column_families`` (always);
2. the predefined profile (:data:`PROFILES`);
3. every explicit tuning field that is not None, overriding the profile;
4. bounded memory: the process-wide shared block cache and write buffer manager.

While an instance runs, :func:`level_sizing` re-derives its level sizes from the state
it holds (``level_sizing=True``, the default; see "Level sizing" below).

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

Level sizing (``level_sizing=True``, the default)
-------------------------------------------------
Space amplification of level compaction is the bytes above the bottom level over the
bottom level: every entry there shadows an obsolete version below it. RocksDB sizes the
levels above the bottom from ``max_bytes_for_level_base`` (256 MiB by default) even with
``level_compaction_dynamic_level_bytes``: on a 500 MB partition the level above the
bottom grows to 256 MiB of newer versions before anything is compacted into the bottom
(measured: 1.34x the data after 40 batches of 1% churn and growing). :func:`level_sizing`
derives both knobs from the partition's bottom level ``B`` (RocksDB's live data estimate)
and sets them on the open instance (they are mutable options, applied per column family
whenever ``B`` moved by a quarter since the last time):

From ``B`` = 256 MiB (RocksDB's own base; below it level 0 compacts straight into the
bottom level, 1.07x the data at 80 MB, leaner than any level in between):

* ``max_bytes_for_level_base = B / 8``: the level above the bottom becomes
  the base level with RocksDB's dynamic target ``B / 10``, so obsolete versions stay near
  10% of the data (measured 1.14-1.20x at 500 MB, flat over 60 batches) and reach the
  bottom level, where tombstones are dropped, after about ten batches' worth of writes;
* ``target_file_size_base = min(B / 64, 64 MiB)``: files are slices of the key
  space, so a compaction into the bottom rewrites the slices under one upper file
  (measured 2-40 MB each) instead of the whole partition, and a snapshot shares most of
  its files with the previous one.

Incremental checkpoints, and changelog mode with ``materialize_inline_ratio > 0`` (a
materialization about every batch, as incremental mode uploads: :func:`sizes_levels`).
A changelog-mode materialization ten batches after the previous one uploads every file
written in between; slices rewritten continuously replace most of the bottom level in that
time, where RocksDB's own sizes rewrite it whole but rarely. Measured at 1 GiB
(BENCHMARKS.md, issue 24): durable peak 2.48x the data sized against 2.06x unsized, local
disk 3.69x against 2.44x, with materializations ten batches apart.
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
    "level_sizing",
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


_SETTERS = (  # (field of ProfileSettings, Options setter), applied when the field is set
    ("max_open_files", "set_max_open_files"),
    ("level_compaction_dynamic_level_bytes", "set_level_compaction_dynamic_level_bytes"),
    ("write_buffer_size", "set_write_buffer_size"),
    ("max_write_buffer_number", "set_max_write_buffer_number"),
    ("min_write_buffer_number_to_merge", "set_min_write_buffer_number_to_merge"),
    ("target_file_size_base", "set_target_file_size_base"),
    ("max_bytes_for_level_base", "set_max_bytes_for_level_base"),
)


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
    if s.compaction_style is not None:
        o.set_compaction_style(_COMPACTION[s.compaction_style]())
    for name, setter in _SETTERS:
        if getattr(s, name) is not None:
            getattr(o, setter)(getattr(s, name))
    if s.compression_per_level is not None:
        o.set_compression_per_level([_CODECS[c]() for c in s.compression_per_level])
    o.set_block_based_table_factory(_table_options(opts, s))
    if opts.bounded_memory:
        o.set_write_buffer_manager(
            shared_memory(opts.memory_budget, opts.write_buffer_ratio).write_buffer_manager)
    if opts.rocksdb_statistics:
        # Block cache hits and misses, write stall and compaction times for the metrics
        # (statebackend.metrics.ROCKSDB_STATISTICS). Opt-in: RocksDB then counts and times
        # every operation (+3% instructions per key per batch on noop, +6.6% with value
        # blocks: benchmarks/bench_instructions.py, BENCHMARKS.md).
        o.enable_statistics()
    return o


def _table_options(opts: StateBackendOptions, s: ProfileSettings) -> BlockBasedOptions:
    """Block-based table settings: block size, bloom filter, the (shared) block cache."""
    table = BlockBasedOptions()
    if s.block_size is not None:
        table.set_block_size(s.block_size)
    if s.bloom_filter_bits_per_key is not None:
        # Full (not block-based) filters: one filter per SST, fewer probes per lookup.
        # RocksDB takes a double here; rocksdict's stub says int.
        table.set_bloom_filter(s.bloom_filter_bits_per_key, False)  # type: ignore[arg-type]
    if opts.bounded_memory:
        table.set_block_cache(shared_memory(opts.memory_budget, opts.write_buffer_ratio).cache)
        # Index and filter blocks live in (and are charged to) the bounded cache instead
        # of unbounded heap; pinning L0 and top-level blocks keeps lookups from thrashing.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        table.set_pin_top_level_index_and_filter(True)
    elif s.block_cache_size is not None:
        table.set_block_cache(Cache(s.block_cache_size))
    return table


# --- level sizing: derived from the state the instance holds ------------------------------

SIZED_FROM = 256 * _MIB
"""RocksDB's own ``max_bytes_for_level_base``: below it level 0 compacts straight into
the bottom level (no level in between, obsolete versions only in level 0), which is
leaner in space than any level in between; sizes are derived from there up."""
FILE_SIZE_CEILING = 64 * _MIB
ROCKSDB_DEFAULTS = {"max_bytes_for_level_base": str(SIZED_FROM),
                    "target_file_size_base": str(64 * _MIB)}
RESIZE_STEP = 0.25
"""Re-derive the level sizes when the bottom level moved by this share since the last time."""


def sizes_levels(opts: StateBackendOptions) -> bool:
    """Whether the checkpoint mode uploads snapshots often enough for level sizing: every
    batch (incremental), or changelog mode materializing small snapshots inline (``auto``
    does by default; its large state is in changelog mode)."""
    return opts.checkpoint_mode == "incremental" or opts.inline_ratio() > 0


def level_sizing(opts: StateBackendOptions, bottom_bytes: int,
                 applied_for: int | None = None) -> dict[str, str] | None:
    """Mutable RocksDB options sizing one column family's levels from its bottom level.

    Parameters
    ----------
    opts : StateBackendOptions
        ``level_sizing`` off, changelog mode without ``materialize_inline_ratio``
        (:func:`sizes_levels`), an explicit ``compaction_style`` other than level, or a
        profile that sets ``max_bytes_for_level_base`` itself: nothing is derived.
    bottom_bytes : int
        The column family's live data (``rocksdb.estimate-live-data-size``: the bottom
        level and the files no lower file overlaps).
    applied_for : int or None
        ``bottom_bytes`` the sizes in force were derived from (None: RocksDB's own).

    Returns
    -------
    dict of str to str or None
        Settings for ``Rdict.set_options`` (see the module documentation), or None when
        nothing is to change: sizing is off, ``bottom_bytes`` is within
        :data:`RESIZE_STEP` of ``applied_for``, or under :data:`SIZED_FROM` with RocksDB's
        own sizes in force (a state shrunk below it gets them back).
    """
    if (not opts.level_sizing or not sizes_levels(opts)
            or (bottom_bytes < SIZED_FROM and applied_for is None)):
        return None  # off, changelog mode, or (the common case) small state
    s = effective_settings(opts)
    if s.compaction_style not in (None, "level") or s.max_bytes_for_level_base is not None:
        return None
    if bottom_bytes < SIZED_FROM:
        return dict(ROCKSDB_DEFAULTS)
    if applied_for is not None and abs(bottom_bytes - applied_for) <= RESIZE_STEP * applied_for:
        return None
    return {"max_bytes_for_level_base": str(bottom_bytes // 8),
            "target_file_size_base": str(min(FILE_SIZE_CEILING, bottom_bytes // 64))}
