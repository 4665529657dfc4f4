"""Run one partition task of a ``map_in_pandas`` running count in this process, without
Spark (the task identity is patched in): shared by the task unit tests and the tests of
instances kept open between batches (``resident_procs.py`` runs it in a subprocess)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from statebackend.options import StateBackendOptions
from statebackend.spark.plan import KeySpec
from statebackend.storage import open_store
from statebackend.storage.manifests import list_published_manifests, operator_store
from statebackend.task import runner
from statebackend.task.context import PTIME_COL, OperatorConfig
from statebackend.task.vector import vector_config, vector_process


def count(frames, state):
    """map_in_pandas running count (the benchmark's vector_count, without its checks)."""
    for pdf in frames:
        g = pdf.groupby("k").size()
        keys = pd.Series(g.index, name="k")
        old = pd.to_numeric(state.get(keys)["c"]).fillna(0).astype("int64").to_numpy()
        state.put(keys, pd.DataFrame({"c": old + g.to_numpy()}))
        yield pd.DataFrame({"k": g.index, "v": old + g.to_numpy()})


def frames(rows: list[str], per_frame: int = 3):
    """``rows`` as Spark's Arrow batches of ``per_frame`` rows."""
    for i in range(0, len(rows), per_frame):
        part = rows[i:i + per_frame]
        yield pd.DataFrame({"k": part, PTIME_COL: np.full(len(part), 5, np.int64)})


def config(root: str, operator_id: str = "frames", **options) -> OperatorConfig:
    return OperatorConfig(
        operator_id=operator_id, checkpoint_location=f"{root}/durable",
        storage_options={}, parallelism=1, key=KeySpec(("k",), ("string",)),
        options=StateBackendOptions(parallelism=1, max_parallelism=128,
                                    local_dir=f"{root}/local", **options))


LAST_RESTORE: dict = {}
"""The restore metrics of the last :func:`run_task` (source, fallback reason, ...)."""


def run_task(root: str, batch: int, attempt: str, input_frames, frame_rows: int = 4,
             operator_id: str = "frames", **options) -> tuple[pd.DataFrame, str]:
    """One task of batch ``batch`` over ``input_frames``: the output, and where the task
    restored its state from (``metrics.restore.source`` of its manifest)."""
    cfg = config(root, operator_id, **options)
    cfg = vector_config(cfg, frame_rows)
    process = vector_process(count, cfg, "c BIGINT", None)
    original = runner.task_identity
    runner.task_identity = lambda _c, _ours=None: (batch, 0, attempt)
    try:
        out = list(runner.run_partition(cfg, input_frames, process))
    finally:
        runner.task_identity = original
    store = operator_store(open_store(cfg.checkpoint_location), operator_id)
    (manifest,) = [m for m in list_published_manifests(store, batch, 0) if m.attempt == attempt]
    LAST_RESTORE.clear()
    LAST_RESTORE.update(manifest.metrics["restore"])
    return (pd.concat(out) if out else pd.DataFrame({"k": [], "v": []}),
            manifest.metrics["restore"]["source"])
