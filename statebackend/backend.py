"""``RocksDBStateBackend``: the one object users create, and the swap-in calls.

    backend = RocksDBStateBackend("/tmp/state/orders")            # or "s3://bucket/state"
    out = backend.transform_with_state(df.groupBy("user"), MyProcessor(), schema,
                                       "Update", "None")            # was df.groupBy(...).transformWithStateInPandas(...)
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from .coordinator.pending import complete_pending
from .errors import OptionsError
from .options import (
    StateBackendOptions,
    check_location,
    check_storage_options,
    coerce_options,
    default_max_parallelism,
)
from .redact import redact_options, redact_url
from .spark import operators
from .task.context import DEFAULT_FRAME_ROWS, OperatorConfig, SavepointSource
from .task.executor import DRIVER_ID

log = logging.getLogger("statebackend")


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
        # per operator planned in the carrier plan: its carry-over at completion
        self._carry: dict[str, Callable[[Any, int], list[int]]] = {}
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
        self._carry = {}
        self._options = None
        self._lock = threading.Lock()

    # --- options ------------------------------------------------------------------------

    def options_for(self, spark: Any) -> StateBackendOptions:
        """Explicit options > ``spark.statebackend.*`` conf > defaults, with the parallelism
        defaulting to ``spark.sql.shuffle.partitions``."""
        from .spark.session import session_conf

        if self._explicit_options is None:
            return StateBackendOptions.from_spark_conf(session_conf(spark))
        opts = self._explicit_options
        if opts.parallelism is None:
            p = int(str(spark.conf.get("spark.sql.shuffle.partitions")))
            opts = opts.with_(parallelism=p,
                              max_parallelism=max(opts.max_parallelism, default_max_parallelism(p))
                              if p > opts.max_parallelism else opts.max_parallelism)
        return opts

    # --- the swap-in calls --------------------------------------------------------------

    def transform_with_state(self, grouped_data: Any, statefulProcessor: Any,
                             outputStructType: Any, outputMode: str = "Update",
                             timeMode: str = "None", initialState: Any = None,
                             eventTimeColumnName: str = "", *, operator_id: str | None = None,
                             flavour: str = "pandas", ticks: bool = False) -> Any:
        """Swap-in for ``grouped.transformWithStateInPandas`` (``flavour="pandas"``) and
        ``grouped.transformWithState`` (``flavour="row"``), same arguments, same output;
        ``grouped_data`` is ``df.groupBy(...)`` of a classic or a Spark Connect session."""
        return operators.transform_with_state(
            self, grouped_data, statefulProcessor, outputStructType, outputMode, timeMode,
            initialState, eventTimeColumnName, operator_id, flavour, ticks)

    def apply_in_pandas_with_state(self, grouped_data: Any, func: Callable,
                                   outputStructType: Any, stateStructType: Any,
                                   outputMode: str = "Update", timeoutConf: str = "NoTimeout",
                                   *, operator_id: str | None = None,
                                   ticks: bool = False) -> Any:
        """Swap-in for ``grouped.applyInPandasWithState`` with the same arguments."""
        return operators.apply_in_pandas_with_state(
            self, grouped_data, func, outputStructType, stateStructType, outputMode,
            timeoutConf, operator_id, ticks)

    def map_in_pandas(self, df: Any, key: str | list[str], func: Callable, schema: Any,
                      state_schema: Any = "value BIGINT", *, operator_id: str | None = None,
                      value_blocks: int | None = None,
                      frame_rows: int | None = DEFAULT_FRAME_ROWS,
                      output_mode: str = "Append") -> Any:
        """Run ``func(frames, state)`` over each partition's input with vectorised keyed
        state (:class:`statebackend.task.vector.KeyedColumnState`) for ``key``.

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
        return operators.map_in_pandas(self, df, key, func, schema, state_schema, operator_id,
                                       value_blocks, frame_rows, output_mode)

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
            done.extend(complete_pending(self.coordinator(op), up_to=up_to, run_id=run_id,
                                         carry=self._carry.get(op)))
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

    def read_state(self, spark: Any, operator_id: str,
                   checkpoint_id: int | None = None, state_name: str | None = None, *,
                   savepoint: str | None = None, distributed: bool = True) -> Any:
        """The state of a completed checkpoint (or of a savepoint) as a DataFrame of
        (partition_id, key, state_name, user_key, value, expiration_ms), like Spark's
        ``statestore`` source; one Spark task reads each partition on an executor
        (``distributed=False``: the driver reads them all).

        See :func:`statebackend.spark.readers.read_state`.
        """
        from .spark.readers import read_state

        return read_state(spark, self.checkpoint_location, operator_id,
                          checkpoint_id=checkpoint_id, state_name=state_name,
                          savepoint=savepoint, distributed=distributed,
                          storage_options=self.storage_options or None)

    def import_spark_state(self, spark: Any, spark_checkpoint: str, operator_id: str, *,
                           spark_operator_id: int = 0, batch_id: int | None = None,
                           name: str = "from-spark") -> Any:
        """Move a stopped ``transformWithStateInPandas`` query's state from Spark's own
        store into savepoint ``name`` of ``operator_id`` under this backend's location, in
        one Spark job (Spark's ``statestore`` source, routed by key group; the driver never
        holds the state). Value, list and map states keep their TTL expiries, timers
        their times. Start the new query with ``from_savepoint=name`` and a new Spark
        checkpoint location (docs/migration.md).

        Parallelism and ``max_parallelism`` are this backend's options for ``spark``'s
        session. Returns :class:`statebackend.spark.import_spark.ImportStep`; see
        :func:`statebackend.spark.import_spark.import_spark_state` for the errors.
        """
        from .spark.import_spark import import_spark_state
        from .storage import open_store

        opts = self.options_for(spark)
        parallelism = opts.parallelism or int(
            str(spark.conf.get("spark.sql.shuffle.partitions")))
        store = open_store(self.checkpoint_location,
                           storage_options=self.storage_options or None)
        return import_spark_state(
            spark, store, self.checkpoint_location, operator_id, spark_checkpoint,
            parallelism=parallelism, max_parallelism=opts.max_parallelism,
            storage_options=self.storage_options or None,
            spark_operator_id=spark_operator_id, batch_id=batch_id, name=name)

    def read_changes(self, spark: Any, operator_id: str, from_id: int, to_id: int,
                     state_name: str | None = None) -> Any:
        """What was put and deleted from checkpoint ``from_id`` to ``to_id`` (both retained)
        as a DataFrame of (batch_id, operation, partition_id, key, state_name, user_key,
        value, expiration_ms), one Spark task per partition.

        See :mod:`statebackend.read.changes`.
        """
        from .spark.readers import read_changes

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
                from pyspark.sql import SparkSession

                active = SparkSession.getActiveSession()
                opts = self.options_for(active) if active is not None else StateBackendOptions()
            strategy = strategy_from_options(opts)
        return supervise(start_query, strategy, backend=self, clock=clock)

    # --- what the driver-side plans need (statebackend.spark.operators.Driver) ----------

    def savepoint_source(self, operator_id: str) -> SavepointSource | None:
        """Where a new state of ``operator_id`` starts from (``from_savepoint``), if set."""
        if not self.from_savepoint:
            return None
        sp = self.from_savepoint
        if "/" not in sp and ":" not in sp:  # a name: this operator's savepoint of that name
            from .savepoint.writer import savepoint_dir

            sp = f"{self.checkpoint_location.rstrip('/')}/{operator_id}/{savepoint_dir(sp)}"
        return SavepointSource(sp, self.storage_options)

    def attach(self, spark: Any, config: OperatorConfig) -> None:
        """An operator was planned on ``spark``: complete its checkpoints when Spark
        finishes micro-batches (the session's listener), and, under the carrier plan,
        publish the carried checkpoints of its partitions that ran no task
        (:func:`statebackend.restore.carry.carry_on_driver`) as completion passes them."""
        from .spark.listener import register_backend

        with self._lock:
            self._options = config.options
            if config.carrier:
                self._carry[config.operator_id] = _carry_hook(config)
            else:
                self._carry.pop(config.operator_id, None)
        register_backend(spark, self)

    def observation_name(self, operator_id: str) -> str:
        """The name of the operator's observed metrics in its query's progress: read the
        backend's metrics of the last micro-batch with
        ``query.lastProgress["observedMetrics"][backend.observation_name("orders")]``
        (docs/operations.md, "Metrics in Spark's progress")."""
        from .spark.listener import observation_name

        return observation_name(self.checkpoint_location, operator_id)


def _carry_hook(config: OperatorConfig) -> Callable[[Any, int], list[int]]:
    from .checkpoint.publish import ManifestFacts
    from .restore.carry import carry_on_driver

    opts, sp = config.options, config.from_savepoint
    return functools.partial(
        carry_on_driver, options=opts,
        local_root=opts.resolved_local_dir(executor_id=DRIVER_ID),
        facts=ManifestFacts(key_columns=tuple(config.key.columns),
                            key_types=tuple(config.key.types), placement=config.plan_name),
        savepoint=None if sp is None else (sp.url, dict(sp.storage_options)))
