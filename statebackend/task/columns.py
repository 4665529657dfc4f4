"""The columns our plans add to the user's input, and the grouping key's description:
the names both sides agree on (the driver's plan adds them, the task drops them).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ADDED_COLUMNS", "INTERNAL_COLUMNS", "KG_COL", "PID_COL", "PTIME_COL", "TICK_COL",
           "KeySpec", "key_groups_in_task"]

KG_COL = "__sb_kg"
TICK_COL = "__sb_tick"
PID_COL = "__sb_pid"  # the carrier plan's grouping column (statebackend.spark.carrier)
INTERNAL_COLUMNS = (KG_COL, TICK_COL, PID_COL)
PTIME_COL = "__sb_ptime"  # the micro-batch's processing time, added by the plan
# every column our plan adds to the user's input
ADDED_COLUMNS = (*INTERNAL_COLUMNS, PTIME_COL)

# Key types whose pandas values in a task are exactly what Spark's hash() reads: tasks
# compute their key groups with the native kernel instead of receiving a column. Not
# here: timestamps (pandas holds them in the session time zone), float/double (NaN and
# null are one value in pandas), integers (with nulls a column arrives as float64 or as
# objects, depending on the PySpark version), collated strings (their hash depends on
# the collation).
_TASK_HASHED_TYPES = frozenset({"string", "binary"})


@dataclass(frozen=True)
class KeySpec:
    """The grouping columns of a stateful operator and their Spark type names."""

    columns: tuple[str, ...]
    types: tuple[str, ...]


def key_groups_in_task(key_types: tuple[str, ...] | list[str]) -> bool:
    """Whether tasks compute key groups from the key columns themselves (``True``) or
    receive them in the ``__sb_kg`` column computed by Spark."""
    return all(t in _TASK_HASHED_TYPES for t in key_types)
