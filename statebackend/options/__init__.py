"""The options of the state backend: one frozen, validated, documented value.

:class:`StateBackendOptions` is built from keyword arguments, from a plain mapping
(:meth:`StateBackendOptions.from_dict`) or from a Spark configuration
(:meth:`StateBackendOptions.from_spark_conf`). Every value is checked when the object is
built: an unknown or misspelled name, a value of the wrong type or out of range raises
:class:`~statebackend.errors.OptionsError` naming the key, the value and what is accepted,
never a silent fallback. The object pickles (it ships to executors) and holds no handles.

Each option is declared once, below: its type, default, section (Spark/runtime,
checkpointing, local recovery, RocksDB, restart), checks and documentation. The class
docstring and the option reference in ``docs/options.md`` are generated from those
declarations (:mod:`statebackend.options.docs`; ``python -m statebackend.options
--write docs/options.md`` refreshes the file, and a test fails when it is stale).
What a kind of value accepts lives in :mod:`statebackend.options.values`; reading Spark
confs in :mod:`statebackend.options.conf`.

RocksDB tuning fields reach rocksdict in one place, :func:`statebackend.rocksdb.options.
to_rocksdict_options`. Spark keys: ``spark.statebackend.<field-name-with-dashes>``, and
``spark.statebackend.rocksdb.<...>`` for RocksDB tuning (``...rocksdb.block-cache-size``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionsError
from .conf import (
    check_location,
    check_storage_options,
    holds_spark_keys,
    spark_conf_kwargs,
    unknown,
)
from .docs import class_docstring
from .values import (
    _GIB,
    _INT_MAX,
    _KIB,
    _MAX_KEY_GROUPS,
    _MIB,
    _RESTART_PREFIX,
    AUTO_INLINE_RATIO,
    CHECKPOINT_MODES,
    COMPACTION_STYLES,
    COMPRESSION_CODECS,
    PLACEMENTS,
    PREDEFINED_PROFILES,
    RESTART_STRATEGIES,
    SECTIONS,
    SNAPSHOT_COMPRESSIONS,
    SPARK_CONF_PREFIX,
    TIMER_SERVICES,
    _Spec,
    default_max_parallelism,
    label,
    labels,
    normalise,
    parse_duration,
    parse_size,
    path_fields,
    short_key,
)

__all__ = [
    "COMPACTION_STYLES", "COMPRESSION_CODECS", "PLACEMENTS", "PREDEFINED_PROFILES",
    "RESTART_STRATEGIES", "SNAPSHOT_COMPRESSIONS", "SPARK_CONF_PREFIX",
    "StateBackendOptions", "TIMER_SERVICES", "CHECKPOINT_MODES", "check_location",
    "check_storage_options", "coerce_options", "default_max_parallelism", "parse_duration",
    "parse_size",
]


def _opt(default: Any, section: str, kind: str, *, doc: str, **spec: Any) -> Any:
    """One option: its default, section, kind of value, checks and documentation."""
    return field(default=default,
                 metadata={"spec": _Spec(kind=kind, doc=doc, section=section, **spec)})


@dataclass(frozen=True, kw_only=True)
class StateBackendOptions:
    # The docstring is generated from the declarations below (options.docs).

    # --- Spark and runtime ---------------------------------------------------------------
    parallelism: int | None = _opt(
        None, "runtime", "int", optional=True, low=1, high=_MAX_KEY_GROUPS, doc=(
            "Number of state partitions, one RocksDB instance each. None: "
            "`spark.sql.shuffle.partitions` when the query first starts. At most "
            "`max_parallelism`."))
    max_parallelism: int = _opt(
        128, "runtime", "int", low=1, high=_MAX_KEY_GROUPS, doc=(
            "Number of key groups, the largest parallelism the state can ever be rescaled "
            "to. Fixed for the life of the state; must be >= `parallelism`."))
    # --- checkpointing -------------------------------------------------------------------
    num_retained: int = _opt(
        3, "checkpointing", "int", low=1, high=10_000, doc=(
            "Completed checkpoints kept in durable storage; older ones, and the files only "
            "they reference, are deleted."))
    fencing: bool = _opt(
        True, "checkpointing", "bool", doc=(
            "One writer per state location: each run of a query takes a writer epoch by "
            "compare-and-set on the store (a local directory, `memory://` and S3 have one), "
            "a newer run of the same query fences the older one, and another query is "
            "refused at its start. False runs without it, for stores with no atomic "
            "create-if-absent; never let two queries write one location then. See "
            "docs/failure-semantics.md, \"One writer per location\"."))
    incremental: bool = _opt(
        True, "checkpointing", "bool", doc=(
            "Upload only the SST files a checkpoint adds. False: every checkpoint is a "
            "full, self-contained snapshot."))
    checkpoint_mode: str = _opt(
        "auto", "checkpointing", "choice", choices=CHECKPOINT_MODES, doc=(
            "What a batch makes durable before it emits output: a RocksDB snapshot's new "
            "SST files (`incremental`), or a changelog of its writes (`changelog`); `auto` "
            "chooses per partition and batch by the size of its state "
            "(`auto_changelog_size`). docs/options.md, \"Changelog checkpoints\"."))
    auto_changelog_size: int = _opt(
        32 * _MIB, "checkpointing", "size", low=0, high=2**50, doc=(
            "`checkpoint_mode=\"auto\"`: a partition whose last checkpoint references at "
            "least this many bytes checkpoints in changelog mode; one that was in changelog "
            "mode goes back to incremental below half of it. (`incremental=False`: never.)"))
    materialize_interval: int = _opt(
        10, "checkpointing", "int", low=1, high=1_000_000, doc=(
            "Changelog mode: materialize a snapshot in the background at least every this "
            "many batches (fewer changelogs to replay on restore, more bytes uploaded)."))
    materialize_changelog_ratio: float = _opt(
        0.25, "checkpointing", "float", low=0.01, high=100.0, doc=(
            "Changelog mode: also materialize when the changelogs since the last "
            "materialization exceed this share of the materialized state's size (and 1 MiB)."))
    materialize_inline_ratio: float | None = _opt(
        None, "checkpointing", "float", optional=True, low=0.0, high=100.0, doc=(
            "Changelog mode, above 0: each batch without a materialization in flight "
            "snapshots; new SST files <= this x its changelog (+64 KiB) go in its critical "
            "path instead of the changelog, a compaction's rewrite to the background; level "
            "sizing applies. 0: off. None: 2 under `auto`, 0 under `changelog`."))
    rolling_slices: int | None = _opt(
        None, "checkpointing", "int", optional=True, low=0, high=_MAX_KEY_GROUPS, doc=(
            "Changelog mode, above 0: each batch rewrites one of this many key-group "
            "slices of the partition (SST files) with its changelog instead of "
            "materializing snapshots, so what a batch makes durable follows what it "
            "changed. 0: off. None: on under `auto` (what it puts in changelog mode, and a "
            "first batch loading `auto_changelog_size`), the count derived per partition; "
            "off under `changelog`. docs/options.md, \"Rolling slices\"."))
    # --- local recovery ------------------------------------------------------------------
    local_recovery: bool = _opt(
        True, "local_recovery", "bool", doc=(
            "Keep a local copy (hard links) of each checkpoint and restore from it before "
            "falling back to durable storage."))
    local_dir: str | None = _opt(
        None, "local_recovery", "path", optional=True, doc=(
            "Working instances and local checkpoint copies. None: `statebackend-<uid>` "
            "under the executor's temp dir, resolved on each executor "
            "(`resolved_local_dir()`). `{executor_id}` in the path becomes the Spark "
            "executor id on each executor (`driver` in local mode; see \"One local directory "
            "per executor\" in docs/options.md)."))
    num_local_retained: int = _opt(
        2, "local_recovery", "int", low=1, high=10_000, doc=(
            "Local checkpoint copies kept per partition when `local_recovery` is on."))
    keep_instances_open: bool = _opt(
        True, "local_recovery", "bool", doc=(
            "Keep each partition's RocksDB instance open in the Python worker between "
            "micro-batches: its compactions complete and the next task of that partition "
            "in the same worker skips the restore. See \"Instances kept open\" in "
            "docs/options.md."))
    instance_idle_timeout: float = _opt(
        300.0, "local_recovery", "duration", low=0.05, doc=(
            "A kept-open instance no task used for this long is closed (and its directory "
            "deleted)."))
    # --- checkpointing: transfers and snapshots ------------------------------------------
    upload_threads: int = _opt(
        4, "checkpointing", "int", low=1, high=64, doc=(
            "Threads per task uploading files to durable storage."))
    download_threads: int = _opt(
        4, "checkpointing", "int", low=1, high=64, doc=(
            "Files a task downloads at once on restore (each CRC32-checked after it)."))
    snapshot_compression: str = _opt(
        "snappy", "checkpointing", "choice", choices=SNAPSHOT_COMPRESSIONS, doc=(
            "Compression of key-group blocks in full snapshots and savepoints."))
    # --- Spark and runtime ---------------------------------------------------------------
    timer_service: str = _opt(
        "rocksdb", "runtime", "choice", choices=TIMER_SERVICES, doc=(
            "Where timers live: a RocksDB column family (`rocksdb`, unbounded), or Python "
            "memory (`heap`: faster, bounded by memory, written into each checkpoint)."))
    placement: str = _opt(
        "auto", "runtime", "choice", choices=PLACEMENTS, doc=(
            "Where streaming operators' tasks run: `shuffle` (repartition + mapInPandas; "
            "any executor), `carrier` (inside a Spark stateful operator, whose scheduling "
            "keeps each partition on the executor holding its state) or `auto`: the plan "
            "the location's checkpoints recorded, else the carrier on a cluster (any master "
            "but `local[N]`) or with timers, else `shuffle`. Query shapes Spark refuses the "
            "carrier in, and batch DataFrames, use `shuffle` (docs/scaling.md)."))
    progress_metrics: bool = _opt(
        True, "runtime", "bool", doc=(
            "Report each micro-batch's backend metrics in the streaming query's progress "
            "(observed metrics, see \"Metrics in Spark's progress\" in docs/operations.md): "
            "every task adds one row carrying them in a hidden column, which the plan drops "
            "again. Off: nothing in the progress (the metrics are still written beside the "
            "checkpoints), and two streaming operators placed by the same key can be unioned "
            "in one stage without a repartition (Spark zips their partitions only when no "
            "projection follows them)."))
    # --- RocksDB (spark.statebackend.rocksdb.*) ------------------------------------------
    predefined_profile: str = _opt(
        "DEFAULT", "rocksdb", "choice", choices=PREDEFINED_PROFILES, upper=True, doc=(
            "Tuning profile applied first; every explicit RocksDB option overrides it "
            "(case-insensitive, stored upper-case; see \"Profiles\" in docs/options.md)."))
    block_cache_size: int | None = _opt(
        None, "rocksdb", "size", optional=True, low=64 * _KIB, doc=(
            "Block cache per instance. Only with `bounded_memory=False`; otherwise an error "
            "(the shared cache is sized from `memory_budget`). None: profile or RocksDB "
            "default (32m)."))
    block_size: int | None = _opt(
        None, "rocksdb", "size", optional=True, low=_KIB, high=256 * _MIB, doc=(
            "Uncompressed size of an SST data block. None: profile or RocksDB default (4k)."))
    write_buffer_size: int | None = _opt(
        None, "rocksdb", "size", optional=True, low=64 * _KIB, high=64 * _GIB, doc=(
            "Size of one memtable (per column family). None: profile or RocksDB default "
            "(64m)."))
    max_write_buffer_number: int | None = _opt(
        None, "rocksdb", "int", optional=True, low=2, high=64, doc=(
            "Memtables per column family (active + flushing) before writes stall; lowers a "
            "profile's `min_write_buffer_number_to_merge` below it. None: profile or "
            "RocksDB default (2; RocksDB needs at least 2)."))
    bloom_filter_bits_per_key: float | None = _opt(
        10.0, "rocksdb", "float", optional=True, low=1, high=100, doc=(
            "Full bloom filter per SST (about 1% false positives at 10). None: no filter, "
            "in every profile."))
    compaction_style: str | None = _opt(
        None, "rocksdb", "choice", optional=True, choices=COMPACTION_STYLES, doc=(
            "Compaction style. `fifo` **deletes the oldest files** once the total passes "
            "1 GiB: only for state whose old entries may be lost. None: profile or RocksDB "
            "default (level)."))
    compression_per_level: tuple[str, ...] | None = _opt(
        None, "rocksdb", "codecs", optional=True, doc=(
            "Codec per LSM level, level 0 first; deeper levels use the last entry. In Spark "
            "conf: comma-separated. None: RocksDB default (snappy everywhere)."))
    max_open_files: int | None = _opt(
        None, "rocksdb", "int", optional=True, low=20, high=4194304, extra_ok=(-1,), doc=(
            "File handles kept open; -1 keeps every file open (fastest, needs a high "
            "ulimit). RocksDB would clip other values to 20..4194304, so others are "
            "refused. None: profile or RocksDB default (-1)."))
    max_background_jobs: int | None = _opt(
        None, "rocksdb", "int", optional=True, low=1, high=256, doc=(
            "Concurrent flushes and compactions per instance. None: profile or RocksDB "
            "default (2)."))
    level_sizing: bool = _opt(
        True, "rocksdb", "bool", doc=(
            "Level compaction, once a column family's bottom level `B` reaches 256 MiB "
            "(below it RocksDB compacts level 0 straight into the bottom level): "
            "`max_bytes_for_level_base` = `B / 8` so the level above the bottom gets "
            "RocksDB's dynamic target `B / 10`, and `target_file_size_base` = `B / 64` (at "
            "most 64 MiB), re-derived on the open instance as the state grows. Keeps "
            "obsolete versions near 10% of the data instead of up to 256 MiB per column "
            "family. Incremental mode, and changelog mode with `materialize_inline_ratio` "
            "(materializations ten batches apart upload more: measured). Ignored "
            "when a profile sets `max_bytes_for_level_base` or the compaction style is not "
            "level."))
    rocksdb_statistics: bool = _opt(
        False, "rocksdb", "bool", doc=(
            "Count RocksDB's statistics (block cache hits and misses, write stalls, "
            "compaction time) for the `rocksdb_block_cache_*`, `rocksdb_write_stall_ms` and "
            "`rocksdb_compaction_ms` metrics in Spark's progress (docs/operations.md). Off "
            "by default: RocksDB then counts and times every operation, +3% instructions "
            "per key on the cheapest workload."))
    bounded_memory: bool = _opt(
        True, "rocksdb", "bool", doc=(
            "One block cache and write buffer manager per process, shared by every "
            "instance and bounded by `memory_budget` (see \"Bounded memory\" in docs/options.md)."))
    memory_budget: int = _opt(
        256 * _MIB, "rocksdb", "size", low=4 * _MIB, high=2**40, doc=(
            "Bytes per Python worker process for block cache, index/filter blocks and "
            "memtables of every instance (with `bounded_memory`)."))
    write_buffer_ratio: float = _opt(
        0.5, "rocksdb", "float", low=0.01, high=0.99, doc=(
            "Share of `memory_budget` for memtables when `bounded_memory` is on."))
    # --- restart strategies (spark.statebackend.restart-strategy.*) ----------------------
    restart_strategy: str = _opt(
        "exponential-delay", "restart", "choice", choices=RESTART_STRATEGIES,
        key=_RESTART_PREFIX + "type", doc=(
            "How a supervised query is restarted after a failure."))
    restart_fixed_delay_attempts: int = _opt(
        1, "restart", "int", low=0, high=_INT_MAX,
        key=_RESTART_PREFIX + "fixed-delay.attempts", doc=(
            "fixed-delay: restarts allowed in total before the query fails for good."))
    restart_fixed_delay: float = _opt(
        1.0, "restart", "duration", low=0, key=_RESTART_PREFIX + "fixed-delay.delay", doc=(
            "fixed-delay: pause between a failure and its restart."))
    restart_exponential_initial_backoff: float = _opt(
        1.0, "restart", "duration", low=0.001,
        key=_RESTART_PREFIX + "exponential-delay.initial-backoff", doc=(
            "exponential-delay: backoff of the first restart."))
    restart_exponential_max_backoff: float = _opt(
        60.0, "restart", "duration", low=0.001,
        key=_RESTART_PREFIX + "exponential-delay.max-backoff", doc=(
            "exponential-delay: largest backoff before jitter; at least the initial "
            "backoff."))
    restart_exponential_multiplier: float = _opt(
        1.5, "restart", "float", low=1.0, high=1000.0,
        key=_RESTART_PREFIX + "exponential-delay.backoff-multiplier", doc=(
            "exponential-delay: growth of the backoff per restart."))
    restart_exponential_jitter: float = _opt(
        0.1, "restart", "float", low=0.0, high=1.0,
        key=_RESTART_PREFIX + "exponential-delay.jitter-factor", doc=(
            "exponential-delay: each delay is drawn uniformly from backoff x "
            "[1 - jitter, 1 + jitter]."))
    restart_exponential_reset_threshold: float = _opt(
        3600.0, "restart", "duration", low=0.001,
        key=_RESTART_PREFIX + "exponential-delay.reset-backoff-threshold", doc=(
            "exponential-delay: a failure at least this long after the last restart resets "
            "the backoff and the attempt count."))
    restart_exponential_attempts: int = _opt(
        _INT_MAX, "restart", "int", low=0, high=_INT_MAX,
        key=_RESTART_PREFIX + "exponential-delay.attempts-before-reset-backoff", doc=(
            "exponential-delay: restarts allowed before a reset; one more failure is final."))
    restart_failure_rate_max_failures: int = _opt(
        1, "restart", "int", low=1, high=_INT_MAX,
        key=_RESTART_PREFIX + "failure-rate.max-failures-per-interval", doc=(
            "failure-rate: failures tolerated within the interval; one more is final."))
    restart_failure_rate_interval: float = _opt(
        60.0, "restart", "duration", low=0.001,
        key=_RESTART_PREFIX + "failure-rate.failure-rate-interval", doc=(
            "failure-rate: length of the sliding window failures are counted in."))
    restart_failure_rate_delay: float = _opt(
        1.0, "restart", "duration", low=0, key=_RESTART_PREFIX + "failure-rate.delay", doc=(
            "failure-rate: pause between a failure and its restart."))

    # --- validation -------------------------------------------------------------------

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = normalise(f.name, getattr(self, f.name), f.metadata["spec"])
            object.__setattr__(self, f.name, value)
        if self.parallelism is not None and self.parallelism > self.max_parallelism:
            key = label("parallelism")
            raise OptionsError(
                key, self.parallelism,
                f"Option {key!r}: invalid value {self.parallelism!r}; expected at most "
                f"max_parallelism ({self.max_parallelism}), the number of key groups. Set "
                f"{label('max_parallelism')!r} to at least {self.parallelism} (e.g. "
                f"{default_max_parallelism(self.parallelism)}); it cannot change later.")
        if self.bounded_memory and self.block_cache_size is not None:
            key = label("block_cache_size")
            raise OptionsError(
                key, self.block_cache_size,
                f"Option {key!r}: invalid value {self.block_cache_size!r}; it applies only "
                f"when bounded_memory is False. With bounded memory the shared cache is "
                f"sized from {label('memory_budget')!r}; set that instead, or set "
                f"{label('bounded_memory')!r} to False.")
        if self.restart_exponential_max_backoff < self.restart_exponential_initial_backoff:
            key = label("restart_exponential_max_backoff")
            raise OptionsError(
                key, self.restart_exponential_max_backoff,
                f"Option {key!r}: invalid value {self.restart_exponential_max_backoff!r}; "
                f"expected at least {label('restart_exponential_initial_backoff')!r} "
                f"({self.restart_exponential_initial_backoff:g}s).")

    # --- construction ------------------------------------------------------------------

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of every option, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def short_key(cls, name: str) -> str:
        """The short form of field ``name``: ``max-parallelism``, ``rocksdb.block-size``."""
        return short_key(name, _spec(name))

    @classmethod
    def spark_key(cls, name: str) -> str:
        """The Spark configuration key of field ``name``."""
        return SPARK_CONF_PREFIX + cls.short_key(name)

    @classmethod
    def describe(cls) -> list[dict[str, Any]]:
        """One row per option: name, Spark key, default, documentation, section."""
        return [{"name": f.name, "spark_key": cls.spark_key(f.name), "default": f.default,
                 "doc": f.metadata["spec"].doc, "section": f.metadata["spec"].section}
                for f in dataclasses.fields(cls)]

    @classmethod
    def sections(cls) -> dict[str, tuple[str, ...]]:
        """The option names of each section (``runtime``, ``checkpointing``,
        ``local_recovery``, ``rocksdb``, ``restart``), in declaration order."""
        return {section: tuple(f.name for f in dataclasses.fields(cls)
                               if f.metadata["spec"].section == section)
                for section in SECTIONS}

    def section(self, section: str) -> dict[str, Any]:
        """The values of one section's options, e.g. ``opts.section("rocksdb")``."""
        names = self.sections().get(section)
        if names is None:
            raise OptionsError("<section>", section, f"Unknown options section {section!r}; "
                               f"expected one of {', '.join(map(repr, SECTIONS))}.")
        return {name: getattr(self, name) for name in names}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StateBackendOptions:
        """Options from a mapping whose keys are field names or their short forms.

        Parameters
        ----------
        d : Mapping[str, Any]
            Keys: field names (``max_parallelism``) or Spark short forms
            (``max-parallelism``, ``rocksdb.block-cache-size``). Values are typed as for
            the constructor (sizes may be strings like ``"64m"``; ints must be ints).

        Raises
        ------
        UnknownOptionError
            For a key that names no option (the message suggests the closest one).
        OptionsError
            For a wrong type, a value out of range, or two keys naming the same option.
        """
        if not isinstance(d, Mapping):
            raise OptionsError("<options>", d, f"from_dict expects a mapping of option names "
                                               f"to values, got {type(d).__name__}.")
        by_key = {name: name for name in cls.field_names()}
        by_key.update({cls.short_key(name): name for name in cls.field_names()})
        kwargs: dict[str, Any] = {}
        keys: dict[str, str] = {}
        for key, value in d.items():
            name = by_key.get(key) if isinstance(key, str) else None
            if name is None:
                raise unknown(str(key), value, list(by_key))
            if name in kwargs:
                raise OptionsError(key, value, f"Option {key!r} given twice (also as "
                                               f"{keys[name]!r}); keep one of them.")
            kwargs[name] = value
            keys[name] = key
        with labels(keys):
            return cls(**kwargs)

    @classmethod
    def from_spark_conf(cls, conf: Any, **explicit: Any) -> StateBackendOptions:
        """Options from a Spark configuration, overridden by explicit keyword arguments.

        Precedence: ``explicit`` > ``spark.statebackend.*`` keys > defaults.
        ``parallelism`` falls back to ``spark.sql.shuffle.partitions`` when that key is
        present; ``max_parallelism``, when set nowhere and that parallelism exceeds 128,
        becomes ``default_max_parallelism(parallelism)`` (1.5x rounded up to a power of 2).

        Parameters
        ----------
        conf : Mapping or object with ``get(key, default)``
            A dict, a ``pyspark.SparkConf`` or ``spark.conf`` (no pyspark import needed).
            String values are parsed (``"4"``, ``"true"``, ``"64m"``, ``"none,snappy"``;
            an empty string or ``"none"`` means None for optional options). Unknown
            ``spark.statebackend.*`` keys are detected when ``conf`` can list its entries
            (a mapping, ``getAll``); a ``get``-only object is read key by key.
        **explicit
            Field names and values, typed as for the constructor.

        Raises
        ------
        UnknownOptionError
            For an unknown ``spark.statebackend.*`` key or explicit name.
        OptionsError
            For a value that does not parse or is out of range (naming the Spark key).
        """
        names = cls.field_names()
        for name, value in explicit.items():
            if name not in names:
                raise unknown(name, value, list(names))
        by_spark_key = {cls.spark_key(name): name for name in names}
        kwargs, keys = spark_conf_kwargs(conf, by_spark_key, _spec, explicit)
        kwargs.update(explicit)
        with labels(keys):
            return cls(**kwargs)

    # --- derived values and copies ---------------------------------------------------

    def with_(self, **changes: Any) -> StateBackendOptions:
        """A validated copy with ``changes`` applied (field names only)."""
        names = self.field_names()
        for name, value in changes.items():
            if name not in names:
                raise unknown(name, value, list(names))
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every option as a JSON-friendly dict (tuples become lists).

        ``StateBackendOptions.from_dict(opts.to_dict()) == opts`` holds.
        """
        out: dict[str, Any] = {}
        for name in self.field_names():
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    def fingerprint(self) -> str:
        """A stable 16-hex-digit digest of every option value.

        Equal options give equal fingerprints in any process and Python version (canonical
        JSON, SHA-256), so it can be stored next to state to detect configuration changes.
        """
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]

    def inline_ratio(self) -> float:
        """``materialize_inline_ratio`` in force: as set, else 2 under ``auto``, 0 otherwise."""
        if self.materialize_inline_ratio is not None:
            return self.materialize_inline_ratio
        return AUTO_INLINE_RATIO if self.checkpoint_mode == "auto" else 0.0

    def resolved_local_dir(self, executor_id: str | None = None) -> str:
        """``local_dir``, or the default under this machine's temp dir when it is None.

        Resolved when called (on the executor), not when the options are built on the
        driver, because the two machines' temp dirs (and executor ids) differ.

        Parameters
        ----------
        executor_id : str, optional
            Replaces ``{executor_id}`` in ``local_dir``; required when it has one (on an
            executor, :func:`statebackend.task.executor.current_executor_id`).
        """
        if self.local_dir is not None:
            path = self.local_dir
            if "executor_id" in path_fields(path):
                if executor_id is None:
                    raise OptionsError(
                        "local_dir", path, f"Option 'local_dir' {path!r} names the executor, "
                        f"but no executor id was given to resolve it; pass "
                        f"resolved_local_dir(executor_id=...).")
                if not executor_id or os.sep in executor_id or executor_id in (".", ".."):
                    raise OptionsError(
                        "local_dir", path, f"Option 'local_dir' {path!r}: executor id "
                        f"{executor_id!r} is not a usable path component; expected a "
                        f"non-empty name without {os.sep!r}.")
            path = path.format(executor_id=executor_id)
            return os.path.abspath(os.path.expanduser(path))
        suffix = f"-{os.getuid()}" if hasattr(os, "getuid") else ""
        return os.path.join(tempfile.gettempdir(), "statebackend" + suffix)


_dataclass_init = StateBackendOptions.__init__


@functools.wraps(_dataclass_init)
def _checked_init(self: StateBackendOptions, **kwargs: Any) -> None:
    # The generated __init__ would raise a bare TypeError for a misspelled keyword; ours
    # names the key and suggests the closest option, like every other entry point.
    names = StateBackendOptions.field_names()
    for key, value in kwargs.items():
        if key not in names:
            raise unknown(key, value, list(names))
    _dataclass_init(self, **kwargs)


StateBackendOptions.__init__ = _checked_init  # type: ignore[method-assign]


def coerce_options(options: Any) -> StateBackendOptions | None:
    """The backend's ``options`` argument as a :class:`StateBackendOptions` (or None).

    Accepted: None (read the session's Spark conf later); a ``StateBackendOptions``; a
    mapping of option names (``{"num_retained": 5}``, :meth:`StateBackendOptions.from_dict`);
    a Spark-conf-like mapping whose keys all start with ``spark.``
    (``{"spark.statebackend.num-retained": "5"}``) or a ``SparkConf``
    (:meth:`StateBackendOptions.from_spark_conf`: string values are parsed, other
    ``spark.*`` keys are ignored).

    Raises
    ------
    UnknownOptionError
        A key that names no option.
    OptionsError
        Any other type, a mapping that mixes ``spark.*`` keys with option names, or a
        value that is refused.
    """
    if options is None or isinstance(options, StateBackendOptions):
        return options
    if isinstance(options, Mapping):
        if holds_spark_keys(options):
            return StateBackendOptions.from_spark_conf(options)
        return StateBackendOptions.from_dict(options)
    if callable(getattr(options, "getAll", None)):  # a pyspark.SparkConf
        return StateBackendOptions.from_spark_conf(options)
    raise OptionsError("options", options,
                       f"options must be a StateBackendOptions, a mapping of option names "
                       f"or of Spark conf keys, or a SparkConf; got {type(options).__name__}.")


StateBackendOptions.__doc__ = class_docstring(dataclasses.fields(StateBackendOptions))


def _spec(name: str) -> _Spec:
    for f in dataclasses.fields(StateBackendOptions):
        if f.name == name:
            return f.metadata["spec"]  # type: ignore[no-any-return]
    raise unknown(name, None, list(StateBackendOptions.field_names()))
