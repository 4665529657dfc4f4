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
    # The listener completes checkpoints asynchronously, and Spark's bus may deliver the
    # run's last progress events after awaitTermination() returned: a late one would mark
    # a record committed (rewriting it) while a test copies the directory. Completing
    # every micro-batch as committed here leaves those callbacks nothing to write.
    be.complete(OPERATOR, up_to=BATCHES - 1)
    assert be.coordinator(OPERATOR).latest().committed
    return Run(str(root / "state"), data)


# --- checkpoints built without Spark (fast; for verify and the error paths) -------------

BUILT_OPERATOR = "op"
BUILT_MAXP = 32


@dataclass(frozen=True)
class Built:
    """State of an operator written by PartitionCheckpointer + coordinator, no Spark."""

    url: str
    mode: str
    checkpoints: int
    operator: str = BUILT_OPERATOR


def _build(root: str, mode: str, batches: int = 4, parallelism: int = 2,
           n_keys: int = 200, materialize_interval: int = 2) -> Built:
    from statebackend.checkpoint import PartitionCheckpointer
    from statebackend.checkpoint.materialize import wait_for_materializations
    from statebackend.coordinator import CheckpointCoordinator
    from statebackend.keys.grouping_key import encode_grouping_key
    from statebackend.keys.groups import key_group
    from statebackend.keys.ranges import key_group_range
    from statebackend.options import StateBackendOptions
    from statebackend.state.backend import KeyedStateBackend
    from statebackend.storage import open_store

    store = open_store(f"{root}/durable", backoff_s=0.0)
    kw = ({"checkpoint_mode": mode, "materialize_interval": materialize_interval,
           "materialize_inline_ratio": 0.0}
          if mode == "changelog" else {"checkpoint_mode": mode})
    opts = StateBackendOptions(max_parallelism=BUILT_MAXP, local_dir=f"{root}/local", **kw)
    coord = CheckpointCoordinator(store, BUILT_OPERATOR, parallelism=parallelism,
                                  max_parallelism=BUILT_MAXP, num_retained=10)
    keys = [encode_grouping_key((f"k{i}",), ["string"],
                                key_group([f"k{i}"], ["string"], BUILT_MAXP))
            for i in range(n_keys)]
    for b in range(batches):
        for p in range(parallelism):
            rng = key_group_range(p, parallelism, BUILT_MAXP)
            mine = [k for k in keys if int.from_bytes(k[:2], "big") in rng]
            # later batches touch a few keys only, so SSTs are reused across checkpoints
            mine = mine if b == 0 else mine[b::5]
            cp = PartitionCheckpointer(store, BUILT_OPERATOR, p, opts, f"{root}/local")
            base = None if b == 0 else coord.restore(b - 1).manifests[p]
            inst, _ = cp.restore(base)
            be = KeyedStateBackend(inst, clock=lambda: 0)
            count = be.value_state("count", "c BIGINT")
            for i, k in enumerate(mine):
                be.set_current_key(k)
                c = count.get()
                count.update(((c[0] if c else 0) + i + b,))
            be.flush()
            cp.checkpoint(inst, b, f"a{b}", (rng.start, rng.end), be.descriptors())
            inst.close()
        wait_for_materializations()
        assert coord.try_complete(b) is not None
    coord.close()
    return Built(f"{root}/durable", mode, batches)


@pytest.fixture(scope="session", params=["incremental", "changelog"])
def built(request, tmp_path_factory) -> Built:
    """Four completed checkpoints of two partitions, in each checkpoint mode."""
    return _build(str(tmp_path_factory.mktemp(f"built-{request.param}")), request.param)


@pytest.fixture(scope="session")
def built_long_lineage(tmp_path_factory) -> Built:
    """``built`` in changelog mode, materialized every 4 batches instead of 2: the latest
    manifests list the changelogs of batches 1 to 3 (in ``built`` a materialization
    adopted at batch 3 leaves one)."""
    return _build(str(tmp_path_factory.mktemp("built-long-lineage")), "changelog",
                  materialize_interval=4)


@pytest.fixture
def built_copy(built, tmp_path) -> Built:
    """A private copy of ``built`` for a test that damages it."""
    shutil.copytree(built.url, tmp_path / "durable")
    return Built(str(tmp_path / "durable"), built.mode, built.checkpoints)


@pytest.fixture
def built_long_lineage_copy(built_long_lineage, tmp_path) -> Built:
    """A private copy of ``built_long_lineage`` for a test that damages it."""
    shutil.copytree(built_long_lineage.url, tmp_path / "durable")
    return Built(str(tmp_path / "durable"), built_long_lineage.mode,
                 built_long_lineage.checkpoints)
