"""``statebackend``: inspect, verify, garbage-collect and read checkpoints, without Spark.

    statebackend list     URL [OPERATOR]              operators, or an operator's checkpoints
    statebackend describe URL OPERATOR [ID]            partitions, files, shared/private bytes
    statebackend verify   URL OPERATOR [ID] [--deep]   what a restore checks (statebackend.verify)
    statebackend gc       URL OPERATOR --dry-run       what retention would delete
    statebackend read     URL OPERATOR -o out.parquet  dump state to Parquet or CSV
    statebackend metrics  URL OPERATOR                 per-checkpoint metrics (JSON lines)
    statebackend savepoint URL OPERATOR [--name N]     self-contained savepoint of a checkpoint
    statebackend migrate-savepoint URL OPERATOR NAME NEW_NAME --max-parallelism M
                                                       savepoint NAME rekeyed for M key groups
    statebackend move     URL OPERATOR [--to URL2] [--name N]
                                                       savepoint + restart step to the carrier plan
    statebackend import-spark URL OPERATOR --from SPARK_CHECKPOINT [--name N]
                                                       savepoint of a stopped Spark query's
                                                       transformWithState state (runs Spark)

``URL`` is the backend's ``checkpoint_location`` (a path or any fsspec URL). Nothing here
writes to the store except ``gc`` without ``--dry-run``, ``savepoint``,
``migrate-savepoint``, ``move`` and ``import-spark`` (which write a new savepoint and never
change their source). Only ``import-spark`` needs Spark (it reads Spark's ``statestore``
source in a Spark job).

``--json`` prints one JSON document instead of a table or summary. The long commands
(``verify``, ``read``, ``gc``, ``savepoint``, ``migrate-savepoint``) redraw a progress line on
stderr when it is a terminal (:mod:`statebackend.progress`); ``-q``/``--quiet`` hides it.

``verify`` checks each retained checkpoint as a restore would (:mod:`statebackend.verify`):
the manifests belong where the record puts them and their key-group ranges tile; every
referenced file, also those reused from older checkpoints, has its size and CRC32; the
SST files RocksDB's own MANIFEST needs are all listed; changelogs follow without a gap.
``--deep`` also downloads each partition, opens it and reads every entry back.

Exit codes (every command):

    0    success
    1    problems found: ``verify`` found some, or ``read``/``savepoint`` met a damaged
         checkpoint (CorruptStateError)
    2    bad usage: missing or malformed arguments, a number out of range, an unknown URL
         protocol, ``--storage-options`` that is not a JSON object, a ``move`` refused
         (the location already uses the carrier plan, or ``--to`` holds state), an
         ``import-spark`` refused (the operator is not a transformWithState one, or the
         location already holds state of OPERATOR)
    3    no such operator, checkpoint, state or partition, including a URL with no state
         (``import-spark``: a Spark checkpoint without state or without that operator)
    4    storage failure (unreachable store, permissions, a name that already exists)
    130  interrupted

No input ends in a traceback: failures are one line on stderr. URL credentials
(``scheme://user:secret@host``) are redacted from every message, and storage options are
never printed.
"""


from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from ..errors import (
    CheckpointNotFoundError,
    CorruptStateError,
    MoveRefusedError,
    OptionsError,
    StateBackendError,
    StateError,
)
from ..redact import redact_text
from ..storage.base import DurableStore
from ..verify import Problem, verify_checkpoints
from . import data, gc, inspect, move, savepoints
from .common import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_PROBLEMS, EXIT_USAGE, open_store
from .gc import RecordingStore, run_gc

__all__ = ["main", "Problem", "RecordingStore", "run_gc", "verify_checkpoints"]


def _open(args: argparse.Namespace) -> DurableStore:
    """The store ``args.url`` names; commands reach it through ``args.open_store()``, which
    calls this name at the time, so a caller may replace it (a benchmark counts requests)."""
    return open_store(args)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per ``cmd_*`` of the command modules."""
    parser = argparse.ArgumentParser(
        prog="statebackend", description="Inspect, verify, garbage-collect and read the "
        "checkpoints of a statebackend RocksDB state location (no Spark needed).",
        epilog="exit codes: 0 ok, 1 problems found (verify, or a damaged checkpoint), 2 bad "
        "usage, 3 no such operator, checkpoint, state or partition (or no state at the URL), "
        "4 storage failure, 130 interrupted",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect.add_list(sub)
    inspect.add_describe(sub)
    inspect.add_verify(sub)
    gc.add_gc(sub)
    data.add_read(sub)
    data.add_changes(sub)
    savepoints.add_savepoint(sub)
    savepoints.add_migrate_savepoint(sub)
    move.add_move(sub)
    move.add_import_spark(sub)
    inspect.add_metrics(sub)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the ``statebackend`` console script; returns the exit code.

    Bad arguments exit 2 through argparse (``SystemExit``); every other failure is one
    line on stderr, with credentials of the URL redacted, and never a traceback (set
    ``STATEBACKEND_TRACEBACK=1`` to see one for an unexpected error).
    """
    out = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    args.open_store = lambda: _open(args)

    def fail(code: int, text: str) -> int:
        sys.stderr.write(redact_text(f"statebackend: {text}", args.url) + "\n")
        return code

    try:
        return int(args.func(args, out))
    except OptionsError as exc:  # bad usage found after parsing: protocol, JSON, values
        return fail(EXIT_USAGE, str(exc))
    except (CheckpointNotFoundError, StateError) as exc:  # no such operator, checkpoint,
        return fail(EXIT_NOT_FOUND, str(exc))               # state or partition
    except MoveRefusedError as exc:  # a move the location or --to cannot take part in
        return fail(EXIT_USAGE, str(exc))
    except CorruptStateError as exc:  # what verify reports: the checkpoint is damaged
        return fail(EXIT_PROBLEMS, f"{type(exc).__name__}: {exc}")
    except (StateBackendError, OSError) as exc:
        return fail(EXIT_ERROR, f"{type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        return fail(130, "interrupted")
    except Exception as exc:  # noqa: BLE001 - no input may end in a traceback
        if os.environ.get("STATEBACKEND_TRACEBACK"):
            import traceback
            sys.stderr.write(redact_text(traceback.format_exc(), args.url))
        return fail(EXIT_ERROR, f"unexpected {type(exc).__name__}: {exc} (set "
                                f"STATEBACKEND_TRACEBACK=1 to see where)")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
