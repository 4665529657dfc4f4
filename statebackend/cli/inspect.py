"""``list``, ``describe``, ``verify`` and ``metrics``: what a state location holds."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from ..errors import CheckpointNotFoundError
from ..model.manifest import PartitionManifest
from ..verify import verify_checkpoints
from .common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    _count,
    _manifests,
    _operators,
    _pins,
    _progress,
    _record,
    _records,
    _size,
    _table,
    _when,
    checkpoint_arg,
    common_args,
)


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    store = args.open_store()
    if args.operator is None:
        ops = _operators(store)
        rows = []
        for op in ops:
            recs = _records(store, op)
            last = recs[max(recs)] if recs else None
            rows.append([op, len(recs), "-" if last is None else last.checkpoint_id,
                         "-" if last is None else _size(last.full_size),
                         "-" if last is None else _when(last.created_at_ms)])
        if not rows:
            # a mistyped path or bucket looks exactly like this: say so, do not succeed
            raise CheckpointNotFoundError(f"no statebackend state under {args.url}: no "
                                          f"operator directory with completed checkpoints "
                                          f"(check the URL)")
        if args.json:
            out.write(json.dumps([dict(zip(["operator", "checkpoints", "latest", "size",
                                            "created"], r)) for r in rows]) + "\n")
        else:
            _table(rows, ["operator", "checkpoints", "latest", "size", "created"], out)
        return EXIT_OK
    records = _records(store, args.operator)
    if not records:
        raise CheckpointNotFoundError(f"operator {args.operator!r} has no completed "
                                      f"checkpoint under {store.root}")
    pins = _pins(store, args.operator)
    if args.json:
        out.write(json.dumps([{"checkpoint_id": n, "parallelism": r.parallelism,
                               "full_size": r.full_size, "incremental_size": r.incremental_size,
                               "created_at_ms": r.created_at_ms, "pinned": n in pins}
                              for n, r in records.items()]) + "\n")
        return EXIT_OK
    _table([[n, r.parallelism, _size(r.full_size), _size(r.incremental_size),
             _when(r.created_at_ms), "pinned" if n in pins else ""]
            for n, r in records.items()],
           ["checkpoint", "partitions", "full size", "uploaded", "created (UTC)", ""], out)
    return EXIT_OK


def _describe_partitions(manifests: dict[int, PartitionManifest]
                         ) -> tuple[list[dict[str, Any]], list[list[Any]], dict[str, int]]:
    """Per partition: its JSON description and its table row; and the totals."""
    rows = []
    tot = {"files": 0, "shared": 0, "private": 0, "uploaded": 0, "rows": 0, "keys": 0}
    parts: list[dict[str, Any]] = []
    for p, m in manifests.items():
        shared = sum(f.size for f in m.files if f.shared)
        private = sum(f.size for f in m.files if not f.shared)
        restore = (m.metrics.get("restore") or {}).get("source", "?")
        d: dict[str, Any] = {"partition": p, "attempt": m.attempt,
                            "key_groups": [m.key_group_start, m.key_group_end], "files": len(m.files),
                            "shared_bytes": shared, "private_bytes": private,
                            "uploaded_bytes": m.incremental_size, "rows": int(m.metrics.get("rows", 0)),
                            "keys": int(m.metrics.get("keys", 0)),
                            "restore": str(restore).split(".")[-1].lower(), "mode": m.mode,
                            "base_checkpoint_id": m.base_checkpoint_id,
                            "logical_bytes": (m.metrics.get("rocksdb") or {}).get("logical_bytes"),
                            "file_list": [{"name": f.name, "path": f.path, "size": f.size, "shared": f.shared,
                                           "uploaded": f.uploaded, "checksum": f.checksum} for f in m.files]}
        parts.append(d)
        for k, v in (("files", len(m.files)), ("shared", shared), ("private", private),
                     ("uploaded", m.incremental_size), ("rows", d["rows"]), ("keys", d["keys"])):
            tot[k] += v
        rows.append([p, f"{m.key_group_start}-{m.key_group_end}", len(m.files), _size(shared),
                     _size(private), _size(m.incremental_size), d["rows"], d["keys"],
                     d["restore"], m.mode, m.attempt])
    return parts, rows, tot


def cmd_describe(args: argparse.Namespace, out: TextIO) -> int:
    store = args.open_store()
    op = args.operator
    record = _record(store, op, args.checkpoint)
    manifests = _manifests(store, op, record)
    parts, rows, tot = _describe_partitions(manifests)
    states = {d.name: d for m in manifests.values() for d in m.states}
    damaged = _damaged_others(store, op, record.checkpoint_id)
    if args.json:
        out.write(json.dumps({"operator_id": op, "checkpoint_id": record.checkpoint_id,
                              "damaged": [{"checkpoint_id": n, "problem": why}
                                          for n, why in damaged],
                              "parallelism": record.parallelism,
                              "max_parallelism": record.max_parallelism,
                              "created_at_ms": record.created_at_ms,
                              "full_size": record.full_size,
                              "incremental_size": record.incremental_size,
                              "states": [vars(s) for s in states.values()],
                              "partitions": parts}, default=str) + "\n")
        return EXIT_OK
    for n, why in damaged:
        out.write(f"WARNING: retained checkpoint {n} is damaged and skipped: {why}\n")
    out.write(f"operator {op}, checkpoint {record.checkpoint_id} (created "
              f"{_when(record.created_at_ms)}): {record.parallelism} partitions, "
              f"{record.max_parallelism} key groups\n")
    out.write(f"  {tot['files']} files, {_size(tot['shared'] + tot['private'])}: shared (SST) "
              f"{_size(tot['shared'])}, private {_size(tot['private'])}; uploaded by this "
              f"checkpoint {_size(tot['uploaded'])}; {tot['rows']} rows, {tot['keys']} keys\n")
    logical = [d["logical_bytes"] for d in parts]
    if parts and None not in logical:  # keys + values of live entries, the data stored
        total = tot["shared"] + tot["private"]
        out.write(f"  logical state (keys + values of live entries) {_size(sum(logical))}; "
                  f"referenced / logical {total / max(1, sum(logical)):.2f}x\n")
    for s in states.values():
        schema = (f"({s.user_key_schema}) -> ({s.value_schema})" if s.kind == "map"
                  else f"({s.value_schema})" if s.value_schema else "")
        ttl = f" ttl={s.ttl_ms}ms" if s.ttl_ms is not None else ""
        blocks = f" {s.blocks} blocks per key group" if s.blocks is not None else ""
        versions = (f", {len(s.history)} earlier schema version(s) still read"
                    if s.history else "")
        out.write(f"  state {s.name}: {s.kind}{schema}{ttl}{blocks}{versions}\n")
    out.write("\n")
    _table(rows, ["partition", "key groups", "files", "shared", "private", "uploaded", "rows",
                  "keys", "restore", "mode", "attempt"], out)
    if args.files:
        out.write("\n")
        _table([[d["partition"], f["name"], f["size"], "shared" if f["shared"] else "private",
                 "uploaded" if f["uploaded"] else "reused", f["path"]]
                for d in parts for f in d["file_list"]],
               ["partition", "file", "bytes", "kind", "", "path"], out)
    return EXIT_OK


def _damaged_others(store: Any, op: str, shown: int) -> list[tuple[int, str]]:
    """The other retained checkpoints whose record or manifests fail the checks every
    reader makes (manifests read, not the files: ``verify`` checks those)."""
    from ..verify import Problem, VerifyContext, load_checkpoint, read_records

    broken: dict[int, Problem] = {}
    records = read_records(store, op, broken)
    out = [(n, p.what) for n, p in sorted(broken.items()) if n != shown]
    ctx = VerifyContext(store, op, checksums=False)
    for n, rec in records.items():
        if n == shown:
            continue
        for _p, why in sorted(load_checkpoint(ctx, rec).unreadable.items()):
            out.append((n, why))
            break
    return sorted(out)


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    store = args.open_store()
    op = args.operator
    ids = None if args.checkpoint is None else [args.checkpoint]
    with _progress(args, "verify", "files") as bar:
        problems, nfiles, nbytes = verify_checkpoints(store, op, ids,
                                                      checksums=not args.size_only,
                                                      deep=args.deep, progress=bar)
    if args.json:
        out.write(json.dumps({"ok": not problems, "files": nfiles, "bytes": nbytes,
                              "problems": [vars(p) for p in problems]}) + "\n")
    else:
        for p in problems:
            out.write(f"BAD  {p}\n")
        what = "sizes" if args.size_only else "sizes and checksums"
        verdict = "OK" if not problems else f"{len(problems)} problem(s)"
        deep = "; opened every partition with RocksDB" if args.deep else ""
        out.write(f"{verdict}: checked {what} of {nfiles} files ({_size(nbytes)}){deep}\n")
        if problems:
            out.write("The checkpoints above cannot be restored as they are; restore from an "
                      "older retained checkpoint or fix the files.\n")
    return EXIT_PROBLEMS if problems else EXIT_OK


def cmd_metrics(args: argparse.Namespace, out: TextIO) -> int:
    from ..metrics_store import read_metrics

    store = args.open_store()
    lines = read_metrics(store, args.operator, partitions=args.partitions)
    if not lines:
        raise CheckpointNotFoundError(f"no metrics recorded for operator {args.operator!r} "
                                      f"under {store.root}")
    for line in lines[-args.last:] if args.last else lines:
        out.write(json.dumps(line, sort_keys=True) + "\n")
    return EXIT_OK


def add_list(sub: Any) -> None:
    p = sub.add_parser("list", help="operators, or the retained checkpoints of one")
    common_args(p, "optional")
    p.set_defaults(func=cmd_list)



def add_describe(sub: Any) -> None:
    p = sub.add_parser("describe", help="partitions, files, shared and private bytes")
    common_args(p)
    checkpoint_arg(p, "checkpoint id (default: the latest)")
    p.add_argument("--files", action="store_true", help="also list every file")
    p.set_defaults(func=cmd_describe)



def add_verify(sub: Any) -> None:
    p = sub.add_parser("verify", help="check what a restore checks: records against "
                       "manifests, every file's size and CRC32, RocksDB's file set, changelogs")
    common_args(p)
    checkpoint_arg(p, "checkpoint id (default: every retained checkpoint)")
    p.add_argument("--size-only", action="store_true", help="skip reading files for checksums")
    p.add_argument("--deep", action="store_true",
                   help="also download each partition, open it with RocksDB, replay its "
                        "changelogs and read every entry back (costs a full download)")
    p.set_defaults(func=cmd_verify)



def add_metrics(sub: Any) -> None:
    p = sub.add_parser("metrics", help="per-checkpoint metrics recorded beside the checkpoints")
    common_args(p)
    p.add_argument("--partitions", action="store_true", help="also per-partition lines")
    p.add_argument("--last", type=_count(0), default=0, metavar="N",
                   help="only the last N (0: all)")
    p.set_defaults(func=cmd_metrics)

