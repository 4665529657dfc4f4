"""Metrics of one partition checkpoint and one restore (plain values, JSON-friendly)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class CheckpointMetrics:
    """What one checkpoint of one partition cost.

    Attributes
    ----------
    sync_duration_s : float
        Flush + native checkpoint (the part that blocks processing).
    async_duration_s : float
        Upload of new files and publication of the manifest.
    bytes_uploaded, files_uploaded : int
        What this checkpoint sent to durable storage (manifest excluded).
    files_reused : int
        SST files referenced from the base checkpoint instead of uploaded.
    full_size, incremental_size : int
        Bytes of every file the checkpoint references / of the files it uploaded.
    """

    checkpoint_id: int
    partition: int
    attempt: str
    sync_duration_s: float
    async_duration_s: float
    bytes_uploaded: int
    files_uploaded: int
    files_reused: int
    full_size: int
    incremental_size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckpointMetrics:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


class RestoreSource(str, enum.Enum):
    """Where a restore found its state."""

    EMPTY = "empty"  # no checkpoint to restore: fresh state
    RESIDENT = "resident"  # the instance this process kept open since the checkpoint
    WORKING_DIR = "working_dir"
    LOCAL_COPY = "local_copy"
    DURABLE = "durable"


@dataclass(frozen=True)
class RestoreMetrics:
    """How one restore went.

    Attributes
    ----------
    source : RestoreSource
        Where the state came from.
    duration_s : float
        Wall time of the restore, including opening RocksDB.
    bytes_downloaded, files_downloaded : int
        Transfers from durable storage (0 unless ``source`` is DURABLE).
    fallback_reason : str or None
        Why a faster source was rejected, when one was.
    """

    checkpoint_id: int | None
    partition: int
    source: RestoreSource
    duration_s: float
    bytes_downloaded: int = 0
    files_downloaded: int = 0
    fallback_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["source"] = self.source.value
        return d
