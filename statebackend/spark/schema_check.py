"""The driver's schema check: a query whose new state schemas cannot read the stored
state fails when it is planned, before any task runs or writes.

The declarations are not re-implemented here: the query's own declaring code (the
processor's ``init`` with our handle, the ``applyInPandasWithState`` states, the
``map_in_pandas`` column state) runs against a scratch :class:`KeyedStateBackend` whose
``_meta`` holds the descriptors the latest completed checkpoint recorded, so the check,
its evolution rules and its error (:class:`~statebackend.errors.SchemaEvolutionError`:
the state, the field, the change and what to do instead) are those of a task. Spark does
the same for ``transformWithState``: its driver runs the processor's ``init`` to learn
the declared states and checks them against the checkpoint's schema files.

The task-side check stays: state written after the query was planned (another run of
the operator) is still checked where it is read.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from ..errors import SchemaError, StateBackendError
from ..model.manifest import CompletedCheckpoint, StateDescriptor
from ..rocksdb.instance import RocksDBInstance
from ..state.backend import META_CF, KeyedStateBackend
from ..state.evolution import META_STATE_PREFIX, descriptor_json
from ..storage.manifests import read_recorded_manifests

__all__ = ["check_against_latest", "check_declarations", "processor_declarations",
           "recorded_state_sets"]

log = logging.getLogger("statebackend.schema_check")

Declare = Callable[[KeyedStateBackend], Any]


def recorded_state_sets(store: Any, record: CompletedCheckpoint | None,
                        operator_id: str) -> list[tuple[StateDescriptor, ...]]:
    """The distinct sets of state descriptors the partitions of ``record`` recorded (one
    set when every partition declared the same states, as usual); none without a record,
    or when its manifests cannot be read (the tasks then fail on them, typed)."""
    if record is None:
        return []
    try:
        manifests = read_recorded_manifests(store, record, operator_id=operator_id)
    except StateBackendError as exc:
        # a damaged or unreachable checkpoint is the tasks' to report (typed, with the
        # restore's fallbacks): planning does not fail over it
        log.warning("schema check on the driver skipped: checkpoint %d of %s: %s",
                    record.checkpoint_id, operator_id, exc)
        return []
    sets: dict[tuple[StateDescriptor, ...], None] = {}
    for m in manifests.values():
        states = tuple(sorted((d for d in m.states if d.kind != "timers"),
                              key=lambda d: d.name))
        if states:
            sets[states] = None
    return list(sets)


def check_declarations(stored: list[tuple[StateDescriptor, ...]], declare: Declare,
                       timer_service: str = "rocksdb") -> None:
    """Run ``declare(backend)`` against a scratch backend holding each set of ``stored``
    descriptors, as a task restoring that state would.

    Raises
    ------
    SchemaError
        Notably :class:`~statebackend.errors.SchemaEvolutionError`: a declared state's
        schema cannot read values stored under an earlier one.
    """
    for states in stored:
        scratch = tempfile.mkdtemp(prefix="sb-schema-check-")
        instance = RocksDBInstance(scratch)
        try:
            instance.write({META_CF: {META_STATE_PREFIX + d.name.encode("utf-8"):
                                      descriptor_json(d) for d in states}})
            backend = KeyedStateBackend(instance, timer_service=timer_service)
            declare(backend)
        finally:
            instance.close()
            shutil.rmtree(scratch, ignore_errors=True)


def processor_declarations(processor: Any, time_mode: str) -> Declare:
    """What a task declares for a ``StatefulProcessor``: its ``init`` with our handle, run
    on a copy (the one a task unpickles), so the user's object is left as it was.

    Only schema errors count here: anything else ``init`` raises on the driver (it may
    expect an executor) is logged, and the task reports it if it is real.
    """
    from pyspark import cloudpickle

    from ..task.processor import RocksDBProcessorHandle

    def declare(backend: KeyedStateBackend) -> None:
        try:
            copy = cloudpickle.loads(cloudpickle.dumps(processor))
            copy.init(RocksDBProcessorHandle(backend, time_mode))
        except SchemaError:
            raise
        except Exception as exc:  # noqa: BLE001 - the task-side check still runs
            log.info("schema check on the driver skipped: %s.init raised %r",
                     type(processor).__name__, exc)
    return declare


def check_against_latest(coordinator: Any, declare: Declare,
                         timer_service: str = "rocksdb") -> None:
    """:func:`check_declarations` against the latest completed checkpoint of the
    operator ``coordinator`` coordinates (nothing to check without one)."""
    check_declarations(recorded_state_sets(coordinator.store, coordinator.latest(),
                                           coordinator.operator_id), declare, timer_service)
