"""What an option accepts: the kinds of value, their parsing and their checks.

Pure functions and constants, no option names: :mod:`statebackend.options.specs` says
which option is of which kind, :class:`statebackend.options.StateBackendOptions` applies
them. Every refusal is an :class:`~statebackend.errors.OptionsError` naming the key as
the user wrote it (see :func:`labels`), the value and what is accepted.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import numbers
import os
import re
import string
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ..errors import OptionsError

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
PLACEMENTS = ("auto", "shuffle", "carrier")
CHECKPOINT_MODES = ("incremental", "changelog", "auto")
AUTO_INLINE_RATIO = 2.0
"""``materialize_inline_ratio`` of ``checkpoint_mode="auto"`` when the option is unset."""
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


def default_max_parallelism(parallelism: int) -> int:
    """A max parallelism with room to scale up: 1.5x rounded up to a power of two, >= 128."""
    want = parallelism + parallelism // 2
    return min(_MAX_KEY_GROUPS, max(128, 1 << (want - 1).bit_length()))


# --- per-field specification ------------------------------------------------------------

SECTIONS = ("runtime", "checkpointing", "local_recovery", "rocksdb", "restart")
"""The sections options are grouped in, in the order the documentation lists them."""


@dataclass(frozen=True)
class _Spec:
    """How one field is validated, documented and named in a Spark configuration."""

    kind: str  # "int", "size", "float", "duration", "bool", "choice", "codecs", "path"
    doc: str  # markdown: `code` in single backquotes
    section: str  # one of SECTIONS
    optional: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    upper: bool = False  # choices are stored upper-case (else lower-case)
    extra_ok: tuple[Any, ...] = ()  # values allowed outside [low, high], e.g. -1
    key: str | None = None  # explicit short key (e.g. restart-strategy.type), else derived

    def __post_init__(self) -> None:
        if self.section not in SECTIONS:  # pragma: no cover - a bug in the specs
            raise AssertionError(f"unknown section {self.section!r}")

    @property
    def rocksdb(self) -> bool:
        """RocksDB tuning lives under ``spark.statebackend.rocksdb.``."""
        return self.section == "rocksdb"


def short_key(name: str, spec: _Spec) -> str:
    """The short form of field ``name``: ``max-parallelism``, ``rocksdb.block-size``."""
    if spec.key is not None:
        return spec.key
    dashed = name.replace("_", "-")
    return _ROCKSDB_PREFIX + dashed if spec.rocksdb else dashed


# Which key names a field in error messages: ``from_dict`` and ``from_spark_conf`` set it
# so an error names the key the user wrote, not our field name. A ContextVar keeps this
# correct when several threads build options at once.
_LABELS: ContextVar[Mapping[str, str] | None] = ContextVar("_LABELS", default=None)


def label(name: str) -> str:
    """The key the user wrote for field ``name`` (the field name outside :func:`labels`)."""
    labels = _LABELS.get()
    return labels.get(name, name) if labels else name


@contextlib.contextmanager
def labels(names: Mapping[str, str]) -> Iterator[None]:
    """Within the block, errors name field ``f`` as ``names[f]``."""
    token = _LABELS.set(names)
    try:
        yield
    finally:
        _LABELS.reset(token)


def fmt_bytes(n: float) -> str:
    """``268435456`` as ``"256m"``: the largest unit that divides ``n``."""
    for unit, size in (("g", _GIB), ("m", _MIB), ("k", _KIB)):
        if n >= size and n % size == 0:
            return f"{int(n // size)}{unit}"
    return str(int(n))


_WHAT = {"int": "an int", "float": "a number",
         "size": "a size in bytes (int, or a string like '64m', '1g', '512k')",
         "duration": "a duration in seconds (number, or a string like '500ms', "
                     "'10s', '1min', '1h')"}


def accepted(spec: _Spec) -> str:
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
        fmt = fmt_bytes if spec.kind == "size" else (lambda x: f"{x:g}")
        bounds = []
        if spec.low is not None:
            bounds.append(f">= {fmt(spec.low)}")
        if spec.high is not None:
            bounds.append(f"<= {fmt(spec.high)}")
        text = _WHAT[spec.kind] + (" " + " and ".join(bounds) if bounds else "")
        if spec.extra_ok:
            text += " (or " + " or ".join(repr(v) for v in spec.extra_ok) + ")"
    return text + none


def _fail(name: str, value: Any, spec: _Spec, why: str = "") -> OptionsError:
    key = label(name)
    reason = f" ({why})" if why else ""
    return OptionsError(key, value, f"Option {key!r}: invalid value {value!r}{reason}; "
                                    f"expected {accepted(spec)}.")


def _check_range(name: str, value: float, shown: Any, spec: _Spec) -> None:
    if value in spec.extra_ok:
        return
    if (spec.low is not None and value < spec.low) or (spec.high is not None and value > spec.high):
        raise _fail(name, shown, spec, "out of range")


def _wrong_type(name: str, value: Any, spec: _Spec) -> OptionsError:
    return _fail(name, value, spec, f"got {type(value).__name__}")


def _bool(name: str, value: Any, spec: _Spec) -> bool:
    if not isinstance(value, bool):
        raise _wrong_type(name, value, spec)
    return value


def _int(name: str, value: Any, spec: _Spec) -> int:
    # bool is an int subclass and 4.0 "looks" integral: both are mistakes, not ints.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _wrong_type(name, value, spec)
    value = int(value)
    _check_range(name, value, value, spec)
    return value


def _parsed(parse: Callable[[Any], float]) -> Callable[[str, Any, _Spec], Any]:
    """A checker of a value ``parse`` turns into a number (sizes, durations)."""
    def check(name: str, value: Any, spec: _Spec) -> Any:
        try:
            parsed = parse(value)
        except ValueError:
            raise _wrong_type(name, value, spec) from None
        _check_range(name, parsed, value, spec)
        return parsed
    return check


def _float(name: str, value: Any, spec: _Spec) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _wrong_type(name, value, spec)
    value = float(value)
    if not math.isfinite(value):
        raise _fail(name, value, spec, "not finite")
    _check_range(name, value, value, spec)
    return value


def _choice(name: str, value: Any, spec: _Spec) -> str:
    if not isinstance(value, str):
        raise _wrong_type(name, value, spec)
    canon = value.strip().upper() if spec.upper else value.strip().lower()
    if canon not in spec.choices:
        close = difflib.get_close_matches(canon, spec.choices, n=1)
        raise _fail(name, value, spec, f"did you mean {close[0]!r}?" if close else "")
    return canon


def _codecs(name: str, value: Any, spec: _Spec) -> tuple[str, ...]:
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


def _path(name: str, value: Any, spec: _Spec) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise _fail(name, value, spec)
    try:
        fields = path_fields(value)
    except ValueError as exc:  # an unmatched brace
        raise _fail(name, value, spec, f"{exc}; write '{{{{' for a literal brace") from exc
    if not fields <= set(PATH_PLACEHOLDERS):
        bad = ", ".join(sorted(repr("{" + f + "}") for f in fields - set(PATH_PLACEHOLDERS)))
        raise _fail(name, value, spec, f"unknown placeholder {bad}; known: "
                    + ", ".join("{" + f + "}" for f in PATH_PLACEHOLDERS))
    if "\x00" in value:
        raise _fail(name, value.replace("\x00", "\\0"), spec,
                    "a path cannot hold a NUL character")
    if not fields:
        why = _unwritable(value)
        if why is not None:
            raise _fail(name, value, spec, why)
    return value


def _unwritable(path: str) -> str | None:
    """Why a local directory could not be created or written here, as far as this machine
    can tell (None: it can, or the path does not exist here yet: executors create it)."""
    path = os.path.abspath(os.path.expanduser(path))
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    if not os.path.isdir(probe):
        return f"{probe!r} is a file, not a directory"
    if probe == path and not os.access(path, os.W_OK | os.X_OK):
        return f"the directory {path!r} is not writable by this process"
    return None


_CHECKERS: dict[str, Callable[[str, Any, _Spec], Any]] = {
    "bool": _bool, "int": _int, "size": _parsed(parse_size), "float": _float,
    "duration": _parsed(parse_duration), "choice": _choice, "codecs": _codecs, "path": _path,
}


def normalise(name: str, value: Any, spec: _Spec) -> Any:
    """The canonical form of ``value`` for field ``name``, or raise OptionsError."""
    if value is None:
        if spec.optional:
            return None
        raise _fail(name, value, spec, "this option cannot be None")
    return _CHECKERS[spec.kind](name, value, spec)


def path_fields(path: str) -> set[str]:
    """The ``{name}`` placeholders of a path (ValueError on an unmatched brace)."""
    return {f for _text, f, _spec, _conv in string.Formatter().parse(path) if f is not None}
