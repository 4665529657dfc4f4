"""What the commands share: exit codes, tables, reading records, argument types."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from collections.abc import Callable
from typing import Any, TextIO

from ..errors import CheckpointNotFoundError, OptionsError, StateBackendError
from ..model.manifest import (
    CHECKPOINTS_DIR,
    CompletedCheckpoint,
    PartitionManifest,
    check_component,
)
from ..progress import Progress
from ..progress import format_bytes as _size
from ..storage.base import DurableStore
from ..verify import read_records

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_ERROR = 0, 1, 2, 3, 4

_PIN = re.compile(r"^chk-(\d+)$")

__all__ = ["EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "_size"]

# --- output helpers ----------------------------------------------------------------------


def _when(ms: int) -> str:
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _table(rows: list[list[Any]], header: list[str], out: TextIO) -> None:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        out.write("  ".join(c.rjust(w) if i else c.ljust(w)
                            for i, (c, w) in enumerate(zip(r, widths))).rstrip() + "\n")


# --- reading the operator's records (read-only; no coordinator, which would delete) ------


_records = read_records


def _pins(store: DurableStore, op: str) -> set[int]:
    out = set()
    for rel in store.list_dir(f"{op}/_pins"):
        m = _PIN.match(rel.rsplit("/", 1)[-1])
        if m:
            out.add(int(m.group(1)))
    return out


def _record(store: DurableStore, op: str, checkpoint_id: int | None) -> CompletedCheckpoint:
    records = _records(store, op)
    if not records:
        raise CheckpointNotFoundError(f"operator {op!r} has no completed checkpoint under "
                                      f"{store.root} (check the URL and the operator id; "
                                      f"'statebackend list URL' shows the operators)")
    if checkpoint_id is None:
        return records[max(records)]
    if checkpoint_id not in records:
        raise CheckpointNotFoundError(f"checkpoint {checkpoint_id} of {op!r} is not a retained "
                                      f"completed checkpoint; retained: {sorted(records)}")
    return records[checkpoint_id]


def _manifests(store: DurableStore, op: str, record: CompletedCheckpoint
               ) -> dict[int, PartitionManifest]:
    from ..storage.manifests import read_recorded_manifests

    return read_recorded_manifests(store, record, operator_id=op)


def _operators(store: DurableStore) -> list[str]:
    """Operator directories under the root: those holding a ``_checkpoints`` directory."""
    fs = getattr(store, "fs", None)
    if fs is None:
        raise StateBackendError("this store cannot list operators; name the operator")
    root = store.root
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return []
    out = []
    for e in entries:
        if e.get("type") != "directory":
            continue
        name = e["name"].rstrip("/").rsplit("/", 1)[-1]
        try:
            check_component(name)
        except StateBackendError:
            continue
        if fs.exists(f"{root}/{name}/{CHECKPOINTS_DIR}"):
            out.append(name)
    return sorted(out)


# --- arguments -------------------------------------------------------------------------


def _progress(args: argparse.Namespace, label: str, unit: str) -> Progress:
    """The progress line of a long command: on stderr when it is a terminal, unless
    ``--quiet``."""
    return Progress(label, unit, enabled=False if args.quiet else None)


def _storage_options(text: str | None) -> dict[str, Any] | None:
    """``--storage-options`` as a dict; refused (exit 2) unless a JSON object. Its text is
    never echoed: it holds credentials."""
    if not text:
        return None
    try:
        opts = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionsError("--storage-options", "<redacted>",
                           f"--storage-options is not valid JSON ({exc.msg} at character "
                           f"{exc.pos}); give a JSON object, e.g. '{{\"anon\": true}}'") from None
    if not isinstance(opts, dict):
        raise OptionsError("--storage-options", "<redacted>",
                           f"--storage-options must be a JSON object of fsspec options, e.g. "
                           f"'{{\"anon\": true}}'; got a JSON {type(opts).__name__}")
    return opts


def open_store(args: argparse.Namespace) -> DurableStore:
    from ..options import check_location
    from ..storage import open_store

    check_location(args.url, "URL")  # an unknown protocol is bad usage (exit 2)
    opts = _storage_options(args.storage_options)
    try:
        return open_store(args.url, storage_options=opts)
    except TypeError as exc:  # the filesystem's constructor refuses an option
        raise OptionsError("--storage-options", "<redacted>",
                           f"the filesystem of {args.url} refuses these storage options "
                           f"({exc})") from None


def _count(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low`` (bad usage otherwise, exit 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {low}")
        return value
    parse.__name__ = "integer"  # argparse names the type in its message
    return parse

def _component(text: str) -> str:
    """An argparse type: a name used as one path component (an operator id, a savepoint):
    a name that would escape the location is bad usage (exit 2), not a storage error."""
    from ..errors import UnsafePathError
    from ..model.manifest import check_component

    try:
        return check_component(text)
    except UnsafePathError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_component.__name__ = "name"


def _key_types(text: str) -> list[str]:
    """An argparse type: comma-separated grouping-key types, each one supported."""
    from ..errors import SchemaError
    from ..keys.groups import normalise_type

    try:
        return [normalise_type(t) for t in text.split(",")]
    except SchemaError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_key_types.__name__ = "key types"


def common_args(p: argparse.ArgumentParser, operator: str = "required") -> None:
    """URL, OPERATOR and the options every command takes."""
    p.add_argument("url", metavar="URL", help="the backend's checkpoint_location")
    if operator == "optional":
        p.add_argument("operator", metavar="OPERATOR", nargs="?", default=None,
                       type=_component, help="operator id (omit to list operators)")
    else:
        p.add_argument("operator", metavar="OPERATOR", type=_component, help="operator id")
    p.add_argument("--storage-options", metavar="JSON",
                   help="fsspec options as JSON, e.g. '{\"anon\": false}'")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output (one JSON document; metrics: JSON lines)")
    p.add_argument("-q", "--quiet", "--no-progress", dest="quiet", action="store_true",
                   help="no progress line on stderr (shown only when stderr is a "
                        "terminal anyway)")


def checkpoint_arg(p: argparse.ArgumentParser, what: str) -> None:
    """An optional positional checkpoint id."""
    p.add_argument("checkpoint", metavar="ID", nargs="?", type=_count(0), default=None,
                   help=what)
