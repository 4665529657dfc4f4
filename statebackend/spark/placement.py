"""Which plan a streaming operator runs in: the shuffle plan or the carrier
(:mod:`.carrier`), decided once on the driver from durable facts.

``placement="auto"`` (the default) decides, in this order:

1. **The location's own record.** A location with a completed checkpoint keeps the plan
   its tasks recorded (``placement`` of its record and manifests), so every restart makes
   the same choice, and a query that began under the shuffle plan (whose Spark checkpoint
   has no stateful operator for the carrier to load) keeps running after an upgrade. A
   record that names no plan was written before plans were recorded, when the shuffle plan
   was the default: the shuffle plan (a location a batch job wrote decides afresh).
2. **The query's shape.** Where Spark refuses the carrier (an applyInPandasWithState) the
   shuffle plan runs, and one log line names the reason and the option
   (:func:`carrier_refusal`).
3. **The session's master.** On a cluster (any master but ``local[N]``; a session that
   does not say counts as one) the carrier: partitions stay on the executors holding
   their state. On one machine every task is local anyway; the carrier still runs an
   operator with timers, because only a Spark stateful operator makes Spark run the
   no-data micro-batches in which Spark's own operators fire timers (its default,
   ``spark.sql.streaming.noDataMicroBatches.enabled``); the rest keep the shuffle plan,
   which costs Spark no state store per partition and micro-batch.

An explicit ``placement="shuffle"`` or ``"carrier"`` always wins over 1 and 3; the query
shapes of 2 keep the shuffle plan under any option.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from ..model.manifest import CompletedCheckpoint
from .carrier import CARRIER_OUTPUT_MODES
from .session import master_of, stateful_upstream

log = logging.getLogger("statebackend")

_ONE_MACHINE = re.compile(r"local(\[[^\]]*\])?")


@dataclass(frozen=True)
class Placement:
    """The plan chosen (``carrier``) and why; ``fallback``: the carrier was wanted (by the
    option, the location's record or the master) but the query's shape refuses it."""

    carrier: bool
    reason: str
    fallback: bool = False

    @property
    def plan(self) -> str:
        return "carrier" if self.carrier else "shuffle"


def one_machine(master: str | None) -> bool:
    """Whether ``master`` runs every task in one process (``local``, ``local[N]``,
    ``local[N,F]``, ``local[*]``); ``local-cluster[...]`` and unknown masters do not."""
    return master is not None and _ONE_MACHINE.fullmatch(master.strip()) is not None


def carrier_refusal(df: Any, output_mode: str | None, timers: str,
                    event_time_column: Any) -> str | None:
    """Why Spark would refuse the carrier in this query, or None where it would not."""
    mode = str(output_mode or "append").lower()
    if mode not in CARRIER_OUTPUT_MODES:
        return f"output mode {output_mode!r} (the carrier supports Append and Update)"
    if event_time_column is not None:
        # Spark refuses an applyInPandasWithState with an event-time timeout before
        # another stateful operator, and the carrier's output watermark is its own
        return "eventTimeColumnName is set (the output's event time needs the shuffle plan)"
    upstream = stateful_upstream(df)
    if upstream is None:
        return None
    if upstream == "Aggregate":
        return "a streaming aggregation runs before it (Spark refuses an " \
               "applyInPandasWithState after one)"
    if mode != "append":
        return f"a stateful operator ({upstream}) runs before it and the output mode is " \
               f"{output_mode!r} (Spark accepts several only in Append mode)"
    if timers == "EventTime":
        return f"a stateful operator ({upstream}) runs before it and the carrier would " \
               f"fire event-time timeouts after it (Spark refuses that chain)"
    return None


def choose(df: Any, option: str, latest: CompletedCheckpoint | None,
           output_mode: str | None, timers: str, event_time_column: Any = None) -> Placement:
    """The plan of a streaming operator over ``df``: see the module's docstring.
    ``option``: ``StateBackendOptions.placement``; ``latest``: the location's newest
    completed checkpoint (None: a new location)."""
    want, why = _wanted(df, option, latest, timers)
    if not want:
        return Placement(False, why)
    refused = carrier_refusal(df, output_mode, timers, event_time_column)
    if refused is not None:
        return Placement(False, f"{why}, but {refused}", fallback=True)
    return Placement(True, why)


def _wanted(df: Any, option: str, latest: CompletedCheckpoint | None,
            timers: str) -> tuple[bool, str]:
    """Whether the carrier is wanted, the query's shape aside, and why."""
    if option != "auto":
        return option == "carrier", f"placement={option!r}"
    recorded = _recorded(latest)
    if recorded is not None:
        return recorded == "carrier", f"the location's checkpoints ran the {recorded} plan"
    master = master_of(df.sparkSession)
    if not one_machine(master):
        return True, f"a new location on a cluster (master {master})"
    if timers != "None":
        return True, (f"a new location with {timers} timers (master {master}): Spark runs "
                      f"the no-data micro-batches that fire them only for a stateful "
                      f"operator")
    return False, f"a new location on one machine (master {master})"


def _recorded(latest: CompletedCheckpoint | None) -> str | None:
    """The plan the location's checkpoints ran in; None: a new location or one only
    batch jobs wrote (their plan binds no streaming query)."""
    if latest is None:
        return None
    if latest.placement is not None:
        return latest.placement
    if (latest.writer_run or "").startswith("batch-"):
        return None
    return "shuffle"  # written before plans were recorded, when it was the default


def log_choice(operator_id: str, option: str, chosen: Placement) -> None:
    """One line: the plan, why, and the option that decides it."""
    if chosen.fallback:
        log.warning("operator %s runs the shuffle plan, not the carrier: %s (option "
                    "placement=%r; placement='shuffle' chooses it explicitly)",
                    operator_id, chosen.reason, option)
    else:
        log.info("operator %s runs the %s plan: %s (option placement=%r)", operator_id,
                 chosen.plan, chosen.reason, option)
