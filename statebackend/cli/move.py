"""``move``: a savepoint and the restart step that move a shuffle-plan query to the carrier."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from .common import EXIT_OK, _component, common_args


def cmd_move(args: argparse.Namespace, out: TextIO) -> int:
    from ..savepoint.move import default_target, move_to_carrier
    from .common import open_store

    store = args.open_store()
    to = args.to or default_target(args.url)
    # the new location is opened with the same storage options (usually the same store)
    target = open_store(argparse.Namespace(url=to, storage_options=args.storage_options))
    # a refusal (MoveRefusedError) exits 2 through main(), before anything is written
    step = move_to_carrier(store, args.url, args.operator, to=to, target_store=target,
                           name=args.name)
    if args.json:
        out.write(json.dumps({"operator": step.operator_id,
                              "checkpoint_id": step.checkpoint_id,
                              "savepoint": step.savepoint, "state_location": step.state_location,
                              "placement": "carrier", "from_savepoint": step.savepoint,
                              "restart": step.restart}) + "\n")
    else:
        out.write(step.restart)
    return EXIT_OK


def add_move(sub: Any) -> None:
    p = sub.add_parser("move", help="savepoint and restart step moving a shuffle-plan query "
                                    "to placement='carrier'")
    common_args(p)
    p.add_argument("--to", default=None, metavar="URL",
                   help="the new state location (must hold no state of OPERATOR); "
                        "default: URL-carrier")
    p.add_argument("--name", default="move-to-carrier", type=_component,
                   help="savepoint name (default: move-to-carrier)")
    p.set_defaults(func=cmd_move)
