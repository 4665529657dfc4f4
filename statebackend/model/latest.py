"""``_checkpoints/LATEST.json`` and the writer stamp records carry: who completed the newest
checkpoint (statebackend.checkpoint.fencing reads both as evidence)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import CorruptStateError

# The id of the newest completed checkpoint, written after its record: a record deleted
# or lost afterwards is then missing, not silently replaced by the one before it.
LATEST_PATH = "_checkpoints/LATEST.json"  # under manifest.CHECKPOINTS_DIR


@dataclass(frozen=True)
class WriterStamp:
    """Who published a record or ``LATEST.json``: the writer epoch, Spark's query id and
    run id it acted under (statebackend.checkpoint.fencing). Fencing reads them as evidence
    that does not depend on the ``_writers/`` files surviving."""

    epoch: int
    query_id: str | None = None
    run_id: str | None = None


@dataclass(frozen=True)
class LatestPointer:
    """``_checkpoints/LATEST.json``: the newest completed checkpoint and its writer (None:
    written before writers were recorded, or without fencing)."""

    checkpoint_id: int
    writer: WriterStamp | None = None
    # run id -> the highest epoch it held, for the latest runs: a fenced run stays known
    # as fenced when the _writers/ files and its records are gone
    runs: Mapping[str, int] = field(default_factory=dict)


def latest_pointer(checkpoint_id: int, writer: WriterStamp | None = None,
                   runs: Mapping[str, int] | None = None) -> bytes:
    d: dict[str, Any] = {"checkpoint_id": checkpoint_id}
    if writer is not None:
        d.update(writer_epoch=writer.epoch, writer_query=writer.query_id,
                 writer_run=writer.run_id)
    if runs:
        d["writer_runs"] = dict(sorted(runs.items()))
    return json.dumps(d, sort_keys=True).encode()


def parse_latest(raw: bytes) -> LatestPointer:
    """``LATEST.json``'s content (the writer fields are optional: older versions wrote
    the id alone)."""
    try:
        d = json.loads(raw)
        n = int(d["checkpoint_id"])
        if n < 0:
            raise ValueError(f"checkpoint id {n} is negative")
        writer = None
        if d.get("writer_epoch") is not None:
            writer = WriterStamp(int(d["writer_epoch"]), _opt_str(d.get("writer_query")),
                                 _opt_str(d.get("writer_run")))
        runs = {str(k): int(v) for k, v in (d.get("writer_runs") or {}).items()}
        return LatestPointer(n, writer, runs)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptStateError(f"{LATEST_PATH} is malformed ({exc}); it names the newest "
                                f"completed checkpoint. Delete it: the next start writes it "
                                f"again from the newest record", path=LATEST_PATH) from exc


def parse_latest_pointer(raw: bytes) -> int:
    return parse_latest(raw).checkpoint_id


def _opt_str(v: Any) -> str | None:
    if v is not None and not isinstance(v, str):
        raise TypeError(f"expected a string or null, found {v!r}")
    return v
