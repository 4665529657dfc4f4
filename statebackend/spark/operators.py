"""The driver's half of the swap-in calls: check the arguments, build the operator's frozen
:class:`~statebackend.task.context.OperatorConfig` once (:func:`build_config`), check the
declared state against the stored one, and plan the operator
(:func:`~.operator_plan.operator_plan`). :class:`statebackend.RocksDBStateBackend` is the
facade over these functions; they reach the backend only through :class:`Driver`.

Every function works on a classic and on a Spark Connect session: session differences are
read through :mod:`.session`, and everything else is the public DataFrame API.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import IncompatibleStateError, OptionsError
from ..model.manifest import check_component
from ..options import StateBackendOptions
from ..state.value import MAX_BLOCKS, is_block_count
from ..task.context import OperatorConfig, SavepointSource
from ..task.group_state import check_timeout_conf, declare_group_states, run_group_function
from ..task.processor import run_processor
from ..task.vector import column_state_declaration, vector_process
from . import placement, plan
from .progress import metrics_row_values
from .schema_check import check_against_latest, processor_declarations
from .session import check_session, grouping_columns, session_of, watermark_of

log = logging.getLogger("statebackend")

__all__ = ["Driver", "ReadMode", "apply_in_pandas_with_state", "build_config",
           "default_operator_id", "map_in_pandas", "transform_with_state"]

TIME_MODES = {"none": "None", "processingtime": "ProcessingTime", "eventtime": "EventTime"}
# GroupStateTimeout's values (strings), without importing the classic API's module
_EVENT_TIMEOUT, _PROCESSING_TIMEOUT = "EventTimeTimeout", "ProcessingTimeTimeout"


class Driver(Protocol):
    """What the swap-in plans need of the backend object on the driver."""

    checkpoint_location: str
    storage_options: dict[str, Any]

    def options_for(self, spark: Any) -> StateBackendOptions: ...
    def coordinator(self, operator_id: str) -> Any: ...
    def savepoint_source(self, operator_id: str) -> SavepointSource | None: ...
    def attach(self, spark: Any, config: OperatorConfig) -> None: ...


@dataclass(frozen=True)
class ReadMode:
    """How an operator's tasks read their input (the swap-in call decides it).

    ``ticks``: the plan adds tick rows so timers fire in batches without input;
    ``drop_late``: input at or before the previous batch's watermark never reaches the
    user's code (Spark's event-time operators drop it); ``timers``: the time mode the
    carrier keeps running; ``per_key``: rows grouped by key (False: ``map_in_pandas``'s
    frames of ``frame_rows`` rows, None: one frame).
    """

    ticks: bool = False
    drop_late: bool = False
    timers: str = "None"
    per_key: bool = True
    frame_rows: int | None = None


def build_config(driver: Driver, df: Any, keys: list[str], operator_id: str, schema: Any,
                 output_mode: str | None, mode: ReadMode,
                 event_time_column: tuple[str, int] | None = None) -> OperatorConfig:
    """The operator's configuration, every field decided here: options, layout checks
    against the stored state, completion of what the previous run left, the run identity
    of a batch job, the watermark, the plan (shuffle or carrier) and the metrics row.
    ``event_time_column``: the output's event time (``eventTimeColumnName``), checked
    by :func:`event_time_column_of`."""
    check_component(operator_id)
    spark = session_of(df)
    check_session(spark)
    opts = driver.options_for(spark)
    streaming = df.isStreaming
    coord = driver.coordinator(operator_id)
    with coord.planning():
        epoch, run_id = _take_over(coord, operator_id, opts, streaming)
    parallelism = opts.parallelism
    assert parallelism is not None  # options_for always resolves it
    carrier = False
    if streaming:  # batch DataFrames keep the shuffle plan
        chosen = placement.choose(df, opts.placement, coord.latest(), output_mode,
                                  mode.timers, event_time_column)
        placement.log_choice(operator_id, opts.placement, chosen)
        carrier = chosen.carrier
    progress = streaming and opts.progress_metrics
    config = OperatorConfig(
        operator_id=operator_id, checkpoint_location=driver.checkpoint_location,
        storage_options=driver.storage_options, options=opts, parallelism=parallelism,
        key=plan.key_spec(df, keys), epoch=epoch, run_id=run_id,
        watermark=watermark_of(df) if streaming else None,
        ticks=mode.ticks, drop_late=mode.drop_late, per_key=mode.per_key,
        frame_rows=mode.frame_rows, from_savepoint=driver.savepoint_source(operator_id),
        progress_columns=metrics_row_values(schema) if progress else None,
        timers=mode.timers, carrier=carrier, event_time_column=event_time_column)
    driver.attach(spark, config)
    return config


def _take_over(coord: Any, operator_id: str, opts: StateBackendOptions,
               streaming: bool) -> tuple[int | None, str | None]:
    """Check the stored state's layout against ``opts``, complete what the previous run
    left, and give a batch job its (epoch, run id); a streaming query's are Spark's."""
    latest = coord.latest()
    if latest is not None:
        from ..savepoint.reader import check_max_parallelism

        check_max_parallelism(latest.max_parallelism, opts.max_parallelism,
                              f"the state of operator {operator_id!r}")
        if latest.parallelism != opts.parallelism:
            # checkpoints the previous run published but did not complete have its layout
            coord.parallelism = latest.parallelism
            try:
                _complete(coord)
            except IncompatibleStateError:
                pass  # written by a run with the new layout: completed just below
    coord.parallelism = opts.parallelism
    _complete(coord)
    latest = coord.latest()
    if latest is not None and latest.parallelism != opts.parallelism:
        log.warning("operator %s: state has parallelism %d, query asks for %d",
                    operator_id, latest.parallelism, opts.parallelism)
    if streaming:
        return None, None
    # a batch job: the next checkpoint id, and the writer identity of this run
    return (0 if latest is None else latest.checkpoint_id + 1), f"batch-{uuid.uuid4().hex}"


def _complete(coord: Any) -> None:
    from ..coordinator.pending import complete_pending

    complete_pending(coord)


def _plan(driver: Driver, df: Any, config: OperatorConfig, process: Callable, schema: Any,
          output_mode: str | None) -> Any:
    from .operator_plan import operator_plan

    return operator_plan(df, config, process, schema, output_mode, driver.checkpoint_location)


# --- the swap-in calls ------------------------------------------------------------------

def transform_with_state(driver: Driver, grouped_data: Any, processor: Any, output_type: Any,
                         output_mode: str, time_mode: str, initial_state: Any,
                         event_time_column: str, operator_id: str | None, flavour: str,
                         ticks: bool) -> Any:
    """``grouped.transformWithStateInPandas`` (``flavour="pandas"``) or
    ``grouped.transformWithState`` (``"row"``) on our state."""
    mode = _check_processor_call(processor, time_mode, flavour, output_mode)
    df, keys = grouping_columns(grouped_data)
    op_id = operator_id or default_operator_id(processor)
    schema = struct_of(session_of(df), output_type)
    event_time = event_time_column_of(df, schema, event_time_column)
    # as Spark: in event-time mode input at or before the watermark for late events never
    # reaches the processor; the carrier keeps partitions with timers running
    config = build_config(driver, df, keys, op_id, schema, output_mode,
                          ReadMode(ticks=ticks, drop_late=mode == "EventTime", timers=mode),
                          event_time)
    # schemas the stored state cannot evolve to fail here, before any task runs
    check_against_latest(driver.coordinator(op_id), processor_declarations(processor, mode))
    as_rows = flavour == "row"
    staged = None
    if initial_state is not None:
        # routed to our partitions by key group and staged by executors: never collected
        # here; applied by the partitions' tasks of the query's first run
        from .initial_state import stage_initial_state

        staged = stage_initial_state(initial_state, config,
                                     has_state=driver.coordinator(op_id).latest() is not None)

    def process(backend, groups, ctx, decode):
        initial = None
        if staged is not None and ctx.first:
            from ..task.initial_state import initial_groups, operator_root

            initial = initial_groups(operator_root(config), staged, config, ctx.partition)
        return run_processor(processor, backend, groups, ctx, mode, decode,
                             as_rows=as_rows, initial=initial)

    if as_rows:
        names = schema.fieldNames()
        row_process = process

        def process(backend, groups, ctx, decode):  # noqa: F811 - Rows -> one frame
            import pandas as pd
            rows = row_process(backend, groups, ctx, decode)
            return [pd.DataFrame([tuple(r) for r in rows], columns=names)] if rows else []

    out = _plan(driver, df, config, process, schema, output_mode)
    if event_time is None:
        return out
    # as Spark's: the stateful operators after ours apply the query's watermark to it
    assert config.watermark is not None  # event_time_column_of checked it
    return plan.with_event_time(out, event_time[0], config.watermark[1])


def _check_processor_call(processor: Any, time_mode: str, flavour: str,
                          output_mode: str) -> str:
    """The time mode of a ``transform_with_state`` call whose arguments are valid."""
    from pyspark.sql.streaming import StatefulProcessor

    if not isinstance(processor, StatefulProcessor):
        raise TypeError("statefulProcessor must be a pyspark.sql.streaming.StatefulProcessor")
    mode = TIME_MODES.get(str(time_mode).lower())
    if mode is None:
        raise OptionsError("timeMode", time_mode,
                           f"timeMode must be one of {list(TIME_MODES.values())}")
    if flavour not in ("pandas", "row"):
        raise OptionsError("flavour", flavour, "flavour must be 'pandas' or 'row'")
    check_output_mode(output_mode)
    return mode


def apply_in_pandas_with_state(driver: Driver, grouped_data: Any, func: Callable,
                               output_type: Any, state_type: Any, output_mode: str,
                               timeout_conf: str, operator_id: str | None, ticks: bool) -> Any:
    """``grouped.applyInPandasWithState`` on our state."""
    check_output_mode(output_mode)
    timeout = check_timeout_conf(timeout_conf)
    df, keys = grouping_columns(grouped_data)
    op_id = operator_id or default_operator_id(func)
    spark = session_of(df)
    schema = struct_of(spark, output_type)
    state_schema = struct_of(spark, state_type)
    timers = {_EVENT_TIMEOUT: "EventTime", _PROCESSING_TIMEOUT: "ProcessingTime"}.get(
        str(timeout), "None")
    # as Spark: with an event-time timeout, late input never reaches the function
    config = build_config(driver, df, keys, op_id, schema, output_mode,
                          ReadMode(ticks=ticks, drop_late=str(timeout) == _EVENT_TIMEOUT,
                                   timers=timers))
    check_against_latest(driver.coordinator(op_id),
                         lambda b: declare_group_states(b, state_schema))

    def process(backend, groups, ctx, decode):
        return run_group_function(func, backend, groups, ctx, state_schema, timeout, decode)

    return _plan(driver, df, config, process, schema, output_mode)


def map_in_pandas(driver: Driver, df: Any, key: str | list[str], func: Callable, schema: Any,
                  state_schema: Any, operator_id: str | None, value_blocks: int | None,
                  frame_rows: int | None, output_mode: str) -> Any:
    """``func(frames, state)`` over each partition's input with vectorised keyed state."""
    if value_blocks is not None and not is_block_count(value_blocks):
        raise OptionsError("value_blocks", value_blocks,
                           f"value_blocks must be None or an int in 1..{MAX_BLOCKS}, got "
                           f"{value_blocks!r}")
    if frame_rows is not None and (isinstance(frame_rows, bool)
                                   or not isinstance(frame_rows, int) or frame_rows < 1):
        raise OptionsError("frame_rows", frame_rows,
                           f"frame_rows must be None or an int >= 1, got {frame_rows!r}")
    check_output_mode(output_mode)
    keys = [key] if isinstance(key, str) else list(key)
    op_id = operator_id or default_operator_id(func)
    out_schema = struct_of(session_of(df), schema)
    config = build_config(driver, df, keys, op_id, out_schema, output_mode,
                          ReadMode(per_key=False, frame_rows=frame_rows))
    check_against_latest(driver.coordinator(op_id),
                         column_state_declaration(config, state_schema, value_blocks))
    process = vector_process(func, config, state_schema, value_blocks)
    return _plan(driver, df, config, process, out_schema, output_mode)


# --- helpers ----------------------------------------------------------------------------

def check_output_mode(mode: str) -> None:
    if str(mode).lower() not in ("update", "append", "complete"):
        raise OptionsError("outputMode", mode,
                           "outputMode must be 'Update', 'Append' or 'Complete'")


_NO_WATERMARK = ("[CANNOT_ASSIGN_EVENT_TIME_COLUMN_WITHOUT_WATERMARK] Watermark needs to be "
                 "defined to reassign event time column. Failed to find watermark definition "
                 "in the streaming query. SQLSTATE: 42611")
_TIMESTAMP_TYPES = ("TimestampType", "TimestampNTZType")


def event_time_column_of(df: Any, schema: Any, name: str | None) -> tuple[str, int] | None:
    """``(name, position)`` in the output ``schema`` of ``eventTimeColumnName``, None when
    it is not set; refused as Spark refuses it (no ``withWatermark`` upstream, which a
    batch DataFrame never has, or no such output column), and when the column is not a
    timestamp (its values are compared with the watermark)."""
    if not name:
        return None
    if not df.isStreaming or watermark_of(df) is None:
        raise OptionsError("eventTimeColumnName", name, f"{_NO_WATERMARK} (statebackend: "
                           f"eventTimeColumnName={name!r} needs a streaming input with "
                           f"df.withWatermark(column, delay) before groupBy)")
    names = schema.fieldNames()
    if name not in names:
        raise OptionsError("eventTimeColumnName", name,
                           f"eventTimeColumnName={name!r} is not a column of the output "
                           f"schema {names}: name the output column holding each row's "
                           f"event time")
    position = names.index(name)
    kind = type(schema.fields[position].dataType).__name__
    if kind not in _TIMESTAMP_TYPES:
        raise OptionsError("eventTimeColumnName", name,
                           f"eventTimeColumnName={name!r} is a {kind} column; expected a "
                           f"TIMESTAMP (or TIMESTAMP_NTZ) column of the output schema, "
                           f"whose values are compared with the watermark")
    return name, position


def default_operator_id(obj: Any) -> str:
    from pyspark.sql.streaming import StatefulProcessor

    name = type(obj).__name__ if not callable(obj) or isinstance(obj, StatefulProcessor) \
        else getattr(obj, "__name__", type(obj).__name__)
    return re.sub(r"[^A-Za-z0-9._=-]", "_", name) or "operator"


def struct_of(spark: Any, schema: Any) -> Any:
    """A ``StructType`` from a ``StructType`` or a DDL string (parsed by the session)."""
    from pyspark.sql.types import StructType

    if isinstance(schema, StructType):
        return schema
    return spark.createDataFrame([], schema).schema
