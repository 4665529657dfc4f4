"""Our key groups equal Spark's ``pmod(hash(cols...), maxP)``, and placement is exact.

One local Spark session computes ``hash()`` for thousands of generated keys of every
supported type (edge cases included) and for composite keys; both kernel implementations
(native and pure-Python twin) and the scalar functions must agree with it row for row.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from statebackend.keys import groups as keygroups
from statebackend.keys import kernels as _kernels
from statebackend.keys.groups import key_group, key_groups, spark_hash
from statebackend.keys.placement import placement_values
from statebackend.keys.ranges import key_group_range, partition_for_key_group

pytestmark = pytest.mark.spark

N = 2500
MAX_PS = (128, 7, 1000)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:  # another module's session: share it, leave it running
        yield active
        return
    session = (SparkSession.builder.master("local[1]").appName("keygroup-parity")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# --- generated values, edge cases first ------------------------------------------------

_ALPHABET = ("a", "Z", "0", " ", "é", "ß", "\u00ff", "\u0100", "中", "\u07ff", "\u0800",
             "\uffff", "\U0001f600", "\U00010000", "\U0010ffff", "\x00", "\x7f", "\x80")


def _strings(rng: random.Random) -> list[Any]:
    out: list[Any] = ["", "a", "ab", "abc", "abcd", "abcde", "é", "éé", "😀", "a😀", None]
    while len(out) < N:
        out.append("".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(0, 23)))
                   if rng.random() > 0.05 else None)
    return out


def _binaries(rng: random.Random) -> list[Any]:
    out: list[Any] = [b"", b"\x80", b"\xff\xff\xff", b"\x00\x00\x00\x00\xff", None]
    while len(out) < N:
        out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 19)))
                   if rng.random() > 0.05 else None)
    return out


def _ints(rng: random.Random, bits: int) -> list[Any]:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    out: list[Any] = [0, 1, -1, lo, hi, lo + 1, hi - 1, None]
    while len(out) < N:
        r = rng.random()
        out.append(None if r < 0.03 else rng.randint(max(lo, -1000), min(hi, 1000)) if r < 0.4
                   else rng.randint(lo, hi))
    return out


def _floats(rng: random.Random, single: bool) -> list[Any]:
    out: list[Any] = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.0, -1.0,
                      5e-324 if not single else 1.401298464324817e-45, None]
    while len(out) < N:
        r = rng.random()
        v = None if r < 0.03 else float(rng.randint(-50, 50)) if r < 0.3 else (
            rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30))
        out.append(v)
    if single:  # values Spark can hold exactly as FloatType
        out = [None if v is None else float(np.float32(v)) for v in out]
    return out


def _dates(rng: random.Random) -> list[Any]:
    out: list[Any] = [dt.date(1970, 1, 1), dt.date(1969, 12, 31), dt.date(1, 1, 1),
                      dt.date(9999, 12, 31), dt.date(2000, 2, 29), None]
    while len(out) < N:
        out.append(None if rng.random() < 0.03
                   else dt.date(1970, 1, 1) + dt.timedelta(days=rng.randint(-200_000, 200_000)))
    return out


def _timestamps(rng: random.Random, aware: bool) -> list[Any]:
    tz = dt.timezone.utc if aware else None
    base = dt.datetime(1970, 1, 1, tzinfo=tz)
    out: list[Any] = [base, base - dt.timedelta(microseconds=1),
                      dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=tz), None]
    while len(out) < N:
        out.append(None if rng.random() < 0.03
                   else base + dt.timedelta(microseconds=rng.randint(-2 * 10**15, 4 * 10**15)))
    return out


SINGLE = {
    "s": ("string", _strings), "bin": ("binary", _binaries),
    "i": ("int", lambda r: _ints(r, 32)), "l": ("bigint", lambda r: _ints(r, 64)),
    "sh": ("smallint", lambda r: _ints(r, 16)), "b": ("tinyint", lambda r: _ints(r, 8)),
    "bo": ("boolean", lambda r: [None if r.random() < 0.05 else r.random() < 0.5
                                 for _ in range(N)]),
    "d": ("date", _dates),
    "ts": ("timestamp", lambda r: _timestamps(r, aware=False)),
    "tsa": ("timestamp", lambda r: _timestamps(r, aware=True)),
    "ntz": ("timestamp_ntz", lambda r: _timestamps(r, aware=False)),
    "f": ("float", lambda r: _floats(r, single=True)),
    "db": ("double", lambda r: _floats(r, single=False)),
}
COMPOSITE = {
    "s_i": ("s", "i"),
    "l_s_bo": ("l", "s", "bo"),
    "d_db_bin": ("d", "db", "bin"),
    "ntz_f": ("ntz", "f"),
}


@pytest.fixture(scope="module")
def data() -> dict[str, list[Any]]:
    rng = random.Random(20240601)
    return {name: gen(rng) for name, (_, gen) in SINGLE.items()}


@pytest.fixture(scope="module")
def spark_groups(spark: Any, data: dict[str, list[Any]]) -> dict[str, dict[int, np.ndarray]]:
    """For every single and composite key: {maxP: key groups Spark computed}, plus hashes."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(", ".join(
        ["idx int"] + [f"{name} {t}" for name, (t, _) in SINGLE.items()]))
    rows = [tuple([i] + [data[name][i] for name in SINGLE]) for i in range(N)]
    df = spark.createDataFrame(rows, schema)
    keys = {name: (name,) for name in SINGLE} | COMPOSITE
    exprs = [F.col("idx")]
    for key, cols in keys.items():
        h = F.hash(*[F.col(c) for c in cols])
        exprs.append(h.alias(f"{key}__h"))
        for mp in MAX_PS:
            exprs.append(F.pmod(h, F.lit(mp)).alias(f"{key}__{mp}"))
    pdf = df.select(*exprs).toPandas().sort_values("idx")
    assert pdf["idx"].tolist() == list(range(N))
    return {key: {0: pdf[f"{key}__h"].to_numpy(np.int32)}
            | {mp: pdf[f"{key}__{mp}"].to_numpy(np.int32) for mp in MAX_PS} for key in keys}


def _key_columns(key: str) -> tuple[str, ...]:
    return COMPOSITE.get(key, (key,))


@pytest.fixture(params=["native", "python"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(_kernels, "hash_columns", _kernels.py_hash_columns)
    else:
        assert _kernels.native is not None, "the native extension must be built for this test"
        monkeypatch.setattr(_kernels, "hash_columns", _kernels.native.hash_columns)
    return str(request.param)


@pytest.mark.parametrize("key", list(SINGLE) + list(COMPOSITE))
def test_vectorised_key_groups_equal_spark(key: str, kernel: str, data: dict, spark_groups: dict
                                           ) -> None:
    cols = _key_columns(key)
    types = [SINGLE[c][0] for c in cols]
    columns = [data[c] for c in cols]
    assert np.array_equal(keygroups.spark_hashes(columns, types), spark_groups[key][0])
    for mp in MAX_PS:
        got = key_groups(columns, types, mp)
        assert got.dtype == np.int32
        assert np.array_equal(got, spark_groups[key][mp]), (key, mp)


@pytest.mark.parametrize("key", list(SINGLE) + list(COMPOSITE))
def test_scalar_key_group_equals_spark(key: str, data: dict, spark_groups: dict) -> None:
    cols = _key_columns(key)
    types = [SINGLE[c][0] for c in cols]
    for i in range(0, N, 5):  # every fifth row keeps the scalar loop quick
        values = [data[c][i] for c in cols]
        assert spark_hash(values, types) == spark_groups[key][0][i], (key, values)
        assert key_group(values, types, 1000) == spark_groups[key][1000][i], (key, values)


def _as_arrow(values: list[Any], type_: str) -> pa.Array:
    pa_type = {"string": pa.string(), "binary": pa.binary(), "int": pa.int32(),
               "bigint": pa.int64(), "smallint": pa.int16(), "tinyint": pa.int8(),
               "boolean": pa.bool_(), "date": pa.date32(), "timestamp_ntz": pa.timestamp("us"),
               "float": pa.float32(), "double": pa.float64()}[type_]
    return pa.array(values, type=pa_type)


@pytest.mark.parametrize("key", ["s", "bin", "i", "l", "sh", "b", "bo", "d", "ntz", "f", "db"])
def test_arrow_pandas_and_numpy_columns_equal_spark(key: str, data: dict, spark_groups: dict
                                                    ) -> None:
    """The same keys given as Arrow arrays (also sliced and chunked) and as pandas Series."""
    t = SINGLE[key][0]
    values = data[key]
    arr = _as_arrow(values, t)
    expect = spark_groups[key][128]
    assert np.array_equal(key_groups([arr], [t], 128), expect)
    chunked = pa.chunked_array([arr.slice(0, 1000), arr.slice(1000)])
    assert np.array_equal(key_groups([chunked], [t], 128), expect)
    assert np.array_equal(key_groups([arr.slice(7, 500)], [t], 128), expect[7:507])
    series = arr.to_pandas(types_mapper=pd.ArrowDtype)
    assert np.array_equal(key_groups([series], [t], 128), expect)
    if arr.null_count == 0 or t in ("string", "binary"):
        plain = arr.to_pandas()  # object / numpy-backed Series
        assert np.array_equal(key_groups([plain], [t], 128), expect)
    nonnull = [i for i, v in enumerate(values) if v is not None]
    if t in ("int", "bigint", "smallint", "tinyint", "float", "double"):
        np_dtype = {"int": np.int32, "bigint": np.int64, "smallint": np.int16, "tinyint": np.int8,
                    "float": np.float32, "double": np.float64}[t]
        column = np.array([values[i] for i in nonnull], dtype=np_dtype)
        assert np.array_equal(key_groups([column], [t], 128), expect[nonnull])
        nullable = pd.Series(values, dtype={"int": "Int32", "bigint": "Int64", "smallint": "Int16",
                                            "tinyint": "Int8", "float": "Float32",
                                            "double": "Float64"}[t])
        if t not in ("float", "double"):  # pandas' nullable floats turn NaN into NA
            assert np.array_equal(key_groups([nullable], [t], 128), expect)


def test_repartition_by_placement_column_lands_each_range_in_its_partition(spark: Any) -> None:
    """Route rows by ``placement_values``: key-group range i is exactly Spark partition i."""
    from pyspark.sql import functions as F

    keys = [f"user-{i}" for i in range(3000)]
    df = spark.createDataFrame([(k,) for k in keys], "k string")
    for parallelism, max_p in ((3, 128), (8, 128), (13, 1000), (7, 7)):
        kg = F.pmod(F.hash("k"), F.lit(max_p))
        pid = F.floor(kg * F.lit(parallelism) / F.lit(max_p)).cast("int")
        route = F.element_at(F.array(*[F.lit(v) for v in placement_values(parallelism)]),
                             pid + F.lit(1))
        placed = (df.withColumn("kg", kg).repartition(parallelism, route)
                  .select("k", "kg", F.spark_partition_id().alias("p")).toPandas())
        assert len(placed) == len(keys)
        ours = key_groups([placed["k"]], ["string"], max_p)
        assert np.array_equal(ours, placed["kg"].to_numpy(np.int32))
        expected = partition_for_key_group(ours, parallelism, max_p)
        assert np.array_equal(placed["p"].to_numpy(np.int32), expected), (parallelism, max_p)
        for p, kgs in placed.groupby("p")["kg"]:
            r = key_group_range(int(p), parallelism, max_p)
            assert all(int(g) in r for g in kgs)
        # Every partition that owns a key group holding some key received rows.
        assert set(placed["p"]) == set(expected.tolist())
