"""``savepoint`` and ``migrate-savepoint``: self-contained copies of a checkpoint."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from ..errors import OptionsError
from .common import EXIT_OK, EXIT_USAGE, _component, _count, _progress, _size, common_args


def cmd_savepoint(args: argparse.Namespace, out: TextIO) -> int:
    from ..savepoint.writer import create_savepoint, savepoint_dir

    store = args.open_store()
    # Reads a completed checkpoint only; if retention of a running query deletes it
    # meanwhile, the savepoint fails before publishing anything (run it again).
    with _progress(args, "savepoint", "partitions") as bar:
        m = create_savepoint(store, args.operator, args.name, checkpoint_id=args.checkpoint,
                             compression=args.compression, progress=bar)
    where = f"{args.operator}/{savepoint_dir(m.name)}"
    if args.json:
        out.write(json.dumps({"name": m.name, "path": where, "checkpoint_id": m.checkpoint_id,
                              "files": len(m.files), **m.metrics}) + "\n")
    else:
        out.write(f"savepoint {m.name} of checkpoint {m.checkpoint_id}: {len(m.files)} files, "
                  f"{m.metrics.get('entries', 0)} entries, "
                  f"{_size(m.metrics.get('stored_bytes', 0))} at {where}\n")
    return EXIT_OK


def cmd_migrate_savepoint(args: argparse.Namespace, out: TextIO) -> int:
    from ..savepoint.migrate import migrate_savepoint
    from ..savepoint.writer import savepoint_dir

    for flag, value in (("--max-parallelism", args.max_parallelism),
                        ("--parallelism", args.parallelism)):
        if value is not None and value < 1:
            sys.stderr.write(f"statebackend: {flag} must be at least 1, got {value}\n")
            return EXIT_USAGE
    store = args.open_store()
    key_types = [t.strip() for t in args.key_types.split(",")] if args.key_types else None
    try:
        with _progress(args, "migrate-savepoint", "key groups") as bar:
            m = migrate_savepoint(store, args.operator, args.name, args.new_name,
                                  args.max_parallelism, key_types=key_types,
                                  parallelism=args.parallelism, compression=args.compression,
                                  progress=bar)
    except OptionsError as exc:  # a bad --max-parallelism, --parallelism or --key-types
        sys.stderr.write(f"statebackend: {exc}\n")
        return EXIT_USAGE
    where = f"{args.operator}/{savepoint_dir(m.name)}"
    src = m.metrics["migrated_from"]
    if args.json:
        out.write(json.dumps({"name": m.name, "path": where, "source": args.name,
                              "max_parallelism": m.max_parallelism,
                              "parallelism": m.parallelism, "files": len(m.files),
                              **{k: v for k, v in m.metrics.items()
                                 if k != "migrated_from"}}) + "\n")
    else:
        out.write(f"savepoint {m.name}: {args.name} rekeyed from max_parallelism="
                  f"{src['max_parallelism']} to {m.max_parallelism}, {len(m.files)} files, "
                  f"{m.metrics.get('entries', 0)} entries, "
                  f"{_size(m.metrics.get('stored_bytes', 0))} at {where}; start the query "
                  f"with max_parallelism={m.max_parallelism} and from_savepoint={m.name!r}\n")
    return EXIT_OK


def add_savepoint(sub: Any) -> None:
    p = sub.add_parser("savepoint", help="write a self-contained savepoint of a checkpoint")
    common_args(p)
    p.add_argument("--name", default=None, type=_component,
                   help="default: sp-<checkpoint>-<ms>")
    p.add_argument("--checkpoint", type=_count(0), default=None, help="default: the latest")
    p.add_argument("--compression", choices=["snappy", "none"], default="snappy")
    p.set_defaults(func=cmd_savepoint)



def add_migrate_savepoint(sub: Any) -> None:
    p = sub.add_parser("migrate-savepoint",
                       help="rewrite a savepoint for another max_parallelism (a new savepoint)")
    common_args(p)
    p.add_argument("name", metavar="NAME", type=_component, help="the savepoint to read")
    p.add_argument("new_name", metavar="NEW_NAME", type=_component,
                   help="the savepoint to write (must not exist)")
    # ranges checked by cmd_migrate_savepoint (exit 2 returned, not raised: main() callers
    # get the code back as for every other check after parsing)
    p.add_argument("--max-parallelism", type=_count(-(2 ** 63)), required=True, metavar="M",
                   help="key groups of the new savepoint")
    p.add_argument("--parallelism", type=_count(-(2 ** 63)), default=None, metavar="P",
                   help="data files (partitions) of the new savepoint; default the source's")
    p.add_argument("--key-types", default=None,
                   help="grouping-key types, comma separated, if the savepoint lacks them")
    p.add_argument("--compression", choices=["snappy", "none"], default=None,
                   help="default: the source's")
    p.set_defaults(func=cmd_migrate_savepoint)

