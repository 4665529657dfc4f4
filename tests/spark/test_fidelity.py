"""Fidelity suite: processors and functions written as users write them, run on Spark's own
operators and on ours over the same input files, every micro-batch's output compared.

The input is what real streams deliver: realistic event times (late November 2026, not
epoch 0), rows out of order within a batch, rows so late that Spark drops them, rows late
only against the current watermark (which Spark keeps: it drops input at or before the
*previous* batch's watermark), null keys, an empty micro-batch, and keys seen in one batch
only. The processors read frames by position, catch PySpark's exceptions, and store nested
and composite state types whose ``repr`` as read back is part of the output.
"""

from __future__ import annotations

import fidelity_procs as F
import pandas as pd
import pytest
from fidelity_cases import CASES, OUT, SCHEMA, Case, fidelity_batches
from harness import (
    assert_same,
    assert_same_but_empty_batches,
    recorded_plan,
    run_stream,
)

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def input_dir(fidelity_classic):
    return fidelity_classic.input_dir


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_same_output_as_spark(fidelity_classic, case: Case):
    # both runs: the pytest run's one classic run of the case, ours and Spark's side by
    # side (conftest.fidelity_classic; tests/connect compares ours with ours on Connect)
    ours, theirs, backend = fidelity_classic(case.name)
    assert len(theirs) >= 6, sorted(theirs)  # and any no-data micro-batch Spark ran
    assert sum(len(v) for v in theirs.values()) > 0
    if case.spark_adds_empty_batches:
        assert_same_but_empty_batches(ours, theirs)
    else:
        assert_same(ours, theirs)
    if case.event_timers:
        # under Spark's defaults Spark ran no-data micro-batches after the six files, and
        # the expirations in them are ours too: the default ran ours in the carrier
        assert len(theirs) > 6, sorted(theirs)
        [op] = backend.operator_ids()
        assert recorded_plan(backend, op, max(ours)) == "carrier"
    if case.check is not None:
        case.check(ours)


def test_handle_misuse_is_a_pyspark_error_and_the_processor_goes_on(spark, tmp_path, input_dir):
    """``deleteIfExists`` outside ``init``: Spark raises PySparkRuntimeError with condition
    STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE and then loses its
    worker's connection to the JVM, so there is no Spark run to compare with; ours raises the
    same class and condition, and a processor that catches it carries on."""
    backend = RocksDBStateBackend(str(tmp_path / "state"),
                                  StateBackendOptions(parallelism=2,
                                                      local_dir=str(tmp_path / "local")))
    ours = run_stream(spark, input_dir, SCHEMA,
                      lambda df: backend.transform_with_state(
                          df.groupBy("k"), F.CatchesPySparkErrors(), OUT, "Update", "None"),
                      str(tmp_path / "ck-ours"))
    outcomes = set(pd.concat(ours.values())["s"])
    assert outcomes == {"PySparkRuntimeError "
                        "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE"}
    def key(k):
        return None if pd.isna(k) else k

    last = {key(k): int(v) for b in sorted(ours) for k, v in zip(ours[b]["k"], ours[b]["v"])}
    counts = pd.concat(fidelity_batches()).groupby("k", dropna=False).size()
    assert last == {key(k): int(n) for k, n in counts.items()}
