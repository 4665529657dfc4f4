"""``move``: a savepoint and the restart step that move a shuffle-plan query to the carrier;
``import-spark``: a savepoint of a stopped Spark ``transformWithStateInPandas`` query's
state, read through Spark's ``statestore`` source."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from .common import EXIT_OK, _component, _count, _storage_options, common_args


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


def cmd_import_spark(args: argparse.Namespace, out: TextIO) -> int:
    from ..backend import RocksDBStateBackend
    from ..spark.session import active_or_local_session

    spark = active_or_local_session(args.master, "statebackend import-spark")
    opts: dict[str, Any] = {}
    if args.parallelism is not None:
        opts["parallelism"] = args.parallelism
    if args.max_parallelism is not None:
        opts["max_parallelism"] = args.max_parallelism
    backend = RocksDBStateBackend(args.url, opts or None,
                                  storage_options=_storage_options(args.storage_options))
    # refusals (MoveRefusedError) exit 2 and a missing Spark state 3 through main()
    step = backend.import_spark_state(spark, args.spark_checkpoint, args.operator,
                                      spark_operator_id=args.spark_operator_id,
                                      batch_id=args.batch_id, name=args.name)
    if args.json:
        out.write(json.dumps({"operator": step.operator_id, "savepoint": step.savepoint,
                              "state_location": step.state_location,
                              "from_savepoint": step.savepoint, "batch_id": step.batch_id,
                              "rows": step.rows, "entries": step.entries,
                              "seconds": round(step.seconds, 3),
                              "restart": step.restart}) + "\n")
    else:
        rows = ", ".join(f"{k}: {v}" for k, v in step.rows.items())
        out.write(f"read from Spark: {rows}; {step.entries} entries in "
                  f"{step.seconds:.1f} s\n{step.restart}")
    return EXIT_OK


def add_import_spark(sub: Any) -> None:
    p = sub.add_parser("import-spark", help="savepoint of a stopped Spark "
                                            "transformWithStateInPandas query's state")
    common_args(p)
    p.add_argument("--from", dest="spark_checkpoint", required=True, metavar="CHECKPOINT",
                   help="the stopped Spark query's checkpointLocation")
    p.add_argument("--spark-operator-id", type=_count(0), default=0, metavar="N",
                   help="Spark's id of the operator (default 0, a query's first stateful "
                        "operator)")
    p.add_argument("--batch-id", type=_count(0), default=None, metavar="N",
                   help="the committed batch to read (default: Spark's latest)")
    p.add_argument("--name", default="from-spark", type=_component,
                   help="savepoint name (default: from-spark)")
    p.add_argument("--parallelism", type=_count(1), default=None, metavar="N",
                   help="partitions of the new state (default: spark.sql.shuffle.partitions)")
    p.add_argument("--max-parallelism", type=_count(1), default=None, metavar="N",
                   help="key groups of the new state (default: the option's default)")
    p.add_argument("--master", default="local[*]",
                   help="Spark master when no session is active (default: local[*])")
    p.set_defaults(func=cmd_import_spark)
