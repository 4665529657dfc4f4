"""The CLI tests share one real streaming run: its checkpoints are what they inspect.

The Spark session is the run's one ``spark`` fixture (tests/conftest.py).
Tests that damage state work on a copy of the run's state directory.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

OPERATOR = "rc"
BATCHES = 5


@dataclass(frozen=True)
class Run:
    """A finished streaming run: where its state is and what it was fed."""

    state_dir: str
    data: list[pd.DataFrame]
    operator: str = OPERATOR

    def copy(self, target: str) -> str:
        """A private copy of the state directory (for tests that damage it)."""
        shutil.copytree(self.state_dir, target, symlinks=True)
        return target


def make_batches(n: int, seed: int = 7, rows: int = 40, keys: int = 12) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    return [pd.DataFrame({"k": [f"k{i}" for i in rng.integers(0, keys, rows)],
                          "x": rng.integers(0, 10, rows).astype("int64"),
                          "ts": pd.Timestamp("2026-01-01")}) for _ in range(n)]


@pytest.fixture(scope="session")
def streaming_run(spark, tmp_path_factory) -> Run:
    """RunningCount over 5 micro-batches, 2 partitions, every checkpoint retained."""
    import processors as P
    from harness import run_stream, write_batches

    from statebackend import RocksDBStateBackend, StateBackendOptions

    root = tmp_path_factory.mktemp("cli-run")
    data = make_batches(BATCHES)
    write_batches(str(root / "in"), data)
    be = RocksDBStateBackend(str(root / "state"),
                             StateBackendOptions(parallelism=2, num_retained=10,
                                                 local_dir=str(root / "local")))
    run_stream(spark, str(root / "in"), "k STRING, x BIGINT, ts TIMESTAMP",
               lambda df: be.transform_with_state(df.groupBy("k"), P.RunningCount(),
                                                  "k STRING, v BIGINT", operator_id=OPERATOR),
               str(root / "ck"))
    # the listener completes checkpoints asynchronously; make sure the last one is done
    be.complete(OPERATOR)
    return Run(str(root / "state"), data)
