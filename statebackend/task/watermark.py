"""Event time for one task: the batch's watermark, and the late rows Spark would drop.

Spark's watermark for batch ``b`` is the largest event time seen in batches before ``b``
over all partitions, minus the delay; its stateful operators drop input at or before the
watermark the previous batch ran with. Every task records its running max event time
and the watermark it used in its manifest, so both are read back from the manifests of
the previous checkpoint (:func:`watermark_for`, :func:`late_watermark`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import LateOutputError
from ..model.manifest import CompletedCheckpoint, PartitionManifest
from ..storage.manifests import read_completed_record
from .context import OperatorConfig, event_time_ms, event_time_us
from .partition_state import Restored, resolve_base


@dataclass(frozen=True)
class EventTime:
    """What a task derived from event time before processing.

    Attributes
    ----------
    watermark_ms : int
        The batch's watermark (-1 when the operator has none).
    late_rows_dropped : int
        Input rows at or before the previous batch's watermark, not processed.
    late_watermark_ms : int
        The watermark for late events (the previous batch's), when the operator drops
        late input or checks the event times it emits; -1 otherwise.
    """

    watermark_ms: int = -1
    late_rows_dropped: int = 0
    late_watermark_ms: int = -1


def apply_watermark(store, config: OperatorConfig, checkpoint_id: int, restored: Restored,
                    first: pd.DataFrame | None) -> tuple[pd.DataFrame | None, EventTime]:
    """The batch's watermark, and ``first`` without its late rows when the operator drops
    them (``config.drop_late``: per-key event-time operators, as Spark's)."""
    if config.watermark is None:
        return first, EventTime()
    prev = restored.prev_id
    wm = watermark_for(store, config, prev, restored.base, restored.record)
    late_dropped = 0
    drops = config.per_key and config.drop_late and first is not None
    if not drops and config.event_time_column is None:
        return first, EventTime(wm, late_dropped)
    # after micro-batches that ran no task the previous batch's watermark was
    # already this one (no event time arrived since)
    late_wm = (late_watermark(store, config, checkpoint_id, restored.base)
               if prev == checkpoint_id - 1 else wm)
    if drops:
        first, late_dropped = drop_late_rows(first, config.watermark[0], late_wm)
    return first, EventTime(wm, late_dropped, late_wm)


def watermark_for(store, config: OperatorConfig, prev_id: int, own: PartitionManifest | None,
                  record: CompletedCheckpoint | None) -> int:
    """The event-time watermark of this batch: max event time of all earlier batches over
    all partitions, minus the delay (0 before any event, as Spark's first batch).
    ``record``: the previous checkpoint's record as the task read it (None: not completed)."""
    if prev_id < 0:
        return 0
    latest = None
    # after a rescale the previous checkpoint has the old layout's partitions
    parts = sorted(record.manifests) if record is not None else range(config.parallelism)
    for p in parts:
        m = own if own is not None and p == own.partition else resolve_base(store, p, prev_id,
                                                                            None, record)
        v = None if m is None else m.max_event_time_ms
        if v is not None:
            latest = int(v) if latest is None else max(latest, int(v))
    if latest is None or config.watermark is None:
        return 0
    return max(0, latest - config.watermark[1])


def late_watermark(store, config: OperatorConfig, checkpoint_id: int,
                   base: PartitionManifest | None) -> int:
    """The watermark for late events of batch ``checkpoint_id``: the watermark the previous
    batch ran with, as Spark's stateful operators use it to drop late input.

    Every task records the watermark it used in its manifest, so it is read from the base
    (b-1). A base without it (written before that, or a start from a savepoint) falls back
    to deriving it from the manifests of b-2, as :func:`watermark_for` derives b-1's.
    """
    if checkpoint_id < 1:
        return 0
    recorded = base.watermark_ms if base is not None else None
    if recorded is not None:
        return int(recorded)
    prev_prev = checkpoint_id - 2
    if prev_prev < 0:
        return 0
    record = read_completed_record(store, prev_prev)
    return watermark_for(store, config, prev_prev, None, record)


def drop_late_rows(pdf: pd.DataFrame, column: str, late_wm: int) -> tuple[pd.DataFrame, int]:
    """``pdf`` without the rows whose event time is at or before ``late_wm`` (ms), and how
    many were dropped. Rows with a null event time are kept, as Spark keeps them."""
    if column not in pdf.columns or not len(pdf):
        return pdf, 0
    late = event_time_ms(pdf[column]) <= late_wm
    n = int(late.sum())
    if not n:
        return pdf, 0
    return pdf[~late].reset_index(drop=True), n


def check_emitted(frame: pd.DataFrame | None, config: OperatorConfig, late_wm: int,
                  where: str) -> None:
    """Refuse output whose event time (``config.event_time_column``) is at or before
    ``late_wm``, as Spark's node after a ``transformWithState`` with
    ``eventTimeColumnName`` fails the query (its rule: the timestamp in microseconds
    ``<=`` the watermark for late events times 1000; nulls pass). Checked before the
    checkpoint is published: the failed task leaves no state behind, as Spark's."""
    if config.event_time_column is None or frame is None or not len(frame):
        return
    name, position = config.event_time_column
    if name in frame.columns:
        column = frame[name]
    elif all(isinstance(c, str) for c in frame.columns):
        return  # Spark fails such a frame itself: it has no column of that name
    else:
        column = frame.iloc[:, position]  # labels that are not names: matched by position
    us, nulls = event_time_us(column)
    late = (us <= late_wm * 1000) & ~nulls
    if late.any():
        raise LateOutputError(str(name), int(us[int(np.argmax(late))]), int(late_wm), where)


def max_opt(a: int | None, b: int | None) -> int | None:
    """The larger of two optional event times."""
    return b if a is None else a if b is None else max(int(a), int(b))
