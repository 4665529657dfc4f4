"""StateBackendOptions: defaults, construction paths, precedence, and every kind of mistake."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statebackend.errors import OptionsError, StateBackendError, UnknownOptionError
from statebackend.options import StateBackendOptions, parse_size

S = StateBackendOptions
P = "spark.statebackend."
DOCS = Path(__file__).resolve().parent.parent / "docs" / "options.md"


# --- defaults and normalisation --------------------------------------------------------


def test_defaults_are_the_contract() -> None:
    o = S()
    assert o.parallelism is None
    assert o.max_parallelism == 128
    assert o.num_retained == 3
    assert o.incremental is True and o.local_recovery is True
    assert o.local_dir is None
    assert o.num_local_retained == 2
    assert o.upload_threads == 4 and o.download_threads == 4
    assert o.snapshot_compression == "snappy"
    assert o.timer_service == "rocksdb"
    assert o.predefined_profile == "DEFAULT"
    assert o.block_cache_size is None and o.block_size is None
    assert o.write_buffer_size is None and o.max_write_buffer_number is None
    assert o.bloom_filter_bits_per_key == 10.0
    assert o.compaction_style is None and o.compression_per_level is None
    assert o.max_open_files is None and o.max_background_jobs is None
    assert o.bounded_memory is True
    assert o.memory_budget == 256 * 1024 * 1024
    assert o.write_buffer_ratio == 0.5
    assert "extra" not in S.field_names()


@pytest.mark.parametrize("text,expected", [
    ("64m", 64 << 20), ("1g", 1 << 30), ("1G", 1 << 30), ("512k", 512 << 10),
    ("512KiB", 512 << 10), ("16 MB", 16 << 20), ("4096", 4096), (" 2t ", 2 << 40), (8192, 8192),
])
def test_parse_size(text: Any, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["1.5g", "64x", "m", "", "-1k", 1.0, True, None])
def test_parse_size_refuses(bad: Any) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


def test_values_are_normalised() -> None:
    o = S(block_size="16k", write_buffer_size="32M", memory_budget="1g",
          predefined_profile="flash_ssd_optimized", compaction_style=" Universal ",
          compression_per_level=["None", "SNAPPY", "zstd"], timer_service="HEAP",
          bloom_filter_bits_per_key=12, local_dir=Path("/tmp/x"))
    assert o.block_size == 16384 and o.write_buffer_size == 32 << 20
    assert o.memory_budget == 1 << 30
    assert o.predefined_profile == "FLASH_SSD_OPTIMIZED"
    assert o.compaction_style == "universal"
    assert o.compression_per_level == ("none", "snappy", "zstd")
    assert o.timer_service == "heap"
    assert o.bloom_filter_bits_per_key == 12.0 and isinstance(o.bloom_filter_bits_per_key, float)
    assert o.local_dir == "/tmp/x"
    assert S(max_open_files=-1).max_open_files == -1
    assert S(bloom_filter_bits_per_key=None).bloom_filter_bits_per_key is None
    assert S(block_cache_size="64m", bounded_memory=False).block_cache_size == 64 << 20


def test_frozen_hashable_and_picklable() -> None:
    o = S(num_retained=5, compression_per_level=("lz4",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.num_retained = 1  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(o)) == o
    assert hash(o) == hash(S(num_retained=5, compression_per_level=["lz4"]))
    with pytest.raises(TypeError):
        S(4)  # type: ignore[misc]  # keyword-only: 25 positional fields would be a trap


def test_every_field_documented() -> None:
    rows = S.describe()
    assert [r["name"] for r in rows] == list(S.field_names())
    for f in dataclasses.fields(S):
        assert len(f.metadata["spec"].doc) > 20, f.name
        assert f.name in (S.__doc__ or ""), f"{f.name} missing from the class docstring"


def test_docs_table_lists_every_option() -> None:
    text = DOCS.read_text()
    for row in S.describe():
        assert f"`{row['name']}`" in text, row["name"]
        assert f"`{row['spark_key']}`" in text, row["spark_key"]


def test_spark_keys() -> None:
    assert S.spark_key("max_parallelism") == "spark.statebackend.max-parallelism"
    assert S.spark_key("block_cache_size") == "spark.statebackend.rocksdb.block-cache-size"
    assert S.spark_key("predefined_profile") == "spark.statebackend.rocksdb.predefined-profile"
    assert S.spark_key("local_recovery") == "spark.statebackend.local-recovery"
    assert len({S.spark_key(n) for n in S.field_names()}) == len(S.field_names())


# --- construction paths -----------------------------------------------------------------


def test_from_dict_accepts_field_names_and_short_forms() -> None:
    a = S.from_dict({"max_parallelism": 256, "block_size": "8k", "incremental": False})
    b = S.from_dict({"max-parallelism": 256, "rocksdb.block-size": "8k", "incremental": False})
    assert a == b == S(max_parallelism=256, block_size=8192, incremental=False)


def test_to_dict_round_trips_through_json() -> None:
    o = S(parallelism=8, compression_per_level=("none", "lz4"), local_dir="/data/sb",
          predefined_profile="SPINNING_DISK_OPTIMIZED", bounded_memory=False,
          block_cache_size="128m")
    d = json.loads(json.dumps(o.to_dict()))
    assert d["compression_per_level"] == ["none", "lz4"]
    assert S.from_dict(d) == o


def test_with_returns_a_validated_copy() -> None:
    o = S(num_retained=2)
    p = o.with_(num_retained=7, block_size="4k")
    assert (o.num_retained, p.num_retained, p.block_size) == (2, 7, 4096)
    with pytest.raises(OptionsError) as ei:
        o.with_(num_retained=0)
    assert ei.value.key == "num_retained"


def test_fingerprint_is_stable_and_sensitive() -> None:
    o = S(parallelism=4, compression_per_level=("snappy", "zstd"))
    assert o.fingerprint() == S.from_dict(o.to_dict()).fingerprint()
    assert len(o.fingerprint()) == 16
    assert o.with_(num_retained=4).fingerprint() != o.fingerprint()
    assert S(block_size="4k").fingerprint() == S(block_size=4096).fingerprint()
    # Same value in a fresh interpreter with a different hash seed: nothing depends on
    # dict order or hash().
    code = ("from statebackend.options import StateBackendOptions as S; "
            "print(S(parallelism=4, compression_per_level=('snappy', 'zstd'), "
            f"checkpoint_mode={o.checkpoint_mode!r}, "
            f"materialize_inline_ratio={o.materialize_inline_ratio!r}, "
            f"auto_changelog_size={o.auto_changelog_size!r}, "
            f"placement={o.placement!r}).fingerprint())")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, cwd=str(Path(__file__).resolve().parent.parent))
    assert out.stdout.strip() == o.fingerprint()


def test_local_dir_resolved_lazily() -> None:
    o = S()
    assert o.local_dir is None  # nothing machine-specific is captured on the driver
    resolved = o.resolved_local_dir()
    assert os.path.dirname(resolved) == tempfile.gettempdir()
    assert os.path.basename(resolved).startswith("statebackend")
    assert S(local_dir="rel/dir").resolved_local_dir() == os.path.abspath("rel/dir")


def test_local_dir_executor_id_placeholder() -> None:
    o = S(local_dir="/data/sb/{executor_id}/state")
    assert o.local_dir == "/data/sb/{executor_id}/state"  # kept until the executor resolves it
    assert o.resolved_local_dir(executor_id="3") == "/data/sb/3/state"
    assert o.resolved_local_dir(executor_id="driver") == "/data/sb/driver/state"
    with pytest.raises(OptionsError, match="names the executor"):
        o.resolved_local_dir()
    with pytest.raises(OptionsError, match="not a usable path component"):
        o.resolved_local_dir(executor_id="a/b")
    # no placeholder: the executor id is irrelevant; doubled braces are literal ones
    assert S(local_dir="/d").resolved_local_dir(executor_id="7") == "/d"
    assert S(local_dir="/d/{{x}}").resolved_local_dir() == "/d/{x}"
    assert S.from_spark_conf({P + "local-dir": "/l/{executor_id}"}).resolved_local_dir(
        executor_id="1") == "/l/1"
    with pytest.raises(OptionsError, match=r"unknown placeholder '\{executor\}'"):
        S(local_dir="/d/{executor}")
    with pytest.raises(OptionsError, match="local_dir"):
        S(local_dir="/d/{executor_id")


def test_executor_id_read_from_the_executor_jvm_command_line(monkeypatch) -> None:
    from statebackend.task import executor as ex

    assert ex.executor_id_from_cmdline(
        ["java", "-cp", "x", "org.apache.spark.executor.CoarseGrainedExecutorBackend",
         "--driver-url", "spark://d", "--executor-id", "12", "--hostname", "h"]) == "12"
    assert ex.executor_id_from_cmdline(["python", "-m", "pyspark.daemon"]) is None
    ex.current_executor_id.cache_clear()
    try:
        # pytest's ancestors are no executor JVM: the driver's id
        monkeypatch.delenv("SPARK_EXECUTOR_ID", raising=False)
        assert ex.current_executor_id() == "driver"
        ex.current_executor_id.cache_clear()
        monkeypatch.setenv("SPARK_EXECUTOR_ID", "5")  # what Kubernetes executors set
        assert ex.current_executor_id() == "5"
    finally:
        ex.current_executor_id.cache_clear()


# --- Spark configuration ------------------------------------------------------------------


def test_spark_conf_strings_are_parsed() -> None:
    conf = {
        P + "parallelism": "8", P + "max-parallelism": "64", P + "num-retained": "5",
        P + "incremental": "FALSE", P + "local-recovery": "true", P + "local-dir": "/d",
        P + "timer-service": "heap", P + "rocksdb.predefined-profile": "spinning_disk_optimized",
        P + "rocksdb.block-size": "32k", P + "rocksdb.bloom-filter-bits-per-key": "none",
        P + "rocksdb.compression-per-level": "none, snappy,zstd",
        P + "rocksdb.max-open-files": "-1", P + "rocksdb.bounded-memory": "false",
        P + "rocksdb.block-cache-size": "1g", P + "rocksdb.write-buffer-ratio": "0.25",
        "spark.app.name": "ignored", "spark.sql.shuffle.partitions": "200",
    }
    o = S.from_spark_conf(conf)
    assert o == S(parallelism=8, max_parallelism=64, num_retained=5, incremental=False,
                  local_recovery=True, local_dir="/d", timer_service="heap",
                  predefined_profile="SPINNING_DISK_OPTIMIZED", block_size=32768,
                  bloom_filter_bits_per_key=None, compression_per_level=("none", "snappy", "zstd"),
                  max_open_files=-1, bounded_memory=False, block_cache_size=1 << 30,
                  write_buffer_ratio=0.25)


def test_spark_conf_precedence_explicit_over_conf_over_default() -> None:
    conf = {P + "num-retained": "5", P + "upload-threads": "8"}
    o = S.from_spark_conf(conf, num_retained=9)
    assert (o.num_retained, o.upload_threads, o.download_threads) == (9, 8, 4)


def test_parallelism_falls_back_to_shuffle_partitions() -> None:
    assert S.from_spark_conf({}).parallelism is None
    assert S.from_spark_conf({"spark.sql.shuffle.partitions": "16"}).parallelism == 16
    both = {"spark.sql.shuffle.partitions": "16", P + "parallelism": "4"}
    assert S.from_spark_conf(both).parallelism == 4
    assert S.from_spark_conf(both, parallelism=2).parallelism == 2


def test_spark_default_200_partitions_gets_room_in_max_parallelism() -> None:
    o = S.from_spark_conf({"spark.sql.shuffle.partitions": "200"})
    assert (o.parallelism, o.max_parallelism) == (200, 512)
    assert S.from_spark_conf({"spark.sql.shuffle.partitions": "100"}).max_parallelism == 128
    # A max_parallelism someone chose is never silently raised.
    with pytest.raises(OptionsError) as ei:
        S.from_spark_conf({"spark.sql.shuffle.partitions": "200", P + "max-parallelism": "128"})
    assert ei.value.key == "spark.sql.shuffle.partitions"
    assert "max-parallelism" in str(ei.value)


class _GetOnlyConf:
    """Like an object that only has get(key, default) (no way to list its keys)."""

    def __init__(self, d: dict[str, str]) -> None:
        self._d = d

    def get(self, key: str, default: Any = None) -> Any:
        return self._d.get(key, default)


class _SparkConfLike(_GetOnlyConf):
    def getAll(self) -> list[tuple[str, str]]:  # noqa: N802 - SparkConf's name
        return list(self._d.items())


class _RuntimeConfigLike(_GetOnlyConf):
    @property
    def getAll(self) -> dict[str, str]:  # noqa: N802 - RuntimeConfig's name (a property)
        return dict(self._d)


@pytest.mark.parametrize("wrap", [dict, _GetOnlyConf, _SparkConfLike, _RuntimeConfigLike])
def test_spark_conf_shapes(wrap: Callable[[dict[str, str]], Any]) -> None:
    conf = wrap({P + "rocksdb.block-size": "8k", "spark.sql.shuffle.partitions": "4"})
    o = S.from_spark_conf(conf)
    assert (o.block_size, o.parallelism) == (8192, 4)


@pytest.mark.parametrize("wrap", [dict, _SparkConfLike, _RuntimeConfigLike])
def test_spark_conf_unknown_key_detected_when_listable(wrap: Callable[..., Any]) -> None:
    with pytest.raises(UnknownOptionError) as ei:
        S.from_spark_conf(wrap({P + "num-retaind": "3"}))
    assert "spark.statebackend.num-retained" in str(ei.value)


def test_real_pyspark_conf_without_a_session() -> None:
    from pyspark import SparkConf

    conf = SparkConf(loadDefaults=False).set(P + "rocksdb.write-buffer-size", "16m")
    assert S.from_spark_conf(conf).write_buffer_size == 16 << 20
    conf.set(P + "rocksdb.writebuffer-size", "16m")
    with pytest.raises(UnknownOptionError):
        S.from_spark_conf(conf)


def test_error_labels_do_not_leak_between_threads() -> None:
    # from_spark_conf labels errors with Spark keys; a concurrent plain constructor call in
    # another thread must still name the field.
    errors: list[str] = []

    def plain() -> None:
        for _ in range(200):
            try:
                S(num_retained=0)
            except OptionsError as e:
                errors.append(e.key)

    t = threading.Thread(target=plain)
    t.start()
    for _ in range(200):
        with pytest.raises(OptionsError):
            S.from_spark_conf({P + "num-retained": "0"})
    t.join()
    assert errors and set(errors) == {"num_retained"}


# --- mistakes: each names the key, the value and what is accepted --------------------------

# (id, build, error type, key the error must name, text the message must contain)
MISTAKES: list[tuple[str, Callable[[], Any], type[Exception], str, str]] = [
    ("typo kwarg", lambda: S(max_paralelism=64), UnknownOptionError,
     "max_paralelism", "Did you mean 'max_parallelism'?"),
    ("typo in with_", lambda: S().with_(upload_thread=2), UnknownOptionError,
     "upload_thread", "Did you mean 'upload_threads'?"),
    ("typo in from_dict", lambda: S.from_dict({"num_retaind": 3}), UnknownOptionError,
     "num_retaind", "Did you mean 'num_retained'?"),
    ("camelCase key", lambda: S.from_dict({"maxParallelism": 64}), UnknownOptionError,
     "maxParallelism", "Did you mean 'max_parallelism'?"),
    ("old extra field", lambda: S(extra={"x": 1}), UnknownOptionError, "extra", "Unknown option"),
    ("spark key typo", lambda: S.from_spark_conf({P + "rocksdb.blockcache-size": "1m"}),
     UnknownOptionError, P + "rocksdb.blockcache-size",
     "Did you mean 'spark.statebackend.rocksdb.block-cache-size'?"),
    ("rocksdb key outside its group", lambda: S.from_spark_conf({P + "block-size": "4k"}),
     UnknownOptionError, P + "block-size", "Did you mean 'spark.statebackend.rocksdb.block-size'?"),
    ("unknown explicit for spark conf", lambda: S.from_spark_conf({}, retained=3),
     UnknownOptionError, "retained", "Did you mean 'num_retained'?"),
    ("float for int", lambda: S(upload_threads=4.0), OptionsError, "upload_threads", "an int"),
    ("bool for int", lambda: S(num_retained=True), OptionsError, "num_retained", "got bool"),
    ("string for int outside spark conf", lambda: S(max_parallelism="256"), OptionsError,
     "max_parallelism", "an int"),
    ("int for bool", lambda: S(incremental=1), OptionsError, "incremental", "a bool"),
    ("string for bool outside spark conf", lambda: S.from_dict({"local-recovery": "true"}),
     OptionsError, "local-recovery", "a bool"),
    ("None for a required option", lambda: S(max_parallelism=None), OptionsError,
     "max_parallelism", "cannot be None"),
    ("max_parallelism too large", lambda: S(max_parallelism=40000), OptionsError,
     "max_parallelism", "<= 32768"),
    ("zero parallelism", lambda: S(parallelism=0), OptionsError, "parallelism", ">= 1"),
    ("parallelism above max_parallelism", lambda: S(parallelism=200), OptionsError,
     "parallelism", "at least 200"),
    ("too many threads", lambda: S(download_threads=65), OptionsError, "download_threads",
     "<= 64"),
    ("zero retained", lambda: S.from_dict({"num-local-retained": 0}), OptionsError,
     "num-local-retained", ">= 1"),
    ("unknown choice", lambda: S(snapshot_compression="gzip"), OptionsError,
     "snapshot_compression", "'snappy', 'none'"),
    ("misspelt choice", lambda: S(timer_service="rocksbd"), OptionsError, "timer_service",
     "did you mean 'rocksdb'?"),
    ("unknown profile", lambda: S(predefined_profile="SSD"), OptionsError,
     "predefined_profile", "FLASH_SSD_OPTIMIZED"),
    ("unknown compaction style", lambda: S(compaction_style="tiered"), OptionsError,
     "compaction_style", "'universal'"),
    ("unparsable size", lambda: S(block_size="64 mega"), OptionsError, "block_size",
     "'64m'"),
    ("float size", lambda: S(write_buffer_size=1.5e6), OptionsError, "write_buffer_size",
     "size in bytes"),
    ("budget too small", lambda: S(memory_budget="1m"), OptionsError, "memory_budget", ">= 4m"),
    ("unknown codec", lambda: S(compression_per_level=("snappy", "brotli")), OptionsError,
     "compression_per_level", "'brotli'"),
    ("codec string not tuple", lambda: S(compression_per_level="snappy"), OptionsError,
     "compression_per_level", "tuple"),
    ("too many levels", lambda: S(compression_per_level=("lz4",) * 8), OptionsError,
     "compression_per_level", "8 entries"),
    ("zero open files", lambda: S(max_open_files=0), OptionsError, "max_open_files", "-1"),
    ("too few open files", lambda: S(max_open_files=10), OptionsError, "max_open_files", ">= 20"),
    ("one write buffer", lambda: S(max_write_buffer_number=1), OptionsError,
     "max_write_buffer_number", ">= 2"),
    ("bloom bits zero", lambda: S(bloom_filter_bits_per_key=0), OptionsError,
     "bloom_filter_bits_per_key", ">= 1"),
    ("bloom bits nan", lambda: S(bloom_filter_bits_per_key=float("nan")), OptionsError,
     "bloom_filter_bits_per_key", "not finite"),
    ("ratio of one", lambda: S(write_buffer_ratio=1.0), OptionsError, "write_buffer_ratio",
     "<= 0.99"),
    ("empty local dir", lambda: S(local_dir=""), OptionsError, "local_dir", "path"),
    ("block cache with bounded memory", lambda: S(block_cache_size="64m"), OptionsError,
     "block_cache_size", "memory_budget"),
    ("same option twice", lambda: S.from_dict({"num_retained": 2, "num-retained": 3}),
     OptionsError, "num-retained", "given twice"),
    ("spark conf int does not parse", lambda: S.from_spark_conf({P + "upload-threads": "four"}),
     OptionsError, P + "upload-threads", "cannot parse"),
    ("spark conf bool does not parse", lambda: S.from_spark_conf({P + "incremental": "yes"}),
     OptionsError, P + "incremental", "a bool"),
    ("spark conf out of range names the spark key",
     lambda: S.from_spark_conf({P + "rocksdb.max-background-jobs": "0"}), OptionsError,
     P + "rocksdb.max-background-jobs", ">= 1"),
    ("spark conf float int", lambda: S.from_spark_conf({P + "num-retained": "2.5"}),
     OptionsError, P + "num-retained", "cannot parse"),
    ("bad shuffle partitions", lambda: S.from_spark_conf({"spark.sql.shuffle.partitions": "0"}),
     OptionsError, "spark.sql.shuffle.partitions", ">= 1"),
]


@pytest.mark.parametrize("build,error,key,text", [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_mistake_is_refused(build: Callable[[], Any], error: type[Exception], key: str,
                            text: str) -> None:
    with pytest.raises(error) as ei:
        build()
    err = ei.value
    assert isinstance(err, StateBackendError) and isinstance(err, ValueError)
    assert err.key == key  # type: ignore[attr-defined]
    assert repr(key) in str(err), str(err)
    assert text in str(err), str(err)


def test_mistake_kinds_are_many_and_distinct() -> None:
    assert len({m[0] for m in MISTAKES}) == len(MISTAKES) >= 12


def test_wrong_container_types_are_refused() -> None:
    with pytest.raises(OptionsError, match="mapping"):
        S.from_dict([("num_retained", 2)])  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="get\\(key, default\\)"):
        S.from_spark_conf(42)


def test_error_carries_the_refused_value() -> None:
    with pytest.raises(OptionsError) as ei:
        S.from_spark_conf({P + "rocksdb.block-size": "huge"})
    assert ei.value.value == "huge"
    assert "'huge'" in str(ei.value)
    with pytest.raises(UnknownOptionError) as ui:
        S.from_dict({"bogus_option_name": 1})
    assert ui.value.value == 1
    assert "Did you mean" not in str(ui.value)  # nothing close: no made-up suggestion


def test_docs_reference_is_generated_from_the_declarations() -> None:
    # docs/options.md's option reference and the class docstring come from the field
    # declarations alone; refresh the file with
    # `python -m statebackend.options --write docs/options.md`.
    from statebackend.options.docs import markdown, replace_reference

    text = DOCS.read_text()
    assert replace_reference(text, markdown(dataclasses.fields(S))) == text, (
        "docs/options.md is stale: run python -m statebackend.options --write docs/options.md")
    for f in dataclasses.fields(S):
        assert f"{f.name} : " in (S.__doc__ or ""), f.name


def test_sections_cover_every_option_once() -> None:
    sections = S.sections()
    names = [n for section in sections.values() for n in section]
    assert sorted(names) == sorted(S.field_names())
    assert set(S().section("rocksdb")) == set(sections["rocksdb"])
    assert S(memory_budget="1g").section("rocksdb")["memory_budget"] == 1 << 30
    assert all(S.spark_key(n).startswith(P + "rocksdb.") for n in sections["rocksdb"])
    with pytest.raises(OptionsError):
        S().section("bogus")
