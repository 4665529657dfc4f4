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

``URL`` is the backend's ``checkpoint_location`` (a path or any fsspec URL). Nothing here
writes to the store except ``gc`` without ``--dry-run``, ``savepoint`` and
``migrate-savepoint`` (which writes a new savepoint and never changes its source).

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
         protocol, ``--storage-options`` that is not a JSON object
    3    no such operator, checkpoint, state or partition, including a URL with no state
    4    storage failure (unreachable store, permissions, a name that already exists)
    130  interrupted

No input ends in a traceback: failures are one line on stderr. URL credentials
(``scheme://user:secret@host``) are redacted from every message, and storage options are
never printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from .checkpoint.manifest import (
    CHECKPOINTS_DIR,
    CompletedCheckpoint,
    PartitionManifest,
    check_component,
)
from .errors import (
    CheckpointNotFoundError,
    CorruptStateError,
    OptionsError,
    StateBackendError,
    StateError,
    StorageError,
)
from .progress import Progress, ProgressFn
from .progress import format_bytes as _size
from .redact import redact_text
from .storage.base import DurableStore, StoreFileNotFoundError, Transfer
from .verify import Problem, read_records, verify_checkpoints

__all__ = ["main", "Problem", "RecordingStore", "run_gc", "verify_checkpoints"]

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_ERROR = 0, 1, 2, 3, 4

_PIN = re.compile(r"^chk-(\d+)$")


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
    from .storage.manifests import read_recorded_manifests

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


# --- gc --dry-run -----------------------------------------------------------------------


class RecordingStore(DurableStore):
    """A store that records what is deleted; with ``dry_run`` it only pretends.

    Reads go to ``inner``. With ``dry_run`` (the default), writes and deletes change only
    an in-memory overlay, so running the real
    :class:`~statebackend.coordinator.CheckpointCoordinator` over it gives exactly the
    deletions a real run would make now, with nothing changed. Either way ``deleted``
    lists the paths deleted (relative to the store root) and ``deleted_bytes`` their size;
    ``progress`` is told of every record or manifest read and every file deleted.
    """

    def __init__(self, inner: DurableStore, dry_run: bool = True,
                 progress: ProgressFn | None = None) -> None:
        self.inner = inner
        self.root = inner.root
        self.dry_run = dry_run
        self.progress = progress
        self.reads = 0
        self.deleted: list[str] = []
        self.deleted_bytes = 0
        self._gone: set[str] = set()
        self._written: dict[str, bytes] = {}

    def put_file(self, local_path: str, path: str) -> Transfer:
        raise StorageError("garbage collection uploads nothing")

    def get_file(self, path: str, local_path: str, *, size: int | None = None,
                 checksum: str | None = None) -> Transfer:
        if path in self._gone:
            raise StoreFileNotFoundError(path)
        return self.inner.get_file(path, local_path, size=size, checksum=checksum)

    def put_bytes_atomic(self, path: str, data: bytes) -> None:
        if not self.dry_run:
            self.inner.put_bytes_atomic(path, data)
            return
        self._written[path] = data
        self._gone.discard(path)

    def get_bytes(self, path: str) -> bytes:
        if path in self._gone:
            raise StoreFileNotFoundError(path)
        if path in self._written:
            return self._written[path]
        data = self.inner.get_bytes(path)
        self.reads += 1
        if self.progress is not None:
            self.progress(self.reads, unit="records and manifests read")
        return data

    def exists(self, path: str) -> bool:
        return self.size(path) is not None

    def size(self, path: str) -> int | None:
        if path in self._gone:
            return None
        if path in self._written:
            return len(self._written[path])
        return self.inner.size(path)

    def delete(self, paths: Iterable[str]) -> None:
        paths = list(paths)
        stored = [p for p in paths if p not in self._gone and p not in self._written]
        size_of = dict(zip(stored, self.inner.sizes(stored)))  # in parallel where it can
        size_of.update((p, len(self._written[p])) for p in paths if p in self._written)
        found = [(p, size_of[p]) for p in paths
                 if p not in self._gone and size_of.get(p) is not None]
        if not self.dry_run:
            self.inner.delete(paths)
        else:
            for p in paths:
                self._gone.add(p)
                self._written.pop(p, None)
        self.deleted.extend(p for p, _ in found)
        self.deleted_bytes += sum(n for _, n in found)
        if found and self.progress is not None:
            self.progress(len(self.deleted), None, self.deleted_bytes, unit="files deleted")

    def list_dir(self, path: str) -> list[str]:
        listed = {p for p in self.inner.list_dir(path) if p not in self._gone}
        listed |= {p for p in self._written if p.startswith(path.rstrip("/") + "/")}
        return sorted(listed)


def run_gc(store: DurableStore, op: str, num_retained: int, *, dry_run: bool = True,
           progress: ProgressFn | None = None) -> tuple[list[str], list[int]]:
    """Apply retention and garbage collection as the coordinator does (``dry_run``: only
    compute what it would delete now, changing nothing; ``progress``: see
    :class:`RecordingStore`; how much there is to do is not known in advance).

    It runs the coordinator itself (its rebuild finishes pending work and collects), so
    the answer is the coordinator's, not a re-implementation of it.

    Returns
    -------
    tuple of (list of str, list of int)
        Paths (relative to the store root) deleted, and the checkpoints dropped.
    """
    from .coordinator import CheckpointCoordinator

    records = _records(store, op)
    if not records:
        raise CheckpointNotFoundError(f"operator {op!r} has no completed checkpoint under "
                                      f"{store.root}")
    latest = records[max(records)]
    rec = RecordingStore(store, dry_run=dry_run, progress=progress)
    coord = CheckpointCoordinator(rec, op, parallelism=latest.parallelism,
                                  max_parallelism=latest.max_parallelism,
                                  num_retained=num_retained)
    coord.collect_garbage()  # idempotent: a second pass finds what the first one unblocked
    coord.close()
    dropped = sorted(set(records) - set(_records(rec, op)))
    return sorted(set(rec.deleted)), dropped


# --- commands ---------------------------------------------------------------------------


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


def _open(args: argparse.Namespace) -> DurableStore:
    from .options import check_location
    from .storage import open_store

    check_location(args.url, "URL")  # an unknown protocol is bad usage (exit 2)
    opts = _storage_options(args.storage_options)
    try:
        return open_store(args.url, storage_options=opts)
    except TypeError as exc:  # the filesystem's constructor refuses an option
        raise OptionsError("--storage-options", "<redacted>",
                           f"the filesystem of {args.url} refuses these storage options "
                           f"({exc})") from None


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    store = _open(args)
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


def cmd_describe(args: argparse.Namespace, out: TextIO) -> int:
    store = _open(args)
    op = args.operator
    record = _record(store, op, args.checkpoint)
    manifests = _manifests(store, op, record)
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
                            "restore": str(restore).split(".")[-1].lower(),
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
                     d["restore"], m.attempt])
    states = {d.name: d for m in manifests.values() for d in m.states}
    if args.json:
        out.write(json.dumps({"operator_id": op, "checkpoint_id": record.checkpoint_id,
                              "parallelism": record.parallelism,
                              "max_parallelism": record.max_parallelism,
                              "created_at_ms": record.created_at_ms,
                              "full_size": record.full_size,
                              "incremental_size": record.incremental_size,
                              "states": [vars(s) for s in states.values()],
                              "partitions": parts}, default=str) + "\n")
        return EXIT_OK
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
                  "keys", "restore", "attempt"], out)
    if args.files:
        out.write("\n")
        _table([[d["partition"], f["name"], f["size"], "shared" if f["shared"] else "private",
                 "uploaded" if f["uploaded"] else "reused", f["path"]]
                for d in parts for f in d["file_list"]],
               ["partition", "file", "bytes", "kind", "", "path"], out)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    store = _open(args)
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


def cmd_gc(args: argparse.Namespace, out: TextIO) -> int:
    store = _open(args)
    op = args.operator
    with _progress(args, "gc", "files read") as bar:
        paths, dropped = run_gc(store, op, args.num_retained, dry_run=args.dry_run,
                                progress=bar)
    if args.json:
        out.write(json.dumps({"dry_run": args.dry_run, "checkpoints": dropped,
                              "files": paths}) + "\n")
        return EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    out.write(f"{verb} {len(paths)} file(s); checkpoints dropped by retention "
              f"(num_retained={args.num_retained}): {dropped or 'none'}\n")
    for p in paths:
        out.write(f"  {p}\n")
    return EXIT_OK


def cmd_read(args: argparse.Namespace, out: TextIO) -> int:
    from .spark.read_state import load_checkpoint, read_rows, rows_to_pandas

    fmt = args.format or ("csv" if args.output == "-" or args.output.endswith(".csv")
                          else "parquet")
    if fmt == "parquet" and args.output == "-":  # bad usage: say so before reading anything
        raise OptionsError("--output", "-", "Parquet cannot go to standard output; give a "
                                            "file name or use --format csv")
    store = _open(args)
    op = args.operator
    key_types = args.key_types.split(",") if args.key_types else None
    view = load_checkpoint(store, op, args.checkpoint, key_types=key_types)
    parts = args.partition if args.partition else None
    with _progress(args, "read", "partitions") as bar:
        rows = list(read_rows(store, op, state_name=args.state, partitions=parts,
                              view=view, progress=bar))
    frame = rows_to_pandas(rows, view, args.state)
    if fmt == "csv":
        frame.to_csv(out if args.output == "-" else args.output, index=False)
    else:
        frame.to_parquet(args.output, index=False)
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
    from .spark.changes import change_rows, changes_to_pandas, plan_changes

    store = _open(args)
    key_types = args.key_types.split(",") if args.key_types else None
    plan = plan_changes(store, args.operator, args.from_id, args.to_id, key_types=key_types)
    with _progress(args, "changes", "partitions") as bar:
        rows = list(change_rows(store, args.operator, args.from_id, args.to_id, args.state,
                                partitions=args.partition or None, plan=plan, progress=bar))
    frame = changes_to_pandas(rows, plan, args.state)
    fmt = args.format or ("csv" if args.output == "-" or args.output.endswith(".csv")
                          else "parquet")
    if fmt == "csv":
        frame.to_csv(out if args.output == "-" else args.output, index=False)
        if args.output == "-":
            return EXIT_OK
    elif args.output == "-":
        raise StateBackendError("Parquet cannot go to standard output; give a file name "
                                "or use --format csv")
    else:
        frame.to_parquet(args.output, index=False)
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


def cmd_metrics(args: argparse.Namespace, out: TextIO) -> int:
    from .metrics import read_metrics

    store = _open(args)
    lines = read_metrics(store, args.operator, partitions=args.partitions)
    if not lines:
        raise CheckpointNotFoundError(f"no metrics recorded for operator {args.operator!r} "
                                      f"under {store.root}")
    for line in lines[-args.last:] if args.last else lines:
        out.write(json.dumps(line, sort_keys=True) + "\n")
    return EXIT_OK


def cmd_savepoint(args: argparse.Namespace, out: TextIO) -> int:
    from .savepoint.writer import create_savepoint, savepoint_dir

    store = _open(args)
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
    from .savepoint.migrate import migrate_savepoint
    from .savepoint.writer import savepoint_dir

    for flag, value in (("--max-parallelism", args.max_parallelism),
                        ("--parallelism", args.parallelism)):
        if value is not None and value < 1:
            sys.stderr.write(f"statebackend: {flag} must be at least 1, got {value}\n")
            return EXIT_USAGE
    store = _open(args)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="statebackend", description="Inspect, verify, garbage-collect and read the "
        "checkpoints of a statebackend RocksDB state location (no Spark needed).",
        epilog="exit codes: 0 ok, 1 problems found (verify, or a damaged checkpoint), 2 bad "
        "usage, 3 no such operator, checkpoint, state or partition (or no state at the URL), "
        "4 storage failure, 130 interrupted",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser, operator: str = "required") -> None:
        p.add_argument("url", metavar="URL", help="the backend's checkpoint_location")
        if operator == "optional":
            p.add_argument("operator", metavar="OPERATOR", nargs="?", default=None,
                           help="operator id (omit to list operators)")
        else:
            p.add_argument("operator", metavar="OPERATOR", help="operator id")
        p.add_argument("--storage-options", metavar="JSON",
                       help="fsspec options as JSON, e.g. '{\"anon\": false}'")
        p.add_argument("--json", action="store_true",
                       help="machine-readable output (one JSON document; metrics: JSON lines)")
        p.add_argument("-q", "--quiet", "--no-progress", dest="quiet", action="store_true",
                       help="no progress line on stderr (shown only when stderr is a "
                            "terminal anyway)")

    def checkpoint_arg(p: argparse.ArgumentParser, what: str) -> None:
        p.add_argument("checkpoint", metavar="ID", nargs="?", type=_count(0), default=None,
                       help=what)

    p = sub.add_parser("list", help="operators, or the retained checkpoints of one")
    common(p, "optional")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("describe", help="partitions, files, shared and private bytes")
    common(p)
    checkpoint_arg(p, "checkpoint id (default: the latest)")
    p.add_argument("--files", action="store_true", help="also list every file")
    p.set_defaults(func=cmd_describe)

    p = sub.add_parser("verify", help="check what a restore checks: records against "
                       "manifests, every file's size and CRC32, RocksDB's file set, changelogs")
    common(p)
    checkpoint_arg(p, "checkpoint id (default: every retained checkpoint)")
    p.add_argument("--size-only", action="store_true", help="skip reading files for checksums")
    p.add_argument("--deep", action="store_true",
                   help="also download each partition, open it with RocksDB, replay its "
                        "changelogs and read every entry back (costs a full download)")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("gc", help="delete what retention drops (--dry-run: only show it)")
    common(p)
    p.add_argument("--dry-run", action="store_true", help="show, delete nothing")
    p.add_argument("--num-retained", type=_count(1), default=3, metavar="N",
                   help="completed checkpoints to keep (the job's num_retained; default 3)")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("read", help="dump state to Parquet or CSV")
    common(p)
    p.add_argument("--checkpoint", type=_count(0), default=None, help="default: the latest")
    p.add_argument("--state", default=None,
                   help="one state (typed columns); default every state, values as JSON")
    p.add_argument("--partition", type=_count(0), action="append",
                   help="only this partition (repeatable)")
    p.add_argument("-o", "--output", required=True,
                   help="file to write (.parquet or .csv), or - for CSV on stdout")
    p.add_argument("--format", choices=["parquet", "csv"], default=None)
    p.add_argument("--key-types", default=None,
                   help="grouping-key types, comma separated, if the checkpoint lacks them")
    p.set_defaults(func=cmd_read)

    p = sub.add_parser("changes", help="rows put and deleted between two checkpoints")
    common(p)
    p.add_argument("--from", dest="from_id", type=int, required=True, metavar="A",
                   help="the older retained checkpoint")
    p.add_argument("--to", dest="to_id", type=int, required=True, metavar="B",
                   help="the newer retained checkpoint")
    p.add_argument("--state", default=None,
                   help="one state (typed columns); default every state, values as JSON")
    p.add_argument("--partition", type=int, action="append",
                   help="only this partition of B (repeatable)")
    p.add_argument("-o", "--output", required=True,
                   help="file to write (.parquet or .csv), or - for CSV on stdout")
    p.add_argument("--format", choices=["parquet", "csv"], default=None)
    p.add_argument("--key-types", default=None,
                   help="grouping-key types, comma separated, if the checkpoints lack them")
    p.set_defaults(func=cmd_changes)

    p = sub.add_parser("savepoint", help="write a self-contained savepoint of a checkpoint")
    common(p)
    p.add_argument("--name", default=None, help="default: sp-<checkpoint>-<ms>")
    p.add_argument("--checkpoint", type=_count(0), default=None, help="default: the latest")
    p.add_argument("--compression", choices=["snappy", "none"], default="snappy")
    p.set_defaults(func=cmd_savepoint)

    p = sub.add_parser("migrate-savepoint",
                       help="rewrite a savepoint for another max_parallelism (a new savepoint)")
    common(p)
    p.add_argument("name", metavar="NAME", help="the savepoint to read")
    p.add_argument("new_name", metavar="NEW_NAME", help="the savepoint to write (must not exist)")
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

    p = sub.add_parser("metrics", help="per-checkpoint metrics recorded beside the checkpoints")
    common(p)
    p.add_argument("--partitions", action="store_true", help="also per-partition lines")
    p.add_argument("--last", type=_count(0), default=0, metavar="N",
                   help="only the last N (0: all)")
    p.set_defaults(func=cmd_metrics)
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

    def fail(code: int, text: str) -> int:
        sys.stderr.write(redact_text(f"statebackend: {text}", args.url) + "\n")
        return code

    try:
        return int(args.func(args, out))
    except OptionsError as exc:  # bad usage found after parsing: protocol, JSON, values
        return fail(EXIT_USAGE, str(exc))
    except (CheckpointNotFoundError, StateError) as exc:  # no such operator, checkpoint,
        return fail(EXIT_NOT_FOUND, str(exc))               # state or partition
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
