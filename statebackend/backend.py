"""``RocksDBStateBackend``: the one object users create, and the swap-in calls.

    backend = RocksDBStateBackend("/tmp/state/orders")            # or "s3://bucket/state"
    out = backend.transform_with_state(df.groupBy("user"), MyProcessor(), schema,
                                       "Update", "None")            # was df.groupBy(...).transformWithStateInPandas(...)
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, GroupedData, SparkSession
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupStateTimeout
from pyspark.sql.types import StructType

from .coordinator.pending import complete_pending
from .errors import IncompatibleStateError, OptionsError
from .model.manifest import check_component
from .options import (
    StateBackendOptions,
    check_location,
    check_storage_options,
    coerce_options,
    default_max_parallelism,
)
from .redact import redact_options, redact_url
from .spark import plan
from .spark.executor import DRIVER_ID
from .spark.group_state import check_timeout_conf, declare_group_states, run_group_function
from .spark.processor import run_processor
from .spark.schema_check import check_against_latest, processor_declarations
from .spark.task import (
    DEFAULT_FRAME_ROWS,
    OperatorConfig,
    SavepointSource,
    group_by_key,
)
from .spark.vector import column_state_declaration, vector_process
from .state.value import MAX_BLOCKS, is_block_count

log = logging.getLogger("statebackend")

_TIME_MODES = {"none": "None", "processingtime": "ProcessingTime", "eventtime": "EventTime"}


class RocksDBStateBackend:
    """Keyed state in RocksDB, one instance per Spark partition, checkpointed to
    ``checkpoint_location`` (any fsspec URL; a plain path is a local directory).

    Parameters
    ----------
    checkpoint_location : str
        Root of the durable checkpoints. Each operator gets a sub-directory named by its
        ``operator_id``.
    options : StateBackendOptions or mapping, optional
        Tuning; defaults are read from the active session's ``spark.statebackend.*`` conf.
        A mapping of option names (``{"num_retained": 5}``) or of Spark keys
        (``{"spark.statebackend.num-retained": "5"}``) is converted at once.
    storage_options : mapping, optional
        Passed to fsspec (credentials, endpoint) for remote locations; never printed.

    Raises
    ------
    OptionsError
        At construction: an unknown or misspelled option, a value out of range, storage
        options that are not a mapping, or a location whose protocol fsspec does not know
        (or whose filesystem package is not installed).
    """

    def __init__(self, checkpoint_location: str, options: StateBackendOptions | None = None,
                 storage_options: dict[str, Any] | None = None, *,
                 from_savepoint: str | None = None) -> None:
        # Everything is checked here, not at the first batch: an unknown protocol, storage
        # options that are not a mapping, an options dict with a misspelled key.
        check_location(checkpoint_location)
        options = coerce_options(options)
        storage_options = check_storage_options(storage_options)
        if from_savepoint is not None and (not isinstance(from_savepoint, str)
                                           or not from_savepoint):
            raise OptionsError("from_savepoint", from_savepoint,
                               "from_savepoint is a savepoint name or the URL of its directory")
        if from_savepoint is not None and ("/" in from_savepoint or ":" in from_savepoint):
            check_location(from_savepoint, "from_savepoint")  # a URL: its protocol too
        self.checkpoint_location = checkpoint_location
        # Operators without state yet start from this savepoint (a name under each
        # operator's _savepoints/, or the URL of one savepoint directory).
        self.from_savepoint = from_savepoint
        self._explicit_options = options
        self.storage_options = storage_options
        self._coordinators: dict[str, Any] = {}
        self._options: StateBackendOptions | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        # storage options hold credentials, and a location may too: never print them
        return (f"RocksDBStateBackend({redact_url(self.checkpoint_location)!r}, "
                f"options={self._explicit_options!r}, "
                f"storage_options={redact_options(self.storage_options)})")

    # --- pickling: only configuration ships to executors --------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"checkpoint_location": self.checkpoint_location,
                "_explicit_options": self._explicit_options,
                "storage_options": self.storage_options,
                "from_savepoint": self.from_savepoint}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("from_savepoint", None)
        self._coordinators = {}
        self._options = None
        self._lock = threading.Lock()

    # --- options ------------------------------------------------------------------------

    def options_for(self, spark: SparkSession) -> StateBackendOptions:
        """Explicit options > ``spark.statebackend.*`` conf > defaults, with the parallelism
        defaulting to ``spark.sql.shuffle.partitions``."""
        if self._explicit_options is None:
            conf = dict(spark.sparkContext.getConf().getAll())
            conf["spark.sql.shuffle.partitions"] = str(spark.conf.get("spark.sql.shuffle.partitions"))
            return StateBackendOptions.from_spark_conf(conf)
        opts = self._explicit_options
        if opts.parallelism is None:
            p = int(str(spark.conf.get("spark.sql.shuffle.partitions")))
            opts = opts.with_(parallelism=p,
                              max_parallelism=max(opts.max_parallelism, default_max_parallelism(p))
                              if p > opts.max_parallelism else opts.max_parallelism)
        return opts

    # --- the swap-in calls --------------------------------------------------------------

    def transform_with_state(self, grouped_data: GroupedData, statefulProcessor: StatefulProcessor,
                             outputStructType: StructType | str, outputMode: str = "Update",
                             timeMode: str = "None", initialState: GroupedData | None = None,
                             eventTimeColumnName: str = "", *, operator_id: str | None = None,
                             flavour: str = "pandas", ticks: bool = False) -> DataFrame:
        """Swap-in for ``grouped.transformWithStateInPandas`` (``flavour="pandas"``) and
        ``grouped.transformWithState`` (``flavour="row"``), same arguments, same output."""
        if not isinstance(statefulProcessor, StatefulProcessor):
            raise TypeError("statefulProcessor must be a pyspark.sql.streaming.StatefulProcessor")
        mode = _TIME_MODES.get(str(timeMode).lower())
        if mode is None:
            raise OptionsError("timeMode", timeMode, f"timeMode must be one of {list(_TIME_MODES.values())}")
        if flavour not in ("pandas", "row"):
            raise OptionsError("flavour", flavour, "flavour must be 'pandas' or 'row'")
        _check_output_mode(outputMode)
        df, keys = plan.grouping_columns(grouped_data)
        op_id = operator_id or _default_operator_id(statefulProcessor)
        config = self._config(df, keys, op_id)
        config.ticks = ticks
        # as Spark: in event-time mode input at or before the watermark for late events
        # never reaches the processor
        config.drop_late = mode == "EventTime"
        config.timers = mode  # the carrier plan keeps partitions with timers running
        as_rows = flavour == "row"
        processor = statefulProcessor
        # schemas the stored state cannot evolve to fail here, before any task runs
        check_against_latest(self.coordinator(op_id), processor_declarations(processor, mode))
        initial_pdf_holder: dict[str, Any] = {}
        if initialState is not None:
            # first-batch initial state: collected once on the driver (it is small by nature)
            init_df, init_keys = plan.grouping_columns(initialState)
            initial_pdf_holder["pdf"] = init_df.toPandas()
            initial_pdf_holder["keys"] = init_keys

        def process(backend, groups, ctx, decode):
            initial = None
            if "pdf" in initial_pdf_holder and ctx.first:
                initial = _initial_groups(initial_pdf_holder, config, ctx.partition)
            return run_processor(processor, backend, groups, ctx, mode, decode,
                                 as_rows=as_rows, initial=initial)

        if as_rows:
            names = _struct(df.sparkSession, outputStructType).fieldNames()
            row_process = process

            def process(backend, groups, ctx, decode):  # noqa: F811 - Rows -> one frame
                import pandas as pd
                rows = row_process(backend, groups, ctx, decode)
                return [pd.DataFrame([tuple(r) for r in rows], columns=names)] if rows else []

        return self._plan(df, config, process, outputStructType, outputMode)

    def apply_in_pandas_with_state(self, grouped_data: GroupedData, func: Callable,
                                   outputStructType: StructType | str,
                                   stateStructType: StructType | str, outputMode: str = "Update",
                                   timeoutConf: str = "NoTimeout", *,
                                   operator_id: str | None = None,
                                   ticks: bool = False) -> DataFrame:
        """Swap-in for ``grouped.applyInPandasWithState`` with the same arguments."""
        _check_output_mode(outputMode)
        timeout = check_timeout_conf(timeoutConf)
        df, keys = plan.grouping_columns(grouped_data)
        op_id = operator_id or _default_operator_id(func)
        config = self._config(df, keys, op_id)
        config.ticks = ticks
        # as Spark: with an event-time timeout, late input never reaches the function
        config.drop_late = timeout == GroupStateTimeout.EventTimeTimeout
        config.timers = {GroupStateTimeout.EventTimeTimeout: "EventTime",
                         GroupStateTimeout.ProcessingTimeTimeout: "ProcessingTime",
                         }.get(timeout, "None")
        state_schema = _struct(df.sparkSession, stateStructType)
        check_against_latest(self.coordinator(op_id),
                             lambda b: declare_group_states(b, state_schema))

        def process(backend, groups, ctx, decode):
            return run_group_function(func, backend, groups, ctx, state_schema, timeout, decode)

        return self._plan(df, config, process, outputStructType, outputMode)

    def map_in_pandas(self, df: DataFrame, key: str | list[str], func: Callable,
                      schema: StructType | str, state_schema: StructType | str = "value BIGINT",
                      *, operator_id: str | None = None,
                      value_blocks: int | None = None,
                      frame_rows: int | None = DEFAULT_FRAME_ROWS,
                      output_mode: str = "Append") -> DataFrame:
        """Run ``func(frames, state)`` over each partition's input with vectorised keyed
        state (:class:`statebackend.spark.vector.KeyedColumnState`) for ``key``.

        ``value_blocks=N`` packs the state into N RocksDB entries per key group instead of
        one per key: faster when each batch touches a large share of the keys, more bytes
        per checkpoint when it touches few (docs/options.md, "Value blocks"). It cannot
        change for an existing state; None keeps the layout the state was written with.

        ``func`` reads the partition's input in frames of at least ``frame_rows`` rows
        (default 1,000,000; the last frame may be smaller): a usual micro-batch arrives as
        one frame, a large backlog in several, each read from Spark when the function asks
        for it, so memory stays bounded. ``None``: always the whole input as one frame.
        Smaller frames cost CPU (more, smaller state calls and groupbys: twice the
        function's time at 50,000 rows against one 100,000-row frame, BENCHMARKS.md).

        ``output_mode``: the streaming query's output mode, which the carrier plan
        (``placement="carrier"``) declares to Spark; the shuffle plan ignores it.
        """
        if value_blocks is not None and not is_block_count(value_blocks):
            raise OptionsError("value_blocks", value_blocks,
                               f"value_blocks must be None or an int in 1..{MAX_BLOCKS}, got "
                               f"{value_blocks!r}")
        if frame_rows is not None and (isinstance(frame_rows, bool)
                                       or not isinstance(frame_rows, int) or frame_rows < 1):
            raise OptionsError("frame_rows", frame_rows,
                               f"frame_rows must be None or an int >= 1, got {frame_rows!r}")
        keys = [key] if isinstance(key, str) else list(key)
        op_id = operator_id or _default_operator_id(func)
        config = self._config(df, keys, op_id)
        _check_output_mode(output_mode)
        process = vector_process(func, config, state_schema, value_blocks, frame_rows)
        check_against_latest(self.coordinator(op_id),
                             column_state_declaration(config, state_schema, value_blocks))
        return self._plan(df, config, process, schema, output_mode)

    # --- coordination -------------------------------------------------------------------

    def coordinator(self, operator_id: str):
        """The driver-side coordinator of one operator (created on first use)."""
        from .coordinator import CheckpointCoordinator
        from .storage import open_store

        with self._lock:
            coord = self._coordinators.get(operator_id)
            if coord is None:
                opts = self._options or self._explicit_options or StateBackendOptions()
                store = open_store(self.checkpoint_location,
                                   storage_options=self.storage_options or None)
                coord = CheckpointCoordinator(store, operator_id,
                                              parallelism=opts.parallelism or 1,
                                              max_parallelism=opts.max_parallelism,
                                              num_retained=opts.num_retained,
                                              fencing=opts.fencing)
                self._coordinators[operator_id] = coord
            return coord

    def savepoint(self, operator_id: str, name: str | None = None, *,
                  checkpoint_id: int | None = None):
        """Write a savepoint of ``operator_id`` from a completed checkpoint, without
        stopping the query.

        Parameters
        ----------
        operator_id : str
            The operator.
        name : str, optional
            Savepoint name (letters, digits, ``._=-``); default ``sp-<checkpoint>-<ms>``.
        checkpoint_id : int, optional
            The completed checkpoint to copy; default the latest. It is pinned while the
            savepoint is written, so retention cannot delete its files meanwhile.

        Returns
        -------
        statebackend.savepoint.format.SavepointManifest
            What was published under ``<location>/<operator_id>/_savepoints/<name>/``;
            start a query from it with ``RocksDBStateBackend(..., from_savepoint=name)``.
            Savepoints are never deleted by retention.
        """
        from .errors import CheckpointNotFoundError
        from .savepoint.writer import create_savepoint

        coord = self.coordinator(operator_id)
        opts = self._options or self._explicit_options or StateBackendOptions()
        if checkpoint_id is None:
            complete_pending(coord)  # the listener may not have seen the last batch end yet
            latest = coord.latest()
            if latest is None:
                raise CheckpointNotFoundError(f"operator {operator_id!r} has no completed "
                                              f"checkpoint to take a savepoint from")
            checkpoint_id = latest.checkpoint_id
        was_pinned = any(c.pinned for c in coord.list_completed()
                         if c.checkpoint_id == checkpoint_id)
        if not was_pinned:
            coord.pin(checkpoint_id)
        try:
            return create_savepoint(coord.store, operator_id, name, checkpoint_id=checkpoint_id,
                                    compression=opts.snapshot_compression,
                                    local_root=opts.resolved_local_dir(executor_id=DRIVER_ID))
        finally:
            if not was_pinned:
                coord.unpin(checkpoint_id)

    def complete(self, operator_id: str | None = None, *, up_to: int | None = None,
                 run_id: str | None = None) -> list:
        """Complete every checkpoint whose partitions have all published (idempotent).

        Streaming queries do this automatically after every micro-batch; batch jobs call it
        after their action, or let the next run do it. ``up_to``: a micro-batch id Spark
        has finished; checkpoints before it with nothing published were micro-batches in
        which the operator ran no task (see :func:`complete_pending`). Without it, Spark
        may still run the latest completed micro-batch again (its query failed before
        committing it, say), so the checkpoint before it stays retained until a newer one
        completes or a later call names that micro-batch in ``up_to``. ``run_id``: the
        Spark run that finished it (the listener passes it): the coordinator then acts for
        that run only, and is refused (WriterFencedError) once a newer run took over."""
        done = []
        for op in [operator_id] if operator_id else list(self._coordinators):
            done.extend(complete_pending(self.coordinator(op), up_to=up_to, run_id=run_id))
        return done

    def checkpoint_summary(self, operator_id: str, checkpoint_id: int) -> dict[str, Any]:
        """Totals over the partitions of a completed checkpoint (rows, keys, bytes uploaded
        and reused, slowest sync/async part, restore sources), from its manifests."""
        from .storage.manifests import read_recorded_manifests

        coord = self.coordinator(operator_id)
        record = coord.get(checkpoint_id)
        out: dict[str, Any] = {"rows": 0, "keys": 0, "bytes_uploaded": 0, "bytes_reused": 0,
                               "sync_ms": 0.0, "async_ms": 0.0, "full_size": 0}
        sources: dict[str, int] = {}
        for m in read_recorded_manifests(coord.store, record,
                                         operator_id=operator_id).values():
            met = m.metrics
            out["rows"] += int(met.get("rows", 0))
            out["keys"] += int(met.get("keys", 0))
            out["bytes_uploaded"] += m.incremental_size
            out["bytes_reused"] += m.full_size - m.incremental_size
            out["full_size"] += m.full_size
            out["sync_ms"] = max(out["sync_ms"], 1000 * float(met.get("sync_duration_s", 0)))
            out["async_ms"] = max(out["async_ms"], 1000 * float(met.get("async_duration_s", 0)))
            src = str(met.get("restore", {}).get("source", "?")).split(".")[-1].lower()
            sources[src] = sources.get(src, 0) + 1
        out["restore_sources"] = ",".join(f"{k}:{v}" for k, v in sorted(sources.items()))
        return out

    def checkpoint_metrics(self, operator_id: str, checkpoint_id: int | None = None):
        """Metrics of a completed checkpoint (the latest by default), aggregated over its
        partitions: see :class:`statebackend.metrics.CheckpointStats`."""
        from .errors import CheckpointNotFoundError
        from .metrics_store import checkpoint_stats

        coord = self.coordinator(operator_id)
        if checkpoint_id is None:
            latest = coord.latest()
            if latest is None:
                raise CheckpointNotFoundError(f"operator {operator_id!r} has no completed "
                                              f"checkpoint under {self.checkpoint_location}")
            checkpoint_id = latest.checkpoint_id
        return checkpoint_stats(coord.store, operator_id, checkpoint_id)

    def read_state(self, spark: SparkSession, operator_id: str,
                   checkpoint_id: int | None = None, state_name: str | None = None, *,
                   savepoint: str | None = None, distributed: bool = True) -> DataFrame:
        """The state of a completed checkpoint (or of a savepoint) as a DataFrame of
        (partition_id, key, state_name, user_key, value, expiration_ms), like Spark's
        ``statestore`` source; one Spark task reads each partition on an executor
        (``distributed=False``: the driver reads them all).

        See :func:`statebackend.spark.read_state.read_state`.
        """
        from .spark.read_state import read_state

        return read_state(spark, self.checkpoint_location, operator_id,
                          checkpoint_id=checkpoint_id, state_name=state_name,
                          savepoint=savepoint, distributed=distributed,
                          storage_options=self.storage_options or None)

    def read_changes(self, spark: SparkSession, operator_id: str, from_id: int, to_id: int,
                     state_name: str | None = None) -> DataFrame:
        """What was put and deleted from checkpoint ``from_id`` to ``to_id`` (both retained)
        as a DataFrame of (batch_id, operation, partition_id, key, state_name, user_key,
        value, expiration_ms), one Spark task per partition.

        See :mod:`statebackend.spark.changes`.
        """
        from .spark.changes import read_changes

        return read_changes(spark, self.checkpoint_location, operator_id, from_id, to_id,
                            state_name, storage_options=self.storage_options or None)

    # --- failure handling ---------------------------------------------------------------

    def operator_ids(self) -> list[str]:
        """Operators this backend has planned or coordinated so far (in this driver)."""
        with self._lock:
            return sorted(self._coordinators)

    def supervise(self, start_query: Callable[[], Any], strategy: Any = None, *,
                  clock: Any = None) -> Any:
        """Run ``start_query()`` (which builds and starts a streaming query over this
        backend) and restart it after failures as the restart strategy of the options says;
        see :func:`statebackend.supervisor.supervise`.

        Parameters
        ----------
        start_query : callable
            Returns a started ``StreamingQuery``; called again for every restart, with the
            same Spark ``checkpointLocation``.
        strategy : RestartStrategy, optional
            Default: :func:`~statebackend.restart.strategy_from_options` of this
            backend's options (explicit ones, else the active session's
            ``spark.statebackend.restart-strategy.*`` conf).
        clock : Clock, optional
            Time source and sleep (tests pass a manual clock).

        Returns
        -------
        SupervisionResult

        Raises
        ------
        RestartsExhaustedError
            The strategy gave up; ``__cause__`` is the last failure.
        """
        from .restart import strategy_from_options
        from .supervisor import supervise

        if strategy is None:
            opts = self._explicit_options
            if opts is None:
                active = SparkSession.getActiveSession()
                opts = self.options_for(active) if active is not None else StateBackendOptions()
            strategy = strategy_from_options(opts)
        return supervise(start_query, strategy, backend=self, clock=clock)

    # --- internals ----------------------------------------------------------------------

    def _config(self, df: DataFrame, keys: list[str], operator_id: str) -> OperatorConfig:
        check_component(operator_id)
        spark = df.sparkSession
        opts = self.options_for(spark)
        self._options = opts
        coord = self.coordinator(operator_id)
        latest = coord.latest()
        if latest is not None:
            from .savepoint.reader import check_max_parallelism

            check_max_parallelism(latest.max_parallelism, opts.max_parallelism,
                                  f"the state of operator {operator_id!r}")
            if latest.parallelism != opts.parallelism:
                # checkpoints the previous run published but did not complete have its layout
                coord.parallelism = latest.parallelism
                try:
                    complete_pending(coord)
                except IncompatibleStateError:
                    pass  # written by a run with the new layout: completed just below
        coord.parallelism = opts.parallelism
        complete_pending(coord)
        epoch = run_id = None
        if not df.isStreaming:
            latest = coord.latest()
            epoch = 0 if latest is None else latest.checkpoint_id + 1
            run_id = f"batch-{uuid.uuid4().hex}"  # the writer identity of this run
        parallelism = opts.parallelism
        assert parallelism is not None  # options_for always resolves it
        latest = coord.latest()
        if latest is not None and latest.parallelism != parallelism:
            log.warning("operator %s: state has parallelism %d, query asks for %d",
                        operator_id, latest.parallelism, parallelism)
        watermark = plan.watermark_of(df) if df.isStreaming else None
        self._ensure_listener(spark)
        return OperatorConfig(operator_id=operator_id,
                              checkpoint_location=self.checkpoint_location,
                              storage_options=self.storage_options, options=opts,
                              parallelism=parallelism, key=plan.key_spec(df, keys), epoch=epoch,
                              run_id=run_id,
                              watermark=watermark,
                              from_savepoint=self._savepoint_source(operator_id))

    def _savepoint_source(self, operator_id: str) -> SavepointSource | None:
        if not self.from_savepoint:
            return None
        sp = self.from_savepoint
        if "/" not in sp and ":" not in sp:  # a name: this operator's savepoint of that name
            from .savepoint.writer import savepoint_dir

            sp = f"{self.checkpoint_location.rstrip('/')}/{operator_id}/{savepoint_dir(sp)}"
        return SavepointSource(sp, self.storage_options)

    def _plan(self, df: DataFrame, config: OperatorConfig, process, schema,
              output_mode: str | None = None) -> DataFrame:
        from .spark.carrier import uses_carrier
        from .spark.operator_plan import operator_plan

        if uses_carrier(df, config, output_mode):
            self._carry_on_driver(config)
        return operator_plan(df, config, process, _struct(df.sparkSession, schema),
                             output_mode, self.checkpoint_location)

    def _carry_on_driver(self, config: OperatorConfig) -> None:
        """Completing a micro-batch Spark committed publishes the checkpoints of the
        carrier's partitions that had no rows in it
        (:func:`statebackend.restore.carry.carry_on_driver`)."""
        import functools

        from .checkpoint.publish import ManifestFacts
        from .restore.carry import carry_on_driver

        opts, sp = config.options, config.from_savepoint
        self.coordinator(config.operator_id).carry = functools.partial(
            carry_on_driver, options=opts,
            local_root=opts.resolved_local_dir(executor_id=DRIVER_ID),
            facts=ManifestFacts(key_columns=tuple(config.key.columns),
                                key_types=tuple(config.key.types)),
            savepoint=None if sp is None else (sp.url, dict(sp.storage_options)))

    def observation_name(self, operator_id: str) -> str:
        """The name of the operator's observed metrics in its query's progress: read the
        backend's metrics of the last micro-batch with
        ``query.lastProgress["observedMetrics"][backend.observation_name("orders")]``
        (docs/operations.md, "Metrics in Spark's progress")."""
        from .spark.listener import observation_name

        return observation_name(self.checkpoint_location, operator_id)

    def _ensure_listener(self, spark: SparkSession) -> None:
        from .spark.listener import register_backend

        register_backend(spark, self)


def _check_output_mode(mode: str) -> None:
    if str(mode).lower() not in ("update", "append", "complete"):
        raise OptionsError("outputMode", mode, "outputMode must be 'Update', 'Append' or 'Complete'")


def _default_operator_id(obj: Any) -> str:
    name = type(obj).__name__ if not callable(obj) or isinstance(obj, StatefulProcessor) \
        else getattr(obj, "__name__", type(obj).__name__)
    return re.sub(r"[^A-Za-z0-9._=-]", "_", name) or "operator"


def _struct(spark: SparkSession, schema: StructType | str) -> StructType:
    if isinstance(schema, StructType):
        return schema
    return spark.createDataFrame([], schema).schema


def _initial_groups(holder: dict, config: OperatorConfig, partition: int):
    import numpy as np

    from .keys.groups import key_groups
    from .keys.ranges import partition_for_key_group

    pdf = holder["pdf"]
    keys = holder["keys"]
    if not len(pdf):
        return None
    cols = [pdf[c].to_numpy() for c in keys]
    kg = key_groups(cols, list(config.key.types), config.max_parallelism)
    owner = partition_for_key_group(np.asarray(kg), config.parallelism, config.max_parallelism)
    mask = np.asarray(owner) == partition
    if not mask.any():
        return None
    sub = pdf[mask].rename(columns=dict(zip(keys, config.key.columns)))
    return group_by_key(sub, config.key, np.asarray(kg)[mask])
