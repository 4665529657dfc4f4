"""map_in_pandas: batch-at-a-time keyed state, checked against a pandas reference."""

from __future__ import annotations

import processors as P
import pytest
from harness import check_batches, random_batches, run_stream, running_counts, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = pytest.mark.spark


def test_vectorised_running_count_equals_pandas_reference(spark, tmp_path):
    data = random_batches(4, seed=29, rows=80, keys=25)
    write_batches(str(tmp_path / "in"), data)
    be = RocksDBStateBackend(str(tmp_path / "state"),
                             StateBackendOptions(parallelism=2, local_dir=str(tmp_path / "local")))
    ours = run_stream(spark, str(tmp_path / "in"), "k STRING, x BIGINT, ts TIMESTAMP",
                      lambda df: be.map_in_pandas(df, "k", P.vector_count, "k STRING, v BIGINT",
                                                  state_schema="c BIGINT", operator_id="vec"),
                      str(tmp_path / "ck"))
    check_batches(ours, running_counts(data)[0])
    be.complete("vec")
    assert be.coordinator("vec").latest().checkpoint_id == 3
