"""The options of the state backend: one frozen, validated, documented value.

:class:`StateBackendOptions` is built from keyword arguments, from a plain mapping
(:meth:`StateBackendOptions.from_dict`) or from a Spark configuration
(:meth:`StateBackendOptions.from_spark_conf`). Every value is checked when the object is
built: an unknown or misspelled name, a value of the wrong type or out of range raises
:class:`~statebackend.errors.OptionsError` naming the key, the value and what is accepted,
never a silent fallback. The object pickles (it ships to executors) and holds no handles.

RocksDB tuning fields are translated to rocksdict in exactly one place,
:func:`statebackend.rocksdb.options.to_rocksdict_options`; ``docs/options.md`` lists every
option with its Spark key and tuning advice.

Spark keys are ``spark.statebackend.<field-name-with-dashes>`` for general options and
``spark.statebackend.rocksdb.<field-name-with-dashes>`` for RocksDB tuning, e.g.
``spark.statebackend.max-parallelism`` and ``spark.statebackend.rocksdb.block-cache-size``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import hashlib
import json
import math
import numbers
import os
import re
import string
import tempfile
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .errors import OptionsError, UnknownOptionError

__all__ = [
    "COMPACTION_STYLES",
    "COMPRESSION_CODECS",
    "PREDEFINED_PROFILES",
    "RESTART_STRATEGIES",
    "SNAPSHOT_COMPRESSIONS",
    "SPARK_CONF_PREFIX",
    "StateBackendOptions",
    "TIMER_SERVICES",
    "CHECKPOINT_MODES",
    "check_location",
    "check_storage_options",
    "coerce_options",
    "default_max_parallelism",
    "parse_duration",
    "parse_size",
]

SPARK_CONF_PREFIX = "spark.statebackend."
"""Prefix of every Spark configuration key this package reads."""

_ROCKSDB_PREFIX = "rocksdb."
_SHUFFLE_PARTITIONS_KEY = "spark.sql.shuffle.partitions"

PREDEFINED_PROFILES = (
    "DEFAULT",
    "SPINNING_DISK_OPTIMIZED",
    "SPINNING_DISK_OPTIMIZED_HIGH_MEM",
    "FLASH_SSD_OPTIMIZED",
)
SNAPSHOT_COMPRESSIONS = ("snappy", "none")
TIMER_SERVICES = ("rocksdb", "heap")
PLACEMENTS = ("shuffle", "carrier")
CHECKPOINT_MODES = ("incremental", "changelog")
COMPACTION_STYLES = ("level", "universal", "fifo")
COMPRESSION_CODECS = ("none", "snappy", "lz4", "zstd", "zlib", "bz2", "lz4hc")
# placeholders a path option may hold, replaced where the path is resolved
PATH_PLACEHOLDERS = ("executor_id",)
RESTART_STRATEGIES = ("none", "fixed-delay", "exponential-delay", "failure-rate")
_RESTART_PREFIX = "restart-strategy."
_INT_MAX = 2**31 - 1

# Key groups are stored as a big-endian prefix of every key, and the rescale math needs a
# fixed upper bound; 32768 is the same bound Flink uses and keeps the prefix at 2 bytes.
_MAX_KEY_GROUPS = 32768
_KIB = 1024
_MIB = 1024 * 1024
_GIB = 1024 * 1024 * 1024

# --- sizes ----------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": _KIB, "m": _MIB, "g": _GIB, "t": 1024 * _GIB}


def parse_size(value: int | str) -> int:
    """A size in bytes from an int or a string such as ``"64m"``, ``"1g"`` or ``"512KiB"``.

    Parameters
    ----------
    value : int or str
        Bytes as an int, or digits followed by an optional unit ``k``, ``m``, ``g``, ``t``
        (powers of 1024; case-insensitive; ``b``, ``kb``, ``kib`` ... also accepted).

    Returns
    -------
    int
        The size in bytes.

    Raises
    ------
    ValueError
        If ``value`` is not an int or a size string (bools and floats are refused).
    """
    if isinstance(value, bool):
        raise ValueError(f"a bool is not a size: {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    raise ValueError(f"not a size: {value!r}")


# --- durations ------------------------------------------------------------------------

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|min|mins|m|h|d)?\s*$",
                          re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "min": 60.0,
                   "mins": 60.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: float | str) -> float:
    """A duration in seconds from a number of seconds or a string such as ``"500ms"``,
    ``"10 s"``, ``"1min"``, ``"1h"``.

    Parameters
    ----------
    value : float or int or str
        Seconds as a number, or a number followed by an optional unit ``ms``, ``s``,
        ``min`` (or ``m``), ``h``, ``d`` (case-insensitive; no unit means seconds).

    Returns
    -------
    float
        The duration in seconds.

    Raises
    ------
    ValueError
        If ``value`` is not a finite number or a duration string (bools are refused).
    """
    if isinstance(value, bool):
        raise ValueError(f"a bool is not a duration: {value!r}")
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise ValueError(f"not a finite duration: {value!r}")
        return float(value)
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m:
            return float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "").lower()]
    raise ValueError(f"not a duration: {value!r}")


# --- per-field specification ------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    """How one field is validated, documented and named in a Spark configuration."""

    kind: str  # "int", "size", "float", "duration", "bool", "choice", "codecs", "path"
    doc: str
    optional: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    upper: bool = False  # choices are stored upper-case (else lower-case)
    rocksdb: bool = False  # lives under spark.statebackend.rocksdb.
    extra_ok: tuple[Any, ...] = ()  # values allowed outside [low, high], e.g. -1
    key: str | None = None  # explicit short key (e.g. restart-strategy.type), else derived


def _opt(default: Any, doc: str, kind: str, **spec: Any) -> Any:
    return field(default=default, metadata={"spec": _Spec(kind=kind, doc=doc, **spec)})


# Which key names a field in error messages: ``from_dict`` and ``from_spark_conf`` set it
# so an error names the key the user wrote, not our field name. A ContextVar keeps this
# correct when several threads build options at once.
_LABELS: ContextVar[Mapping[str, str] | None] = ContextVar("_LABELS", default=None)


def _label(name: str) -> str:
    labels = _LABELS.get()
    return labels.get(name, name) if labels else name


@contextlib.contextmanager
def _labels(labels: Mapping[str, str]) -> Iterator[None]:
    token = _LABELS.set(labels)
    try:
        yield
    finally:
        _LABELS.reset(token)


def _fmt_bytes(n: float) -> str:
    for unit, size in (("g", _GIB), ("m", _MIB), ("k", _KIB)):
        if n >= size and n % size == 0:
            return f"{int(n // size)}{unit}"
    return str(int(n))


def _accepted(spec: _Spec) -> str:
    """Human words for what a field accepts, used in every error message."""
    none = " or None" if spec.optional else ""
    if spec.kind == "bool":
        text = "a bool (True/False)"
    elif spec.kind == "choice":
        text = "one of " + ", ".join(repr(c) for c in spec.choices) + " (case-insensitive)"
    elif spec.kind == "codecs":
        text = ("a non-empty tuple/list (at most 7 entries, one per level) of codec names from "
                + ", ".join(repr(c) for c in COMPRESSION_CODECS))
    elif spec.kind == "path":
        text = ("a non-empty path string (placeholders: "
                + ", ".join("{" + f + "}" for f in PATH_PLACEHOLDERS) + ")")
    else:
        what = {"int": "an int", "float": "a number",
                "size": "a size in bytes (int, or a string like '64m', '1g', '512k')",
                "duration": "a duration in seconds (number, or a string like '500ms', "
                            "'10s', '1min', '1h')"}[spec.kind]
        fmt = _fmt_bytes if spec.kind == "size" else (lambda x: f"{x:g}")
        bounds = []
        if spec.low is not None:
            bounds.append(f">= {fmt(spec.low)}")
        if spec.high is not None:
            bounds.append(f"<= {fmt(spec.high)}")
        text = what + (" " + " and ".join(bounds) if bounds else "")
        if spec.extra_ok:
            text += " (or " + " or ".join(repr(v) for v in spec.extra_ok) + ")"
    return text + none


def _fail(name: str, value: Any, spec: _Spec, why: str = "") -> OptionsError:
    key = _label(name)
    reason = f" ({why})" if why else ""
    return OptionsError(key, value, f"Option {key!r}: invalid value {value!r}{reason}; "
                                    f"expected {_accepted(spec)}.")


def _check_range(name: str, value: float, shown: Any, spec: _Spec) -> None:
    if value in spec.extra_ok:
        return
    if (spec.low is not None and value < spec.low) or (spec.high is not None and value > spec.high):
        raise _fail(name, shown, spec, "out of range")


def _normalise(name: str, value: Any, spec: _Spec) -> Any:
    """The canonical form of ``value`` for field ``name``, or raise OptionsError."""
    if value is None:
        if spec.optional:
            return None
        raise _fail(name, value, spec, "this option cannot be None")
    kind = spec.kind
    if kind == "bool":
        if not isinstance(value, bool):
            raise _fail(name, value, spec, f"got {type(value).__name__}")
        return value
    if kind == "int":
        # bool is an int subclass and 4.0 "looks" integral: both are mistakes, not ints.
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise _fail(name, value, spec, f"got {type(value).__name__}")
        value = int(value)
        _check_range(name, value, value, spec)
        return value
    if kind == "size":
        try:
            size = parse_size(value)
        except ValueError:
            raise _fail(name, value, spec, f"got {type(value).__name__}") from None
        _check_range(name, size, value, spec)
        return size
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise _fail(name, value, spec, f"got {type(value).__name__}")
        value = float(value)
        if not math.isfinite(value):
            raise _fail(name, value, spec, "not finite")
        _check_range(name, value, value, spec)
        return value
    if kind == "duration":
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise _fail(name, value, spec, f"got {type(value).__name__}") from None
        _check_range(name, seconds, value, spec)
        return seconds
    if kind == "choice":
        if not isinstance(value, str):
            raise _fail(name, value, spec, f"got {type(value).__name__}")
        canon = value.strip().upper() if spec.upper else value.strip().lower()
        if canon not in spec.choices:
            close = difflib.get_close_matches(canon, spec.choices, n=1)
            raise _fail(name, value, spec, f"did you mean {close[0]!r}?" if close else "")
        return canon
    if kind == "codecs":
        if isinstance(value, str) or not isinstance(value, (tuple, list)):
            raise _fail(name, value, spec, "pass a tuple of codec names, one per level")
        if not 1 <= len(value) <= 7:
            raise _fail(name, value, spec, f"{len(value)} entries")
        out = []
        for codec in value:
            if not isinstance(codec, str) or codec.strip().lower() not in COMPRESSION_CODECS:
                raise _fail(name, value, spec, f"unknown codec {codec!r}")
            out.append(codec.strip().lower())
        return tuple(out)
    if kind == "path":
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip():
            raise _fail(name, value, spec)
        try:
            fields = _path_fields(value)
        except ValueError as exc:  # an unmatched brace
            raise _fail(name, value, spec, f"{exc}; write '{{{{' for a literal brace") from exc
        if not fields <= set(PATH_PLACEHOLDERS):
            bad = ", ".join(sorted(repr("{" + f + "}") for f in fields - set(PATH_PLACEHOLDERS)))
            raise _fail(name, value, spec, f"unknown placeholder {bad}; known: "
                        + ", ".join("{" + f + "}" for f in PATH_PLACEHOLDERS))
        return value
    raise AssertionError(f"unknown kind {kind}")  # pragma: no cover - a bug in _Spec


def _path_fields(path: str) -> set[str]:
    """The ``{name}`` placeholders of a path (ValueError on an unmatched brace)."""
    return {f for _text, f, _spec, _conv in string.Formatter().parse(path) if f is not None}


# --- the options object -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StateBackendOptions:
    """Every setting of the state backend, validated at construction.

    Build it with keyword arguments, :meth:`from_dict` or :meth:`from_spark_conf`; change
    it with :meth:`with_`. Each field's documentation (also in ``docs/options.md``) is in
    its ``metadata["spec"].doc``; :meth:`describe` returns them all.

    Parameters
    ----------
    parallelism : int or None, default None
        Number of state partitions (one RocksDB instance each). None: the value of
        ``spark.sql.shuffle.partitions`` when the query first starts. 1..32768 and at most
        ``max_parallelism``.
    max_parallelism : int, default 128
        Number of key groups, the upper bound for any future ``parallelism``; fixed for
        the life of the state. 1..32768.
    num_retained : int, default 3
        Completed checkpoints kept in durable storage (>= 1).
    fencing : bool, default True
        One writer per state location (writer epochs by compare-and-set on the store).
    incremental : bool, default True
        Upload only new SST files per checkpoint (False: full snapshot every time).
    checkpoint_mode : {"incremental", "changelog"}, default "incremental"
        What a batch makes durable before its output: a RocksDB snapshot's new SST files
        ("incremental"), or only a changelog of its own writes ("changelog"), with snapshots
        materialized in the background.
    materialize_interval : int, default 10
        Changelog mode: materialize at least every this many batches.
    materialize_changelog_ratio : float, default 0.25
        Changelog mode: also materialize when the changelogs since the last
        materialization exceed this share of the materialized state (and 1 MiB).
    local_recovery : bool, default True
        Keep a local copy of each checkpoint and restore from it first.
    local_dir : str or None, default None
        Directory for working instances and local copies. None: a ``statebackend-<uid>``
        directory under the system temp dir, resolved on the executor
        (:meth:`resolved_local_dir`). ``{executor_id}`` in the path is replaced on each
        executor by its Spark executor id (``driver`` in local mode), so executors that
        share a machine keep separate local state, as separate hosts would.
    num_local_retained : int, default 2
        Local checkpoint copies kept per partition (>= 1).
    keep_instances_open : bool, default True
        Keep each partition's RocksDB instance open in the Python worker between
        micro-batches (compactions complete; the next task in the same worker skips the
        restore). See :mod:`statebackend.recovery.resident`.
    instance_idle_timeout : float, default 300.0
        Seconds after which a kept-open instance no task used is closed.
    upload_threads, download_threads : int, default 4
        Threads per task transferring files to/from durable storage (1..64).
    snapshot_compression : {"snappy", "none"}, default "snappy"
        Compression of key-group blocks in full snapshots and savepoints.
    placement : {"shuffle", "carrier"}, default "shuffle"
        How streaming operators place partitions on executors: repartition + mapInPandas
        ("shuffle"), or inside a Spark stateful operator so that Spark's state-store
        scheduling keeps each partition on the executor holding its state ("carrier",
        docs/scaling.md "Placement"). Batch DataFrames always use "shuffle".
    timer_service : {"rocksdb", "heap"}, default "rocksdb"
        Where timers live: a RocksDB column family, or the Python heap (faster, bounded by
        memory, written into checkpoints).
    predefined_profile : str, default "DEFAULT"
        RocksDB profile: DEFAULT, SPINNING_DISK_OPTIMIZED, SPINNING_DISK_OPTIMIZED_HIGH_MEM,
        FLASH_SSD_OPTIMIZED (case-insensitive, stored upper-case). See
        :mod:`statebackend.rocksdb.options` for what each sets.
    block_cache_size, block_size, write_buffer_size : int or None
        RocksDB sizes in bytes (ints or strings like ``"64m"``); None: profile/RocksDB
        default. ``block_cache_size`` only when ``bounded_memory`` is False.
    max_write_buffer_number : int or None
        Memtables per column family before writes stall (2..64).
    bloom_filter_bits_per_key : float or None, default 10.0
        Bloom filter bits per key (1..100); None disables the filter.
    compaction_style : {"level", "universal", "fifo"} or None
    compression_per_level : tuple of str or None
        Codec per LSM level, last entry repeated for deeper levels.
    max_open_files : int or None
        File handles RocksDB keeps open (20..4194304), -1 for unlimited.
    max_background_jobs : int or None
        Flush and compaction threads (1..256).
    bounded_memory : bool, default True
        Share one block cache and write buffer manager per process, bounded by
        ``memory_budget``.
    memory_budget : int, default 256 MiB
        Bytes per process shared by the block cache and write buffers of every instance.
    write_buffer_ratio : float, default 0.5
        Share of ``memory_budget`` for write buffers (0 < ratio < 1).
    restart_strategy : {"none", "fixed-delay", "exponential-delay", "failure-rate"}
        How a supervised query (:func:`statebackend.supervisor.supervise`) is restarted
        after a failure; default "exponential-delay". Spark key
        ``spark.statebackend.restart-strategy.type``; the fields below are read only by
        their strategy. Durations are seconds (numbers, or strings like ``"500ms"``,
        ``"1min"``).
    restart_fixed_delay_attempts : int, default 1
        fixed-delay: restarts allowed in total.
    restart_fixed_delay : float, default 1.0
        fixed-delay: seconds between a failure and its restart.
    restart_exponential_initial_backoff : float, default 1.0
        exponential-delay: backoff of the first restart, seconds.
    restart_exponential_max_backoff : float, default 60.0
        exponential-delay: largest backoff before jitter, seconds.
    restart_exponential_multiplier : float, default 1.5
        exponential-delay: growth of the backoff per restart.
    restart_exponential_jitter : float, default 0.1
        exponential-delay: the delay is drawn from backoff * [1 - jitter, 1 + jitter].
    restart_exponential_reset_threshold : float, default 3600.0
        exponential-delay: a run this long without failure resets backoff and attempts.
    restart_exponential_attempts : int, default 2147483647
        exponential-delay: restarts allowed before the backoff is reset.
    restart_failure_rate_max_failures : int, default 1
        failure-rate: failures tolerated per interval.
    restart_failure_rate_interval : float, default 60.0
        failure-rate: length of the sliding window, seconds.
    restart_failure_rate_delay : float, default 1.0
        failure-rate: seconds between a failure and its restart.
    """

    parallelism: int | None = _opt(
        None, "Number of state partitions, one RocksDB instance each. None: the value of "
        "spark.sql.shuffle.partitions when the query first starts.",
        "int", optional=True, low=1, high=_MAX_KEY_GROUPS)
    max_parallelism: int = _opt(
        128, "Number of key groups: the largest parallelism the state can ever be rescaled "
        "to. Fixed for the life of the state; must be >= parallelism.",
        "int", low=1, high=_MAX_KEY_GROUPS)
    num_retained: int = _opt(
        3, "Completed checkpoints kept in durable storage; older ones and the files only "
        "they reference are deleted.", "int", low=1, high=10_000)
    fencing: bool = _opt(
        True, "One writer per state location: each run of a query takes a writer epoch by "
        "compare-and-set on the store, a newer run of the same query fences the older one, "
        "and another query is refused at its start. False runs without it, for stores "
        "with no atomic create-if-absent (never let two queries write one location then).",
        "bool")
    incremental: bool = _opt(
        True, "Upload only the SST files a checkpoint adds (False: every checkpoint is a "
        "full, self-contained snapshot).", "bool")
    checkpoint_mode: str = _opt(
        "incremental", "What a batch makes durable before emitting its output: "
        "'incremental' (the new SST files of a RocksDB snapshot) or 'changelog' (only a "
        "changelog of the batch's writes; snapshots are materialized in the background).",
        "choice", choices=CHECKPOINT_MODES)
    materialize_interval: int = _opt(
        10, "Changelog mode: materialize a snapshot in the background at least every this "
        "many batches (fewer changelogs to replay on restore, more bytes uploaded).",
        "int", low=1, high=1_000_000)
    materialize_changelog_ratio: float = _opt(
        0.25, "Changelog mode: also materialize when the changelogs since the last "
        "materialization exceed this share of the materialized state's size (and 1 MiB).",
        "float", low=0.01, high=100.0)
    local_recovery: bool = _opt(
        True, "Keep a local copy (hard links) of each checkpoint and restore from it before "
        "falling back to durable storage.", "bool")
    local_dir: str | None = _opt(
        None, "Directory for working instances and local checkpoint copies. None: "
        "'statebackend-<uid>' under the system temp dir, resolved on each executor. "
        "'{executor_id}' in the path is replaced by the Spark executor id ('driver' in "
        "local mode).",
        "path", optional=True)
    num_local_retained: int = _opt(
        2, "Local checkpoint copies kept per partition when local_recovery is on.",
        "int", low=1, high=10_000)
    keep_instances_open: bool = _opt(
        True, "Keep each partition's RocksDB instance open in the Python worker between "
        "micro-batches: its compactions complete, and the next task of the partition in "
        "the same worker reuses it without a restore.", "bool")
    instance_idle_timeout: float = _opt(
        300.0, "Seconds after which an instance kept open (keep_instances_open) that no "
        "task used is closed.", "duration", low=0.05)
    upload_threads: int = _opt(
        4, "Threads per task uploading files to durable storage.", "int", low=1, high=64)
    download_threads: int = _opt(
        4, "Threads per task downloading files from durable storage on restore.",
        "int", low=1, high=64)
    snapshot_compression: str = _opt(
        "snappy", "Compression of key-group blocks in full snapshots and savepoints.",
        "choice", choices=SNAPSHOT_COMPRESSIONS)
    placement: str = _opt(
        "shuffle", "How streaming operators place partitions on executors: 'shuffle' "
        "(repartition + mapInPandas; Spark's scheduler picks any executor) or 'carrier' "
        "(each partition's work runs inside a Spark stateful operator, so Spark's "
        "state-store scheduling keeps it on the executor that holds its state; "
        "docs/scaling.md, 'Placement'). Batch DataFrames always use 'shuffle'.",
        "choice", choices=PLACEMENTS)
    timer_service: str = _opt(
        "rocksdb", "Where timers live: 'rocksdb' (a column family, unbounded) or 'heap' "
        "(Python memory, faster, written into each checkpoint).",
        "choice", choices=TIMER_SERVICES)
    predefined_profile: str = _opt(
        "DEFAULT", "RocksDB tuning profile applied before the explicit tuning options "
        "below (which override it).", "choice", choices=PREDEFINED_PROFILES, upper=True,
        rocksdb=True)
    block_cache_size: int | None = _opt(
        None, "Block cache per instance in bytes; only with bounded_memory=False (with "
        "bounded memory the shared cache is sized from memory_budget). None: profile or "
        "RocksDB default.", "size", optional=True, low=64 * _KIB, rocksdb=True)
    block_size: int | None = _opt(
        None, "Uncompressed size of an SST data block in bytes. None: profile or RocksDB "
        "default (4k).", "size", optional=True, low=_KIB, high=256 * _MIB, rocksdb=True)
    write_buffer_size: int | None = _opt(
        None, "Size of one memtable in bytes. None: profile or RocksDB default (64m).",
        "size", optional=True, low=64 * _KIB, high=64 * _GIB, rocksdb=True)
    max_write_buffer_number: int | None = _opt(
        None, "Memtables per column family (active + being flushed) before writes stall. "
        "None: profile or RocksDB default (2; RocksDB needs at least 2).", "int", optional=True,
        low=2, high=64, rocksdb=True)
    bloom_filter_bits_per_key: float | None = _opt(
        10.0, "Bits per key of the bloom filter on SST files (about 1% false positives at "
        "10). None: no bloom filter.", "float", optional=True, low=1, high=100, rocksdb=True)
    compaction_style: str | None = _opt(
        None, "'level', 'universal' or 'fifo'. None: profile or RocksDB default (level).",
        "choice", optional=True, choices=COMPACTION_STYLES, rocksdb=True)
    compression_per_level: tuple[str, ...] | None = _opt(
        None, "Codec per LSM level (level 0 first); levels beyond the tuple use its last "
        "entry. None: RocksDB default (snappy everywhere).", "codecs", optional=True,
        rocksdb=True)
    max_open_files: int | None = _opt(
        None, "File handles RocksDB keeps open; -1 keeps all open (fastest, needs a high "
        "ulimit). None: profile or RocksDB default (-1). RocksDB itself clips other values to "
        "20..4194304, so smaller or larger ones are refused here.", "int", optional=True,
        low=20, high=4194304, extra_ok=(-1,), rocksdb=True)
    max_background_jobs: int | None = _opt(
        None, "Concurrent background flush and compaction jobs per instance. None: "
        "profile or RocksDB default (2).", "int", optional=True, low=1, high=256,
        rocksdb=True)
    bounded_memory: bool = _opt(
        True, "Bound RocksDB memory per process: every instance shares one block cache and "
        "one write buffer manager sized from memory_budget.", "bool", rocksdb=True)
    memory_budget: int = _opt(
        256 * _MIB, "Bytes per process shared by the block cache and the write buffers of "
        "every instance when bounded_memory is on.", "size", low=4 * _MIB, high=2**40,
        rocksdb=True)
    write_buffer_ratio: float = _opt(
        0.5, "Share of memory_budget reserved for write buffers (memtables) when "
        "bounded_memory is on.", "float", low=0.01, high=0.99, rocksdb=True)

    # Restart strategies of a supervised query (statebackend.supervisor), named and
    # defaulted as Flink's with checkpointing on; under spark.statebackend.restart-strategy.
    restart_strategy: str = _opt(
        "exponential-delay", "How a supervised query is restarted after a failure: 'none', "
        "'fixed-delay', 'exponential-delay' or 'failure-rate'.", "choice",
        choices=RESTART_STRATEGIES, key=_RESTART_PREFIX + "type")
    restart_fixed_delay_attempts: int = _opt(
        1, "fixed-delay: restarts allowed in total before the query fails for good.", "int",
        low=0, high=_INT_MAX, key=_RESTART_PREFIX + "fixed-delay.attempts")
    restart_fixed_delay: float = _opt(
        1.0, "fixed-delay: seconds between a failure and the restart.", "duration",
        low=0, key=_RESTART_PREFIX + "fixed-delay.delay")
    restart_exponential_initial_backoff: float = _opt(
        1.0, "exponential-delay: backoff of the first restart, in seconds.", "duration",
        low=0.001, key=_RESTART_PREFIX + "exponential-delay.initial-backoff")
    restart_exponential_max_backoff: float = _opt(
        60.0, "exponential-delay: largest backoff (before jitter), in seconds.", "duration",
        low=0.001, key=_RESTART_PREFIX + "exponential-delay.max-backoff")
    restart_exponential_multiplier: float = _opt(
        1.5, "exponential-delay: factor the backoff grows by per restart.", "float",
        low=1.0, high=1000.0, key=_RESTART_PREFIX + "exponential-delay.backoff-multiplier")
    restart_exponential_jitter: float = _opt(
        0.1, "exponential-delay: jitter factor; each delay is drawn uniformly from "
        "backoff * [1 - jitter, 1 + jitter].", "float", low=0.0, high=1.0,
        key=_RESTART_PREFIX + "exponential-delay.jitter-factor")
    restart_exponential_reset_threshold: float = _opt(
        3600.0, "exponential-delay: a failure this many seconds after the last restart "
        "resets the backoff and the attempt count.", "duration", low=0.001,
        key=_RESTART_PREFIX + "exponential-delay.reset-backoff-threshold")
    restart_exponential_attempts: int = _opt(
        _INT_MAX, "exponential-delay: restarts allowed before the backoff is reset; one "
        "more failure then fails the query for good.", "int", low=0, high=_INT_MAX,
        key=_RESTART_PREFIX + "exponential-delay.attempts-before-reset-backoff")
    restart_failure_rate_max_failures: int = _opt(
        1, "failure-rate: failures tolerated within the interval; one more fails the query "
        "for good.", "int", low=1, high=_INT_MAX,
        key=_RESTART_PREFIX + "failure-rate.max-failures-per-interval")
    restart_failure_rate_interval: float = _opt(
        60.0, "failure-rate: length of the sliding window failures are counted in, in "
        "seconds.", "duration", low=0.001,
        key=_RESTART_PREFIX + "failure-rate.failure-rate-interval")
    restart_failure_rate_delay: float = _opt(
        1.0, "failure-rate: seconds between a failure and the restart.", "duration", low=0,
        key=_RESTART_PREFIX + "failure-rate.delay")

    # --- validation -------------------------------------------------------------------

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = _normalise(f.name, getattr(self, f.name), f.metadata["spec"])
            object.__setattr__(self, f.name, value)
        if self.parallelism is not None and self.parallelism > self.max_parallelism:
            key = _label("parallelism")
            raise OptionsError(
                key, self.parallelism,
                f"Option {key!r}: invalid value {self.parallelism!r}; expected at most "
                f"max_parallelism ({self.max_parallelism}), the number of key groups. Set "
                f"{_label('max_parallelism')!r} to at least {self.parallelism} (e.g. "
                f"{default_max_parallelism(self.parallelism)}); it cannot change later.")
        if self.bounded_memory and self.block_cache_size is not None:
            key = _label("block_cache_size")
            raise OptionsError(
                key, self.block_cache_size,
                f"Option {key!r}: invalid value {self.block_cache_size!r}; it applies only "
                f"when bounded_memory is False. With bounded memory the shared cache is "
                f"sized from {_label('memory_budget')!r}; set that instead, or set "
                f"{_label('bounded_memory')!r} to False.")
        if self.restart_exponential_max_backoff < self.restart_exponential_initial_backoff:
            key = _label("restart_exponential_max_backoff")
            raise OptionsError(
                key, self.restart_exponential_max_backoff,
                f"Option {key!r}: invalid value {self.restart_exponential_max_backoff!r}; "
                f"expected at least {_label('restart_exponential_initial_backoff')!r} "
                f"({self.restart_exponential_initial_backoff:g}s).")

    # --- construction ------------------------------------------------------------------

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of every option, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def short_key(cls, name: str) -> str:
        """The short form of field ``name``: ``max-parallelism``, ``rocksdb.block-size``."""
        spec = _spec(name)
        if spec.key is not None:
            return spec.key
        dashed = name.replace("_", "-")
        return _ROCKSDB_PREFIX + dashed if spec.rocksdb else dashed

    @classmethod
    def spark_key(cls, name: str) -> str:
        """The Spark configuration key of field ``name``."""
        return SPARK_CONF_PREFIX + cls.short_key(name)

    @classmethod
    def describe(cls) -> list[dict[str, Any]]:
        """One row per option: name, Spark key, default, documentation."""
        return [{"name": f.name, "spark_key": cls.spark_key(f.name), "default": f.default,
                 "doc": f.metadata["spec"].doc} for f in dataclasses.fields(cls)]

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
        labels: dict[str, str] = {}
        for key, value in d.items():
            name = by_key.get(key) if isinstance(key, str) else None
            if name is None:
                raise _unknown(str(key), value, list(by_key))
            if name in kwargs:
                raise OptionsError(key, value, f"Option {key!r} given twice (also as "
                                               f"{labels[name]!r}); keep one of them.")
            kwargs[name] = value
            labels[name] = key
        with _labels(labels):
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
                raise _unknown(name, value, list(names))
        by_spark_key = {cls.spark_key(name): name for name in names}
        entries = _conf_entries(conf)
        lookup: Mapping[str, Any] | _GetOnly
        if entries is not None:
            for key, value in entries.items():
                if isinstance(key, str) and key.startswith(SPARK_CONF_PREFIX) \
                        and key not in by_spark_key:
                    raise _unknown(key, value, list(by_spark_key))
            lookup = entries
        else:
            lookup = _GetOnly(conf)
        kwargs: dict[str, Any] = {}
        labels: dict[str, str] = {}
        for spark_key, name in by_spark_key.items():
            if name in explicit:
                continue
            raw = lookup.get(spark_key, _MISSING)
            if raw is not _MISSING:
                kwargs[name] = _from_conf_value(name, spark_key, raw)
                labels[name] = spark_key
        if "parallelism" not in explicit and "parallelism" not in kwargs:
            raw = lookup.get(_SHUFFLE_PARTITIONS_KEY, _MISSING)
            if raw is not _MISSING:
                kwargs["parallelism"] = _from_conf_value(
                    "parallelism", _SHUFFLE_PARTITIONS_KEY, raw)
                labels["parallelism"] = _SHUFFLE_PARTITIONS_KEY
                # Spark's default of 200 shuffle partitions exceeds our default of 128 key
                # groups: when nobody chose max_parallelism, size it for the parallelism.
                p = kwargs["parallelism"]
                if "max_parallelism" not in explicit and "max_parallelism" not in kwargs \
                        and isinstance(p, int) and not isinstance(p, bool) and p > 128:
                    kwargs["max_parallelism"] = default_max_parallelism(p)
        kwargs.update(explicit)
        with _labels(labels):
            return cls(**kwargs)

    # --- derived values and copies ---------------------------------------------------

    def with_(self, **changes: Any) -> StateBackendOptions:
        """A validated copy with ``changes`` applied (field names only)."""
        names = self.field_names()
        for name, value in changes.items():
            if name not in names:
                raise _unknown(name, value, list(names))
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

    def resolved_local_dir(self, executor_id: str | None = None) -> str:
        """``local_dir``, or the default under this machine's temp dir when it is None.

        Resolved when called (on the executor), not when the options are built on the
        driver, because the two machines' temp dirs (and executor ids) differ.

        Parameters
        ----------
        executor_id : str, optional
            Replaces ``{executor_id}`` in ``local_dir``; required when it has one (on an
            executor, :func:`statebackend.spark.executor.current_executor_id`).
        """
        if self.local_dir is not None:
            path = self.local_dir
            if "executor_id" in _path_fields(path):
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
            raise _unknown(key, value, list(names))
    _dataclass_init(self, **kwargs)


StateBackendOptions.__init__ = _checked_init  # type: ignore[method-assign]


# --- what the backend is constructed with -------------------------------------------------


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
        keys = [k for k in options if isinstance(k, str)]
        spark = [k for k in keys if k.startswith("spark.")]
        if spark and len(spark) != len(options):
            other = next(k for k in options if k not in spark)
            raise OptionsError(
                str(other), options[other],
                f"options mixes Spark conf keys ({spark[0]!r}) with other keys ({other!r}); "
                f"give either option names ({{'num_retained': 5}}) or Spark keys "
                f"({{{SPARK_CONF_PREFIX + 'num-retained'!r}: '5'}}), not both.")
        if spark:
            return StateBackendOptions.from_spark_conf(options)
        return StateBackendOptions.from_dict(options)
    if callable(getattr(options, "getAll", None)):  # a pyspark.SparkConf
        return StateBackendOptions.from_spark_conf(options)
    raise OptionsError("options", options,
                       f"options must be a StateBackendOptions, a mapping of option names "
                       f"or of Spark conf keys, or a SparkConf; got {type(options).__name__}.")


def check_storage_options(storage_options: Any) -> dict[str, Any]:
    """``storage_options`` as a new dict: None becomes ``{}``; anything but a mapping with
    string keys is refused (its values are never shown: they hold credentials)."""
    if storage_options is None:
        return {}
    if not isinstance(storage_options, Mapping):
        raise OptionsError("storage_options", "<redacted>",
                           f"storage_options must be a mapping of fsspec options (e.g. "
                           f"{{'anon': True}}), got {type(storage_options).__name__}.")
    bad = [k for k in storage_options if not isinstance(k, str)]
    if bad:
        raise OptionsError("storage_options", "<redacted>",
                           f"storage_options keys must be strings, got a "
                           f"{type(bad[0]).__name__} key.")
    return dict(storage_options)


def check_location(url: Any, what: str = "checkpoint_location") -> str:
    """Refuse, at once, a location that is not a non-empty string or whose protocol fsspec
    does not know or cannot load (``bogus://x``, ``gcs://`` without gcsfs installed).

    Each protocol of a chained URL (``simplecache::s3://...``) is checked. Plain paths
    (no ``scheme://``) are local. Messages show the location with credentials redacted.
    """
    from .redact import redact_url

    if not isinstance(url, str) or not url.strip():
        raise OptionsError(what, None if not isinstance(url, str) else url,
                           f"{what} must be a non-empty path or fsspec URL, got "
                           f"{type(url).__name__ if not isinstance(url, str) else repr(url)}.")
    from fsspec.core import split_protocol
    from fsspec.registry import get_filesystem_class, known_implementations, registry

    for part in url.split("::"):
        protocol, _ = split_protocol(part)
        if protocol is None:
            continue
        if protocol not in registry and protocol not in known_implementations:
            raise OptionsError(what, redact_url(url),
                               f"{what} {redact_url(url)!r}: unknown protocol {protocol!r}; "
                               f"use a local path or an fsspec URL (s3://, gs://, abfs://, "
                               f"memory://, file://...).")
        try:
            get_filesystem_class(protocol)
        except ImportError as exc:
            raise OptionsError(what, redact_url(url),
                               f"{what} {redact_url(url)!r}: protocol {protocol!r} needs a "
                               f"package that is not installed ({exc}).") from None
    return url


# --- helpers ------------------------------------------------------------------------------


def default_max_parallelism(parallelism: int) -> int:
    """A max parallelism with room to scale up: 1.5x rounded up to a power of two, >= 128."""
    want = parallelism + parallelism // 2
    return min(_MAX_KEY_GROUPS, max(128, 1 << (want - 1).bit_length()))


def _spec(name: str) -> _Spec:
    for f in dataclasses.fields(StateBackendOptions):
        if f.name == name:
            return f.metadata["spec"]
    raise _unknown(name, None, list(StateBackendOptions.field_names()))


def _squash(key: str) -> str:
    # Compare names ignoring case, separators and the "rocksdb." group, so that
    # "maxParallelism", "max_parallelism" and "max-parallelism" all find each other.
    key = key.lower()
    if key.startswith(SPARK_CONF_PREFIX):
        key = key[len(SPARK_CONF_PREFIX):]
    if key.startswith(_ROCKSDB_PREFIX):
        key = key[len(_ROCKSDB_PREFIX):]
    return re.sub(r"[^a-z0-9]", "", key)


def _suggest(key: str, candidates: list[str]) -> str | None:
    squashed: dict[str, str] = {}
    for c in candidates:
        squashed.setdefault(_squash(c), c)
    target = _squash(key)
    if target in squashed:
        return squashed[target]
    close = difflib.get_close_matches(target, list(squashed), n=1, cutoff=0.6)
    return squashed[close[0]] if close else None


def _unknown(key: str, value: Any, candidates: list[str]) -> UnknownOptionError:
    guess = _suggest(key, candidates)
    hint = f" Did you mean {guess!r}?" if guess else ""
    return UnknownOptionError(
        key, value, f"Unknown option {key!r} (value {value!r}).{hint} Valid options are "
                    f"listed in docs/options.md and StateBackendOptions.describe().")


class _Missing:
    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return "<missing>"


_MISSING: Any = _Missing()


class _GetOnly:
    """Adapter for a conf object that only offers ``get(key, default)``."""

    def __init__(self, conf: Any) -> None:
        self._conf = conf

    def get(self, key: str, default: Any) -> Any:
        # SparkConf.get and RuntimeConfig.get return their default for an absent key;
        # a None result means absent too (SparkConf returns None for None defaults).
        value = self._conf.get(key, None)
        return default if value is None else value


def _conf_entries(conf: Any) -> dict[str, Any] | None:
    """Every entry of ``conf`` when it can list them, else None."""
    if isinstance(conf, Mapping):
        return dict(conf)
    get_all = getattr(conf, "getAll", None)
    if get_all is None:
        if not callable(getattr(conf, "get", None)):
            raise OptionsError("<conf>", conf, f"from_spark_conf expects a mapping or an "
                                               f"object with get(key, default), got "
                                               f"{type(conf).__name__}.")
        return None
    # SparkConf.getAll() is a method returning pairs; spark.conf.getAll (PySpark 4) is a
    # property returning a dict.
    items = get_all() if callable(get_all) else get_all
    return dict(items.items() if isinstance(items, Mapping) else items)


_NONE_STRINGS = ("", "none", "null")


def _from_conf_value(name: str, key: str, raw: Any) -> Any:
    """Parse a Spark conf string for field ``name``; non-strings pass through unchanged."""
    if not isinstance(raw, str):
        return raw
    spec = _spec(name)
    text = raw.strip()
    if spec.optional and text.lower() in _NONE_STRINGS and not (
            spec.kind == "codecs" and text.lower() == "none"):
        return None
    bad = OptionsError(key, raw, f"Option {key!r}: invalid value {raw!r} (cannot parse); "
                                 f"expected {_accepted(spec)}.")
    if spec.kind == "int":
        if not re.fullmatch(r"[+-]?\d+", text):
            raise bad
        return int(text)
    if spec.kind == "float":
        try:
            return float(text)
        except ValueError:
            raise bad from None
    if spec.kind == "duration":
        try:
            return parse_duration(text)
        except ValueError:
            raise bad from None
    if spec.kind == "bool":
        if text.lower() not in ("true", "false"):
            raise bad
        return text.lower() == "true"
    if spec.kind == "codecs":
        return tuple(part.strip() for part in re.split(r"[,:]", text))
    return text  # sizes, choices and paths are checked by the constructor
