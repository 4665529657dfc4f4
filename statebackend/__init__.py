"""statebackend: a RocksDB keyed-state backend for PySpark stateful operators.

Public names only; everything else lives in sub-packages (see README.md for the map).
``RocksDBStateBackend`` imports pyspark, so it is loaded on first use.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptStateError,
    FencingUnsupportedError,
    FormatVersionError,
    IncompatibleStateError,
    OptionsError,
    RestoreError,
    StateBackendError,
    StateLocationInUseError,
    StorageError,
    UnknownOptionError,
    WriterFencedError,
)
from .options import StateBackendOptions

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "CorruptStateError",
    "FencingUnsupportedError",
    "FormatVersionError",
    "IncompatibleStateError",
    "OptionsError",
    "RestoreError",
    "RocksDBStateBackend",
    "StateBackendError",
    "StateBackendOptions",
    "StateLocationInUseError",
    "StorageError",
    "UnknownOptionError",
    "WriterFencedError",
]


def __getattr__(name: str) -> Any:
    if name == "RocksDBStateBackend":
        from .backend import RocksDBStateBackend

        return RocksDBStateBackend
    raise AttributeError(f"module 'statebackend' has no attribute {name!r}")
