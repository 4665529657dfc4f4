"""``read`` and ``changes``: state and its changes to Parquet or CSV."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from ..errors import OptionsError
from .common import EXIT_OK, _count, _key_types, _progress, common_args


def _output_format(args: argparse.Namespace) -> str:
    """``csv`` or ``parquet``, from ``--format`` or the output's name; Parquet to standard
    output is bad usage, said before anything is read."""
    fmt = args.format or ("csv" if args.output == "-" or args.output.endswith(".csv")
                          else "parquet")
    if fmt == "parquet" and args.output == "-":
        raise OptionsError("--output", "-", "Parquet cannot go to standard output; give a "
                                            "file name or use --format csv")
    return fmt


def _write(frame: Any, view: Any, state: str | None, fmt: str, args: argparse.Namespace,
           out: TextIO) -> None:
    """``frame`` to ``args.output`` (``-``: ``out``): nested columns typed in Parquet, as
    JSON in CSV."""
    from ..read.arrow import nested_as_json, write_parquet

    if fmt == "csv":
        nested_as_json(frame, view, state).to_csv(
            out if args.output == "-" else args.output, index=False)
    else:
        write_parquet(frame, view, state, args.output)


def _view(load: Any, store: Any, op: str, checkpoint: int | None,
          key_types: list[str] | None) -> tuple[Any, bool]:
    """The checkpoint's view, and whether its key types are the user's guess: given
    ``--key-types`` must match what the checkpoint records (bad usage otherwise), and are
    used only when it records none."""
    from ..errors import StateError

    try:
        view = load(store, op, checkpoint)
    except StateError:  # no recorded types: the user's are needed
        if key_types is None:
            raise
        return load(store, op, checkpoint, key_types=key_types), True
    if key_types is not None and list(view.key_types) != key_types:
        raise OptionsError("--key-types", ",".join(key_types),
                           f"--key-types {','.join(key_types)} does not match the grouping-key "
                           f"types checkpoint {view.record.checkpoint_id} records "
                           f"({','.join(view.key_types)}); omit --key-types")
    return view, False


class _decoding:
    """Keys that do not decode as types the user guessed: bad usage, not corruption."""

    def __init__(self, guessed: bool, key_types: list[str] | None) -> None:
        self.guessed, self.key_types = guessed, key_types

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        from ..errors import CorruptStateError

        if self.guessed and isinstance(exc, CorruptStateError) and exc.path is None:
            raise OptionsError("--key-types", ",".join(self.key_types or ()),
                               f"the keys do not decode as --key-types "
                               f"{','.join(self.key_types or ())} ({exc}); pass the query's "
                               f"grouping-key types") from exc


def cmd_read(args: argparse.Namespace, out: TextIO) -> int:
    from ..read.rows import load_checkpoint, read_rows, rows_to_pandas

    fmt = _output_format(args)
    store = args.open_store()
    op = args.operator
    view, guessed = _view(load_checkpoint, store, op, args.checkpoint, args.key_types)
    parts = args.partition if args.partition else None
    with _progress(args, "read", "partitions") as bar, _decoding(guessed, args.key_types):
        rows = list(read_rows(store, op, state_name=args.state, partitions=parts,
                              view=view, progress=bar))
    frame = rows_to_pandas(rows, view, args.state)
    _write(frame, view, args.state, fmt, args, out)
    if args.output == "-":
        return EXIT_OK  # standard output holds the data
    if args.json:
        out.write(json.dumps({"rows": len(frame), "checkpoint_id": view.record.checkpoint_id,
                              "state": args.state, "output": args.output,
                              "format": fmt}) + "\n")
    else:
        out.write(f"wrote {len(frame)} rows of checkpoint {view.record.checkpoint_id} "
                  f"({'all states' if args.state is None else 'state ' + args.state}) to "
                  f"{args.output}\n")
    return EXIT_OK


def cmd_changes(args: argparse.Namespace, out: TextIO) -> int:
    """What was put and deleted between two retained checkpoints, to Parquet or CSV."""
    from ..read.changes import change_rows, changes_to_pandas, plan_changes

    fmt = _output_format(args)
    store = args.open_store()
    plan = plan_changes(store, args.operator, args.from_id, args.to_id,
                        key_types=args.key_types)
    with _progress(args, "changes", "partitions") as bar:
        rows = list(change_rows(store, args.operator, args.from_id, args.to_id, args.state,
                                partitions=args.partition or None, plan=plan, progress=bar))
    frame = changes_to_pandas(rows, plan, args.state)
    _write(frame, plan.view, args.state, fmt, args, out)
    if args.output == "-":
        return EXIT_OK  # standard output holds the data
    counts = {op: int((frame["operation"] == op).sum()) for op in ("put", "delete")}
    sources = {"changelog" if u.changelogs is not None else "compare" for u in plan.units}
    if args.json:
        out.write(json.dumps({"rows": len(frame), **counts, "from": args.from_id,
                              "to": args.to_id, "state": args.state, "sources": sorted(sources),
                              "output": args.output, "format": fmt}) + "\n")
    else:
        out.write(f"wrote {len(frame)} changes ({counts['put']} put, {counts['delete']} "
                  f"delete rows) from checkpoint {args.from_id} to {args.to_id} "
                  f"({', '.join(sorted(sources))}) to {args.output}\n")
    return EXIT_OK


def add_read(sub: Any) -> None:
    p = sub.add_parser("read", help="dump state to Parquet or CSV")
    common_args(p)
    p.add_argument("--checkpoint", type=_count(0), default=None, help="default: the latest")
    _output_args(p, partition_help="only this partition (repeatable)")
    p.set_defaults(func=cmd_read)


def add_changes(sub: Any) -> None:
    p = sub.add_parser("changes", help="rows put and deleted between two checkpoints")
    common_args(p)
    p.add_argument("--from", dest="from_id", type=int, required=True, metavar="A",
                   help="the older retained checkpoint")
    p.add_argument("--to", dest="to_id", type=int, required=True, metavar="B",
                   help="the newer retained checkpoint")
    _output_args(p, partition_help="only this partition of B (repeatable)")
    p.set_defaults(func=cmd_changes)


def _output_args(p: Any, *, partition_help: str) -> None:
    """The arguments ``read`` and ``changes`` share: which state and partitions, where to."""
    p.add_argument("--state", default=None,
                   help="one state (typed columns); default every state, values as JSON")
    p.add_argument("--partition", type=_count(0), action="append", help=partition_help)
    p.add_argument("-o", "--output", required=True,
                   help="file to write (.parquet or .csv), or - for CSV on stdout")
    p.add_argument("--format", choices=["parquet", "csv"], default=None)
    p.add_argument("--key-types", default=None, type=_key_types,
                   help="grouping-key types, comma separated, if the checkpoint lacks them")

