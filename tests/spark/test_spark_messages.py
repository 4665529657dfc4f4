"""Misuse of the state API that Spark's operator survives, run on Spark's operator and on
ours: every call must give the same result, or raise the same class with Spark's message
(ours may add its explanation after Spark's text, as `` (statebackend: ...)``).

The processors (``fidelity_procs.MisusedStates`` and friends) record each call's outcome
as a row: a result's type and ``repr``, or an exception's class, error condition and
message. Misuse that makes Spark's worker lose its state server (a wrongly typed value the
JVM refuses, an empty list, state declared outside ``init``) has no Spark answer to
compare with and is left out; README "Known differences" says what ours does.
"""

from __future__ import annotations

import fidelity_procs as F
import pandas as pd
import pytest
from harness import run_stream, run_streams, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCHEMA = "k STRING, x BIGINT"
OUT = "k STRING, v BIGINT, s STRING"
OURS_EXTRA = " (statebackend: "


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory):
    # two micro-batches: the second reads what the first wrote
    d = str(tmp_path_factory.mktemp("messages") / "input")
    write_batches(d, [pd.DataFrame({"k": ["a", "a", "b"], "x": [1, 2, 3]}),
                      pd.DataFrame({"k": ["b", "c"], "x": [4, 5]})])
    return d


def _same(ours: str, theirs: str) -> bool:
    return ours == theirs or ours.startswith(theirs + OURS_EXTRA)


def _compare(ours: dict[int, pd.DataFrame], theirs: dict[int, pd.DataFrame]) -> int:
    """Every (batch, key, call) outcome of ours equals Spark's; the number compared."""
    assert sorted(ours) == sorted(theirs) == [0, 1]
    n = 0
    for b in theirs:
        t = {(k, v): s for k, v, s in zip(theirs[b]["k"], theirs[b]["v"], theirs[b]["s"])}
        o = {(k, v): s for k, v, s in zip(ours[b]["k"], ours[b]["v"], ours[b]["s"])}
        assert sorted(o) == sorted(t), f"micro-batch {b}: different calls"
        bad = [f"ours:   {o[c]}\nSpark's: {t[c]}" for c in sorted(t) if not _same(o[c], t[c])]
        assert not bad, f"micro-batch {b}:\n" + "\n".join(bad)
        n += len(t)
    return n


def _backend(tmp_path) -> RocksDBStateBackend:
    return RocksDBStateBackend(str(tmp_path / "state"),
                               StateBackendOptions(parallelism=2,
                                                   local_dir=str(tmp_path / "local")))


@pytest.mark.parametrize("flavour", ["pandas", "row"])
def test_state_misuse_same_as_spark(spark, tmp_path, input_dir, flavour):
    backend = _backend(tmp_path)
    if flavour == "row":
        theirs_q = lambda df: df.groupBy("k").transformWithState(  # noqa: E731
            F.RowMisusedStates(), OUT, "Update", "None")
        ours_q = lambda df: backend.transform_with_state(  # noqa: E731
            df.groupBy("k"), F.RowMisusedStates(), OUT, "Update", "None", flavour="row")
    else:
        theirs_q = lambda df: df.groupBy("k").transformWithStateInPandas(  # noqa: E731
            F.MisusedStates(), OUT, "Update", "None")
        ours_q = lambda df: backend.transform_with_state(  # noqa: E731
            df.groupBy("k"), F.MisusedStates(), OUT, "Update", "None")
    runs = run_streams(spark, input_dir, SCHEMA, {
        "theirs": (theirs_q, str(tmp_path / "ck-spark")),
        "ours": (ours_q, str(tmp_path / "ck-ours"))})
    theirs, ours = runs["theirs"], runs["ours"]
    calls = len(set(theirs[0]["v"]))
    assert calls > 60
    assert _compare(ours, theirs) == 4 * calls  # keys a, b in batch 0; b, c in batch 1
    outcomes = set(pd.concat(theirs.values())["s"])
    # the run covers what the issue is about: a one-character string as a map key, the
    # messages of a deleted state, and a refusal by Spark's client
    assert "map contains str key: bool True" in outcomes
    assert ("gone value exists: PySparkRuntimeError [None] Error checking value state exists: "
            "Value state gone_v is not initialized.") in outcomes
    assert "value update int: TypeError [None] 'int' object is not iterable" in outcomes
    # and ours adds its explanation after Spark's text
    assert any(OURS_EXTRA in s for s in pd.concat(ours.values())["s"])


def test_timer_misuse_same_as_spark(spark_no_data, tmp_path, input_dir):
    spark = spark_no_data  # ProcessingTime mode: no-data micro-batches off (conftest)
    backend = _backend(tmp_path)
    theirs = run_stream(spark, input_dir, SCHEMA,
                        lambda df: df.groupBy("k").transformWithStateInPandas(
                            F.MisusedTimers(), OUT, "Update", "ProcessingTime"),
                        str(tmp_path / "ck-spark"))
    ours = run_stream(spark, input_dir, SCHEMA,
                      lambda df: backend.transform_with_state(
                          df.groupBy("k"), F.MisusedTimers(), OUT, "Update", "ProcessingTime"),
                      str(tmp_path / "ck-ours"))
    calls = len(set(theirs[0]["v"]))
    assert calls == 10
    assert _compare(ours, theirs) == 4 * calls
    assert "register None: NoneType None" in set(pd.concat(theirs.values())["s"])
