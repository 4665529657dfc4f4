"""Run an unmodified ``applyInPandasWithState`` function on our keyed state.

The function receives PySpark's own :class:`pyspark.sql.streaming.state.GroupState`, built
from our stored value, so every method (exists, get, getOption, update, remove,
hasTimedOut, setTimeoutDuration, setTimeoutTimestamp, getCurrentWatermarkMs,
getCurrentProcessingTimeMs) behaves as in Spark. As in Spark: keys with input are called
first; then keys without input whose timeout passed (processing time: timeout < batch
timestamp; event time: timeout < watermark) are called with an empty iterator and
``hasTimedOut`` true; the timeout is reset on every call (set it again to keep it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import StructType

from ..state.backend import KeyedStateBackend
from .context import BatchContext, KeyGroups

STATE_NAME = "groupState"
TIMEOUT_NAME = "groupStateTimeout"


def run_group_function(func: Callable, backend: KeyedStateBackend, groups: KeyGroups,
                       ctx: BatchContext, state_schema: StructType, timeout_conf: str,
                       decode_key: Callable[[bytes], tuple]) -> list[pd.DataFrame]:
    value, timeout = declare_group_states(backend, state_schema)
    watermark_present = ctx.watermark_ms >= 0
    wm = ctx.watermark_ms if watermark_present else GroupState.NO_TIMESTAMP
    out: list[pd.DataFrame] = []

    def call(key: tuple, frames: list[pd.DataFrame], timed_out: bool) -> None:
        current = value.get()
        old = timeout.get()
        if old is not None:
            backend.delete_timer(old[0])
            timeout.clear()
        state = GroupState(
            optionalValue=current,  # type: ignore[arg-type]  # GroupState takes any tuple
            batchProcessingTimeMs=ctx.processing_time_ms,
            eventTimeWatermarkMs=wm,
            timeoutConf=timeout_conf,
            hasTimedOut=timed_out,
            watermarkPresent=watermark_present,
            defined=current is not None,
            updated=False,
            removed=False,
            timeoutTimestamp=GroupState.NO_TIMESTAMP,
            keyAsUnsafe=b"",
            valueSchema=state_schema,
        )
        result = func(key, iter(frames), state)
        for item in result if result is not None else ():
            if not isinstance(item, pd.DataFrame):
                raise TypeError(f"the applyInPandasWithState function must yield pandas "
                                f"DataFrames, got {type(item).__name__}")
            if len(item):
                out.append(item)
        if state._removed:
            value.clear()
        elif state._updated:
            value.update(tuple(state._value))
        ts = state._timeout_timestamp
        if ts != GroupState.NO_TIMESTAMP and not state._removed:
            timeout.update((int(ts),))
            backend.register_timer(int(ts))

    # no prefetch: rocksdict multi-get measured slower than single gets here (see notes)
    rows_of = groups.slicer()
    for i in range(len(groups)):
        backend.set_current_key(groups.key_bytes[i])
        call(groups.keys[i], [rows_of(i)], False)

    threshold = _timeout_threshold(timeout_conf, ctx, watermark_present)
    if threshold is not None:
        # Spark times a key out when its timeout is strictly before the threshold
        for key, _ts in list(backend.pop_expired_timers(threshold - 1)):
            backend.set_current_key(key)
            call(decode_key(key), [], True)
    return out


def declare_group_states(backend: KeyedStateBackend, state_schema: StructType) -> tuple:
    """The states an ``applyInPandasWithState`` function's keys live in: ``(value,
    timeout)`` (the driver's schema check declares them too)."""
    return (backend.value_state(STATE_NAME, state_schema),
            backend.value_state(TIMEOUT_NAME, "ts BIGINT"))


def _timeout_threshold(timeout_conf: str, ctx: BatchContext,
                       watermark_present: bool) -> int | None:
    """Timeouts strictly before this time out in this batch (None: none can)."""
    if timeout_conf == GroupStateTimeout.ProcessingTimeTimeout:
        return ctx.processing_time_ms
    if timeout_conf == GroupStateTimeout.EventTimeTimeout and watermark_present:
        return ctx.watermark_ms
    return None


def check_timeout_conf(timeout_conf: Any) -> str:
    allowed = (GroupStateTimeout.NoTimeout, GroupStateTimeout.ProcessingTimeTimeout,
               GroupStateTimeout.EventTimeTimeout)
    if timeout_conf not in allowed:
        raise ValueError(f"timeoutConf must be one of {allowed}, got {timeout_conf!r}")
    return timeout_conf
