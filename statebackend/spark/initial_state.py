"""Driver side of a distributed initial state: route the initial-state DataFrame to our
partitions by key group, as the input is routed, and stage each partition's rows in
durable storage in one Spark job (:mod:`statebackend.task.initial_state`). The driver
never collects the rows; it collects one row per partition naming the staged file.

As Spark, the initial state applies on the query's first run only: when the operator
already has a checkpoint, nothing is staged and the tasks never look for it.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import OptionsError
from ..task.context import OperatorConfig
from ..task.initial_state import (
    STAGE_SCHEMA,
    InitialState,
    make_stage_task,
    new_stage_id,
)
from . import plan
from .session import grouping_columns

log = logging.getLogger("statebackend")

__all__ = ["stage_initial_state"]


def stage_initial_state(initial_state: Any, config: OperatorConfig, has_state: bool
                        ) -> InitialState | None:
    """Stage ``initial_state`` (``init_df.groupBy(keys)``) for the operator's first run;
    None when the operator already has state (``has_state``), as Spark ignores the
    initial state of a query that restarts from its checkpoint."""
    init_df, init_keys = grouping_columns(initial_state)
    if init_df.isStreaming:
        raise OptionsError("initialState", "streaming DataFrame",
                           "initialState must be a batch DataFrame grouped by the key "
                           "(spark.read...groupBy(key)), not a streaming one")
    key = plan.key_spec(init_df, init_keys)
    if key.types != config.key.types:
        raise OptionsError("initialState", list(init_keys),
                           f"the initial state is grouped by {list(key.columns)} of types "
                           f"{list(key.types)}, the input by {list(config.key.columns)} of "
                           f"types {list(config.key.types)}: group both by keys of the same "
                           f"types, in the same order")
    if has_state:
        log.info("operator %s has state: its initial state is not applied (as Spark, only "
                 "a query's first run applies it)", config.operator_id)
        return None
    stage_id = new_stage_id()
    placed = plan.place(init_df, key, config.parallelism, config.max_parallelism)
    # one small row per partition with rows: the staged file of the attempt Spark kept
    staged = placed.mapInPandas(make_stage_task(config, stage_id), STAGE_SCHEMA).collect()
    files = tuple(sorted((int(r["partition"]), str(r["path"])) for r in staged))
    rows = sum(int(r["rows"]) for r in staged)
    log.info("operator %s: initial state of %d rows staged for %d partitions (stage %s)",
             config.operator_id, rows, len(files), stage_id)
    return InitialState(key, files, rows)
