"""Rescaling a streaming query: run with parallelism 2, stop, restart with 1, 3 or 4 from
the incremental checkpoint, and (in a new query) from a savepoint; output and final state
equal a run that never rescaled."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import processors as P
import pytest
from harness import check_batches, run_stream, running_counts, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = pytest.mark.spark

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"
OP = "rc"


def batches(n: int, seed: int, rows: int = 60, keys: int = 40) -> list[pd.DataFrame]:
    """``n - 1`` random batches, then one with every key once: its output is the final
    state of every key."""
    rng = np.random.default_rng(seed)
    out = [pd.DataFrame({"k": [f"k{i}" for i in rng.integers(0, keys, rows)]})
           for _ in range(n - 1)]
    out.append(pd.DataFrame({"k": [f"k{i}" for i in range(keys)]}))
    return [pdf.assign(x=np.int64(1), ts=pd.Timestamp("2026-01-01")) for pdf in out]


reference = running_counts


def backend(state: str, local: str, parallelism: int, **kw) -> RocksDBStateBackend:
    return RocksDBStateBackend(state, StateBackendOptions(parallelism=parallelism,
                                                          max_parallelism=16, local_dir=local),
                               **kw)


def run(spark, be: RocksDBStateBackend, in_dir: str, ck: str) -> dict[int, pd.DataFrame]:
    return run_stream(spark, in_dir, SCHEMA,
                      lambda df: be.transform_with_state(df.groupBy("k"), P.RunningCount(), OUT,
                                                         operator_id=OP), ck)


check = check_batches


@pytest.mark.parametrize("new_p", [1, 3, 4])
def test_restart_with_other_parallelism_from_checkpoint_and_savepoint(spark, tmp_path, new_p):
    data = batches(4, seed=new_p)
    ref, totals = reference(data)
    in_dir, state, local, ck = (str(tmp_path / d) for d in ("in", "state", "local", "ck"))
    write_batches(in_dir, data[:2])
    be = backend(state, local, 2)
    first = run(spark, be, in_dir, ck)
    sp = be.savepoint(OP, "before-rescale")
    assert sp.parallelism == 2 and sp.checkpoint_id == 1

    # 1. same query, same state location, new parallelism: rescaled from the checkpoint
    write_batches(in_dir, data[2:], start=2)
    # a restarted driver: the new backend object replaces the old one for this location
    be2 = backend(state, local, new_p)
    second = run(spark, be2, in_dir, ck)
    check({**first, **second}, ref)
    be2.complete(OP)  # the listener completes asynchronously; do not race it
    latest = be2.coordinator(OP).latest()
    assert latest.checkpoint_id == 3 and latest.parallelism == new_p
    assert len(ref[3]) == len(totals)  # the last batch showed every key's final count

    # 2. a new query (new Spark checkpoint, new state location) started from the savepoint
    in2 = str(tmp_path / "in2")
    write_batches(in2, data[2:])
    shutil.rmtree(local, ignore_errors=True)  # nothing local to lean on
    be3 = backend(str(tmp_path / "state2"), str(tmp_path / "local2"), new_p,
                  from_savepoint=f"{state}/{OP}/_savepoints/before-rescale")
    third = run(spark, be3, in2, str(tmp_path / "ck2"))
    check(third, {0: ref[2], 1: ref[3]})
    be3.complete(OP)
    assert be3.coordinator(OP).latest().parallelism == new_p
