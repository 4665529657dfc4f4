"""Moving a query whose state the shuffle plan wrote to the carrier plan.

Spark cannot restart such a query from its own checkpoint with the carrier: the carrier
adds a stateful operator, and Spark would have to load that operator's state store at
the version of the last batch, which was never written (docs/scaling.md, "Moving a
running query to the carrier plan"). The move is therefore a new query: a savepoint of
the operator's latest completed checkpoint, and a restart with a new Spark checkpoint
location, a new state location, ``placement="carrier"`` and ``from_savepoint``.

:func:`move_to_carrier` checks the preconditions, writes the savepoint and returns the
restart step; it never changes the old location's checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import MoveRefusedError
from ..storage.base import DurableStore
from .writer import create_savepoint, savepoint_dir

__all__ = ["MoveStep", "move_to_carrier", "default_target"]


@dataclass(frozen=True)
class MoveStep:
    """What a move wrote and how to restart the query.

    Attributes
    ----------
    operator_id : str
    checkpoint_id : int
        The completed checkpoint the savepoint copies (the old query's last batch).
    savepoint : str
        The savepoint's full path; pass it as ``from_savepoint``.
    state_location : str
        The new state location (``checkpoint_location`` of the new backend).
    restart : str
        The restart step as text, with a Python snippet.
    """

    operator_id: str
    checkpoint_id: int
    savepoint: str
    state_location: str
    restart: str


def default_target(location: str) -> str:
    """The suggested new state location: the old one with ``-carrier`` appended."""
    return location.rstrip("/") + "-carrier"


def move_to_carrier(store: DurableStore, location: str, operator_id: str, *,
                    to: str | None = None, target_store: DurableStore | None = None,
                    name: str = "move-to-carrier") -> MoveStep:
    """Write the savepoint that moves ``operator_id`` to the carrier plan, and say how to
    restart.

    Stop the old query first: the savepoint copies the latest completed checkpoint, and
    the new query continues from exactly that batch.

    Parameters
    ----------
    store : DurableStore
        Rooted at the old state location ``location``.
    location : str
        The old state location (as the backend was given it); names the savepoint.
    operator_id : str
    to : str, optional
        The new state location; default :func:`default_target`.
    target_store : DurableStore, optional
        Rooted at ``to``, to check that it holds no state of the operator.
    name : str
        Savepoint name.

    Raises
    ------
    CheckpointNotFoundError
        The operator has no completed checkpoint at ``location``.
    MoveRefusedError
        The location already uses the carrier plan, or ``to`` is ``location`` or already
        holds state of the operator.
    StorageError
        A savepoint of that name exists already (nothing written).
    """
    from ..storage.records import require_completed_record

    record = require_completed_record(store, operator_id)
    if record.placement == "carrier":
        raise MoveRefusedError(
            f"operator {operator_id!r} at {location} already uses the carrier plan (its "
            f"checkpoint {record.checkpoint_id} was written by it); restart it with "
            f"placement='carrier' from its own Spark checkpoint, no move is needed")
    to = to or default_target(location)
    if to.rstrip("/") == location.rstrip("/"):
        raise MoveRefusedError(f"the new state location must differ from the old one "
                               f"({location}); pass another --to")
    if target_store is not None and target_store.list_dir(operator_id):
        raise MoveRefusedError(
            f"the new state location {to} already holds state of operator {operator_id!r}; "
            f"pass an empty --to (a move never writes over existing state)")
    m = create_savepoint(store, operator_id, name, checkpoint_id=record.checkpoint_id)
    sp = f"{location.rstrip('/')}/{operator_id}/{savepoint_dir(m.name)}"
    return MoveStep(operator_id, m.checkpoint_id, sp, to,
                    _restart_text(operator_id, m.checkpoint_id, sp, to))


def _restart_text(op: str, checkpoint_id: int, sp: str, to: str) -> str:
    return (
        f"savepoint of {op!r} at checkpoint {checkpoint_id}: {sp}\n"
        f"Restart the query (the old one stopped) with:\n"
        f"  1. a NEW Spark checkpointLocation (not the old query's; Spark refuses the "
        f"carrier's new stateful operator there)\n"
        f"  2. the backend\n"
        f"       RocksDBStateBackend({to!r}, StateBackendOptions(placement=\"carrier\", ...),\n"
        f"                           from_savepoint={sp!r})\n"
        f"     with the same operator_id={op!r}, the same parallelism, max_parallelism and "
        f"processor\n"
        f"  3. the source starting where the old query stopped: the input the old query "
        f"had not read (files: a new directory or a file-name filter for files not yet "
        f"read; Kafka: startingOffsets = the offsets of the old Spark checkpoint's last "
        f"offsets/<batch> file)\n")
