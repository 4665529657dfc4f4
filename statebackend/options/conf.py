"""Reading options from what users hand over: Spark confs, mappings, URLs.

The parsing of Spark conf strings, the detection of unknown keys (with the closest valid
name), and the checks of the backend's other constructor arguments (storage options, the
checkpoint location). :class:`statebackend.options.StateBackendOptions` calls these; they
know options only through the specs they are given.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import OptionsError, UnknownOptionError
from .values import (
    _ROCKSDB_PREFIX,
    _SHUFFLE_PARTITIONS_KEY,
    SPARK_CONF_PREFIX,
    _Spec,
    accepted,
    default_max_parallelism,
    parse_duration,
)


def holds_spark_keys(options: Mapping[Any, Any]) -> bool:
    """Whether a mapping given as options holds Spark conf keys (every key ``spark.*``)
    rather than option names; a mix of both is refused."""
    spark = [k for k in options if isinstance(k, str) and k.startswith("spark.")]
    if spark and len(spark) != len(options):
        other = next(k for k in options if k not in spark)
        raise OptionsError(
            str(other), options[other],
            f"options mixes Spark conf keys ({spark[0]!r}) with other keys ({other!r}); "
            f"give either option names ({{'num_retained': 5}}) or Spark keys "
            f"({{{SPARK_CONF_PREFIX + 'num-retained'!r}: '5'}}), not both.")
    return bool(spark)


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
    from ..redact import redact_url

    if not isinstance(url, str) or not url.strip():
        raise OptionsError(what, None if not isinstance(url, str) else url,
                           f"{what} must be a non-empty path or fsspec URL, got "
                           f"{type(url).__name__ if not isinstance(url, str) else repr(url)}.")
    if "\x00" in url:
        raise OptionsError(what, redact_url(url.replace("\x00", "\\0")),
                           f"{what} {redact_url(url.replace(chr(0), '<NUL>'))!r} holds a NUL "
                           f"character, which no filesystem accepts in a path.")
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
        if what == "checkpoint_location" and protocol in READ_ONLY_PROTOCOLS:
            raise OptionsError(what, redact_url(url),
                               f"{what} {redact_url(url)!r}: protocol {protocol!r} can only "
                               f"read; checkpoints are written there. Use a writable store "
                               f"(a local path, s3://, gs://, abfs://...); a {protocol}:// "
                               f"URL can still be read from (from_savepoint=, the CLI).")
    return url


#: fsspec protocols that cannot write (a checkpoint location must).
READ_ONLY_PROTOCOLS = frozenset({"http", "https", "github", "git", "zip", "tar",
                                 "libarchive", "reference"})



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


def unknown(key: str, value: Any, candidates: list[str]) -> UnknownOptionError:
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


def _from_conf_value(spec: _Spec, key: str, raw: Any) -> Any:
    """Parse a Spark conf string for a field of ``spec``; non-strings pass through unchanged."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if spec.optional and text.lower() in _NONE_STRINGS and not (
            spec.kind == "codecs" and text.lower() == "none"):
        return None
    bad = OptionsError(key, raw, f"Option {key!r}: invalid value {raw!r} (cannot parse); "
                                 f"expected {accepted(spec)}.")
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


def spark_conf_kwargs(conf: Any, by_spark_key: Mapping[str, str],
                      spec_of: Callable[[str], _Spec],
                      explicit: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The constructor's keyword arguments read from ``conf``, and the key each came from.

    ``by_spark_key`` maps every Spark key to its field name; fields in ``explicit`` are not
    read. ``parallelism`` falls back to ``spark.sql.shuffle.partitions``; see
    :meth:`statebackend.options.StateBackendOptions.from_spark_conf`.
    """
    entries = _conf_entries(conf)
    lookup: Mapping[str, Any] | _GetOnly
    if entries is not None:
        for key, value in entries.items():
            if isinstance(key, str) and key.startswith(SPARK_CONF_PREFIX) \
                    and key not in by_spark_key:
                raise unknown(key, value, list(by_spark_key))
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
            kwargs[name] = _from_conf_value(spec_of(name), spark_key, raw)
            labels[name] = spark_key
    if "parallelism" not in explicit and "parallelism" not in kwargs:
        _shuffle_partitions(lookup, spec_of("parallelism"), explicit, kwargs, labels)
    return kwargs, labels


def _shuffle_partitions(lookup: Mapping[str, Any] | _GetOnly, spec: _Spec,
                        explicit: Mapping[str, Any], kwargs: dict[str, Any],
                        labels: dict[str, str]) -> None:
    raw = lookup.get(_SHUFFLE_PARTITIONS_KEY, _MISSING)
    if raw is _MISSING:
        return
    kwargs["parallelism"] = _from_conf_value(spec, _SHUFFLE_PARTITIONS_KEY, raw)
    labels["parallelism"] = _SHUFFLE_PARTITIONS_KEY
    # Spark's default of 200 shuffle partitions exceeds our default of 128 key
    # groups: when nobody chose max_parallelism, size it for the parallelism.
    p = kwargs["parallelism"]
    if "max_parallelism" not in explicit and "max_parallelism" not in kwargs \
            and isinstance(p, int) and not isinstance(p, bool) and p > 128:
        kwargs["max_parallelism"] = default_max_parallelism(p)
