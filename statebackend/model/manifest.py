"""Pure models of what a checkpoint is made of: file entries, partition manifests and
completed-checkpoint records, plus the durable layout that names them.

No IO happens here: these are immutable values with (de)serialisation to JSON. Reading and
writing them is :mod:`statebackend.storage`'s job.

Durable layout under ``<root>/<operator_id>/`` (every name is unique to one attempt, so no
file is ever overwritten; invariant 2)::

    chk-<n>/p<partition>/<attempt>/<file>        files uploaded by that attempt
    chk-<n>/p<partition>/<attempt>/_MANIFEST.json the partition manifest, published last
    _checkpoints/chk-<n>.json                    completed-checkpoint record (coordinator)

In changelog mode (``mode="changelog"``) an attempt uploads one changelog,
``changelog-<n>.sbcl``; when it also materializes, a background thread later uploads the
snapshot's files as ``m-<file>`` and publishes ``_MATERIALIZED.json`` (a manifest of mode
``materialization``) in the same attempt directory. A changelog manifest's ``files`` are
its base materialization's files plus the ordered changelogs after it; which partition's
directory each changelog must be in is :mod:`.changelog_sources`' rule.

A file uploaded by checkpoint n keeps its path when later checkpoints reuse it, so a
bounded sweep of one checkpoint's or one attempt's directory finds every file it created.
"""

from __future__ import annotations

import json
import posixpath
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import CorruptStateError, FormatVersionError, UnsafePathError
from .changelog_sources import (  # noqa: F401 - re-exported: the names belong to manifests
    ChangelogSource,
    changelog_id,
    changelog_name,
    checked_sources,
    foreign,
    foreign_legacy,
    is_changelog_name,
)
from .changelog_sources import changelog_home as _changelog_home
from .changelog_sources import misplaced as _misplaced
from .latest import (  # noqa: F401 - re-exported: the pointer lives beside the records
    LATEST_PATH,
    LatestPointer,
    WriterStamp,
    _opt_str,
    latest_pointer,
    parse_latest,
    parse_latest_pointer,
)
from .slice_ref import SliceRef, is_slice_name, slice_from_dict  # noqa: F401  (is_slice_name: importable from here)

# Format of manifests and completed-checkpoint records. 2: the readers stopped accepting the
# pre-release layouts that format 1 files may hold (records without manifest digests, state
# values without schema ids, changelogs without their span); a format-1 file is refused
# with FormatVersionError (docs/formats.md, "Format versions").
FORMAT_VERSION = 2
MANIFEST_NAME = "_MANIFEST.json"
MATERIALIZED_NAME = "_MATERIALIZED.json"
MATERIALIZED_PREFIX = "m-"
MODES = ("incremental", "changelog", "materialization")
CHECKPOINTS_DIR = "_checkpoints"
INITIAL_STATE_DIR = "_initial"
"""Under the operator root: an initial state staged for a query's first run
(:mod:`statebackend.task.initial_state`); the owner's first collection after a completed
checkpoint deletes it (a checkpoint exists, so no later run applies it)."""

_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9._=-]+$")


def checkpoint_dir(checkpoint_id: int) -> str:
    return f"chk-{checkpoint_id}"


def attempt_dir(checkpoint_id: int, partition: int, attempt: str) -> str:
    """Directory (relative to the operator root) of one attempt's uploads."""
    check_component(attempt)
    return f"{checkpoint_dir(checkpoint_id)}/p{partition}/{attempt}"


def manifest_path(checkpoint_id: int, partition: int, attempt: str) -> str:
    return f"{attempt_dir(checkpoint_id, partition, attempt)}/{MANIFEST_NAME}"


def manifests_by_partition(listing: Iterable[str]) -> dict[int, list[str]]:
    """Manifest paths (``chk-<n>/p<p>/<attempt>/_MANIFEST.json``) of a listing, by partition."""
    out: dict[int, list[str]] = {}
    for rel in listing:
        parts = rel.split("/")
        if len(parts) == 4 and parts[3] == MANIFEST_NAME and parts[1][:1] == "p" \
                and parts[1][1:].isdigit():
            out.setdefault(int(parts[1][1:]), []).append(rel)
    return out


def materialized_path(checkpoint_id: int, partition: int, attempt: str) -> str:
    """Where the background materialization of one attempt publishes its manifest."""
    return f"{attempt_dir(checkpoint_id, partition, attempt)}/{MATERIALIZED_NAME}"


def completed_record_path(checkpoint_id: int) -> str:
    return f"{CHECKPOINTS_DIR}/{checkpoint_dir(checkpoint_id)}.json"


def check_component(name: str) -> str:
    """A single path component made only of safe characters (no '/', no '..')."""
    if not _SAFE_COMPONENT.match(name) or name in (".", ".."):
        raise UnsafePathError(f"unsafe path component {name!r}: expected letters, digits, '._=-'")
    return name


def check_relative(path: str) -> str:
    """A relative POSIX path that stays under the root (invariant: no escape)."""
    if not path or path.startswith("/") or "\\" in path or ":" in path.split("/")[0]:
        raise UnsafePathError(f"path {path!r} is not relative to the checkpoint root")
    norm = posixpath.normpath(path)
    if norm.startswith("..") or norm != path:
        raise UnsafePathError(f"path {path!r} escapes or is not normalised under the checkpoint root")
    for part in norm.split("/"):
        check_component(part)
    return path


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint.

    Attributes
    ----------
    name : str
        Name inside the RocksDB directory (``000012.sst``, ``CURRENT``, ...).
    path : str
        Durable path relative to the operator root (``chk-3/p0/<attempt>/000012.sst``).
    size : int
        Bytes.
    checksum : str
        ``crc32:<8 hex digits>`` of the content.
    shared : bool
        True for SST files (immutable, reusable by later checkpoints); False for private
        files (MANIFEST, CURRENT, OPTIONS, WAL, metadata) uploaded by every checkpoint.
    uploaded : bool
        True when this checkpoint uploaded it, False when reused from the base checkpoint.
    """

    name: str
    path: str
    size: int
    checksum: str
    shared: bool
    uploaded: bool

    def __post_init__(self) -> None:
        check_component(self.name)
        check_relative(self.path)


@dataclass(frozen=True)
class StateDescriptor:
    """A declared state: its name, kind, schemas (DDL strings) and TTL.

    ``blocks`` is set for kind ``blocks`` only: the number of value blocks per key group
    (see :class:`statebackend.state.value.BlockState`).

    ``schema_id`` is the id of the current schema version (``value_schema`` with or
    without a TTL), which every value written under it starts with; ``history`` holds
    the earlier versions as ``(id, value_schema, has_ttl)``, sorted by id (see
    :mod:`statebackend.state.evolution`). Only ``timers`` has no ``schema_id``.
    """

    name: str
    kind: str  # value | list | map | reducing | aggregating | blocks | timers
    value_schema: str | None = None
    user_key_schema: str | None = None
    ttl_ms: int | None = None
    blocks: int | None = None
    schema_id: int | None = None
    history: tuple[tuple[int, str, bool], ...] = ()

    def __post_init__(self) -> None:
        # JSON gives lists: keep the descriptor hashable and equal to the one written.
        if self.history.__class__ is not tuple or any(
                h.__class__ is not tuple for h in self.history):
            object.__setattr__(self, "history", tuple(
                (int(h[0]), str(h[1]), bool(h[2])) for h in self.history))


@dataclass(frozen=True)
class MaterializationRef:
    """A materialization: the snapshot attempt ``attempt`` of batch ``checkpoint_id`` took."""

    checkpoint_id: int
    attempt: str

    def __post_init__(self) -> None:
        check_component(self.attempt)

    def path(self, partition: int) -> str:
        return materialized_path(self.checkpoint_id, partition, self.attempt)


def _ref(d: Any) -> MaterializationRef | None:
    return None if d is None else MaterializationRef(int(d["checkpoint_id"]), str(d["attempt"]))


@dataclass(frozen=True)
class CarriedFrom:
    """The published attempt whose state a carried-over manifest holds
    (:mod:`statebackend.model.carry`): ``attempt`` of checkpoint ``checkpoint_id`` of the
    same partition."""

    checkpoint_id: int
    attempt: str

    def __post_init__(self) -> None:
        check_component(self.attempt)


def _carried(d: Any) -> CarriedFrom | None:
    return None if d is None else CarriedFrom(int(d["checkpoint_id"]), str(d["attempt"]))


@dataclass(frozen=True)
class PartitionManifest:
    """What one attempt of checkpoint ``checkpoint_id`` of one partition published.

    ``mode`` says how to read ``files``:

    * ``incremental``: the files of this checkpoint's own RocksDB snapshot;
    * ``changelog``: the files of the snapshot ``materialization`` (none when no
      materialization exists yet), plus the changelogs of every batch after it up to this
      one (:attr:`changelog_files`, in batch order); ``pending_materialization`` names a
      snapshot being uploaded in the background, adopted by a later checkpoint once its
      ``_MATERIALIZED.json`` is published;
    * ``materialization``: a snapshot published in the background (``_MATERIALIZED.json``).
    """

    operator_id: str
    partition: int
    checkpoint_id: int
    attempt: str
    key_group_start: int
    key_group_end: int  # inclusive
    max_parallelism: int
    files: tuple[FileEntry, ...]
    base_checkpoint_id: int | None = None
    states: tuple[StateDescriptor, ...] = ()
    metrics: Mapping[str, Any] = field(default_factory=dict)
    created_at_ms: int = 0
    format_version: int = FORMAT_VERSION
    mode: str = "incremental"
    materialization: MaterializationRef | None = None
    pending_materialization: MaterializationRef | None = None
    # the writer epoch (statebackend.checkpoint.fencing) its task published under, and the
    # query it ran for (None: a batch run); None: written without fencing
    writer_epoch: int | None = None
    writer_query: str | None = None
    # Correctness data, not metrics: how readers of the state (read_state, savepoints,
    # the CLI) decode grouping keys, the partition's running max event time and the
    # watermark its batch ran with (the next batches' watermarks derive from them)
    key_columns: tuple[str, ...] = ()
    key_types: tuple[str, ...] = ()
    max_event_time_ms: int | None = None
    watermark_ms: int | None = None
    # The carrier plan (statebackend.model.carry): this checkpoint of a partition that ran
    # no task in its micro-batch holds exactly the state of ``carried_from``, with the same
    # files; ``never_ran``: the empty state of a partition that has not run yet (its first
    # task still starts as a first batch, initial state applies)
    carried_from: CarriedFrom | None = None
    never_ran: bool = False
    # Rolling slices (changelog mode with ``rolling_slices``): units that replace the base
    # materialization's entries for their key groups; see
    # :mod:`statebackend.checkpoint.slices`. Their files are in ``files``
    # (:attr:`slice_files`); the changelogs apply to a key group only after its unit.
    slices: tuple[SliceRef, ...] = ()
    # the streaming plan its task ran in ("shuffle" or "carrier"; statebackend.spark.
    # placement): a restart under placement="auto" keeps it. None: a batch run, a
    # materialization, or a version that did not record it
    placement: str | None = None
    # changelog mode: where the lineage's changelogs from before its partition's own are
    # (statebackend.model.changelog_sources): ``(partition, through)`` segments, ordered,
    # the changelogs after the last one in ``p<partition>``. Empty: every changelog is
    # this partition's; None: not changelog mode, or a manifest written before the field
    # existed (:meth:`foreign_changelogs` then applies its older, weaker rule)
    changelog_sources: tuple[ChangelogSource, ...] | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"manifest mode {self.mode!r} is not one of {MODES}")
        check_placement(self.placement, "manifest")
        if self.changelog_sources is not None:
            # JSON gives lists: keep the manifest equal to the one written
            object.__setattr__(self, "changelog_sources",
                               checked_sources(self.changelog_sources))

    # --- derived ----------------------------------------------------------------------

    @property
    def full_size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def incremental_size(self) -> int:
        return sum(f.size for f in self.files if f.uploaded)

    @property
    def path(self) -> str:
        if self.mode == "materialization":
            return materialized_path(self.checkpoint_id, self.partition, self.attempt)
        return manifest_path(self.checkpoint_id, self.partition, self.attempt)

    @property
    def db_files(self) -> tuple[FileEntry, ...]:
        """The RocksDB snapshot's files (everything but changelogs and slices)."""
        return tuple(f for f in self.files
                     if not is_changelog_name(f.name) and not is_slice_name(f.name))

    @property
    def slice_files(self) -> dict[str, FileEntry]:
        """Name -> entry of the files of :attr:`slices`."""
        return {f.name: f for f in self.files if is_slice_name(f.name)}

    @property
    def changelog_files(self) -> tuple[FileEntry, ...]:
        """The changelogs to replay onto :attr:`db_files`, in batch order."""
        return tuple(sorted((f for f in self.files if is_changelog_name(f.name)),
                            key=lambda f: f.name))

    @property
    def materialized_id(self) -> int | None:
        """The batch whose state :attr:`db_files` hold (None: no snapshot, empty base)."""
        if self.mode == "changelog":
            return None if self.materialization is None else self.materialization.checkpoint_id
        return self.checkpoint_id

    @property
    def snapshot_ref(self) -> MaterializationRef | None:
        """Which local copy directory (``chk-<n>-<attempt>``) holds :attr:`db_files`."""
        if self.mode == "changelog":
            return self.materialization
        return MaterializationRef(self.checkpoint_id, self.attempt)

    def foreign_changelogs(self) -> tuple[FileEntry, ...]:
        """Changelogs that cannot belong to this partition's lineage, in batch order.

        A changelog is replayed onto the state of the partition that wrote it. With
        :attr:`changelog_sources` recorded, each changelog must be at
        :meth:`changelog_home` of its batch (its checkpoint's directory of the partition
        whose segment holds the batch, this partition's own after the last segment);
        every one that is not is returned. A manifest without them (written before they
        existed) keeps the older rule (:func:`~.changelog_sources.foreign_legacy`): only
        a last changelog in another partition's directory is seen.
        """
        if self.changelog_sources is None:
            return foreign_legacy(self.changelog_files, self.db_files, self.partition)
        return foreign(self.changelog_files, self.partition, self.changelog_sources)

    def changelog_home(self, batch: int) -> str | None:
        """The directory (``chk-<batch>/p<q>/``) its lineage wrote the changelog of
        ``batch`` in (None: no :attr:`changelog_sources` recorded, so not known)."""
        if self.changelog_sources is None:
            return None
        return _changelog_home(self.changelog_sources, self.partition, batch)

    def misplaced(self, f: FileEntry) -> str:
        """What is wrong with ``f``, one of :meth:`foreign_changelogs` (for messages)."""
        return _misplaced(f, self.partition, self.changelog_sources)

    def shared_files(self) -> dict[str, FileEntry]:
        """SST name -> entry, for the next checkpoint's reuse decisions."""
        return {f.name: f for f in self.db_files if f.shared}

    def with_metrics(self, **metrics: Any) -> PartitionManifest:
        return replace(self, metrics={**self.metrics, **metrics})

    # --- (de)serialisation -------------------------------------------------------------

    def to_json(self) -> str:
        d = asdict(self)
        d["full_size"] = self.full_size
        d["incremental_size"] = self.incremental_size
        d["metrics"] = dict(self.metrics)
        for k in ("slices", "placement", "writer_query"):
            if not d[k]:
                del d[k]  # manifests without them read as they always did
        if d["changelog_sources"] is None:
            del d["changelog_sources"]  # empty is written: it says "all this partition's"
        return json.dumps(d, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "<manifest>") -> PartitionManifest:
        try:
            d = json.loads(text)
            _check_format(d, "manifest", where)
            d.pop("full_size", None)
            d.pop("incremental_size", None)
            d["files"] = tuple(FileEntry(**f) for f in d["files"])
            d["states"] = tuple(StateDescriptor(**s) for s in d.get("states", ()))
            d["materialization"] = _ref(d.get("materialization"))
            d["pending_materialization"] = _ref(d.get("pending_materialization"))
            d["carried_from"] = _carried(d.get("carried_from"))
            d["key_columns"] = tuple(d.get("key_columns", ()))
            d["key_types"] = tuple(d.get("key_types", ()))
            d["slices"] = tuple(slice_from_dict(x) for x in d.get("slices", ()))
            return cls(**d)
        except (CorruptStateError, FormatVersionError):
            raise
        except UnsafePathError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptStateError(f"{where}: manifest is truncated or malformed ({exc})",
                                    path=where) from exc


@dataclass(frozen=True)
class CompletedCheckpoint:
    """The coordinator's record that checkpoint ``checkpoint_id`` of an operator is complete.

    ``manifests`` maps each partition to the durable path (relative to the operator root)
    of the manifest chosen for it. ``committed`` says whether Spark was known to have
    committed the micro-batch when the record was written.
    """

    operator_id: str
    checkpoint_id: int
    parallelism: int
    max_parallelism: int
    manifests: Mapping[int, str]
    full_size: int = 0
    incremental_size: int = 0
    created_at_ms: int = 0
    format_version: int = FORMAT_VERSION
    # False: completed from the published attempts alone (planning a restart, a query's
    # termination, the supervisor) without knowing that Spark committed the micro-batch.
    # Spark may run it again from the state before it, so retention keeps that state too
    # until a newer checkpoint completes (see registry.SharedStateRegistry.retained_ids).
    committed: bool = True
    # partition -> "<bytes>:crc32:<hex>" of the manifest chosen for it, as the coordinator
    # read it: a reader checks the manifest it gets against it (empty: not recorded)
    manifest_digests: Mapping[int, str] = field(default_factory=dict)
    # the writer that completed it (statebackend.checkpoint.fencing): its epoch, query id
    # and run id; None in records written without fencing or by older versions
    writer_epoch: int | None = None
    writer_query: str | None = None
    writer_run: str | None = None
    # the retention its writer applied: a coordinator acting for no run in particular
    # (a planning, a manual call) never applies less to the owner's location
    num_retained: int | None = None
    # the streaming plan of its partitions' tasks (their manifests' ``placement``); None:
    # not recorded (a batch run, a version before it was recorded, mixed manifests)
    placement: str | None = None

    @property
    def writer(self) -> WriterStamp | None:
        if self.writer_epoch is None:
            return None
        return WriterStamp(self.writer_epoch, self.writer_query, self.writer_run)

    def __post_init__(self) -> None:
        try:
            check_placement(self.placement, "record")
        except ValueError as exc:
            raise CorruptStateError(f"{self.path}: {exc}", path=self.path,
                                    checkpoint_id=self.checkpoint_id) from None
        # the chosen manifests tile the key-group space: one per partition 0..P-1, each
        # published for this very checkpoint and partition (ranges are checked on read)
        if sorted(self.manifests) != list(range(self.parallelism)):
            raise CorruptStateError(
                f"{self.path}: record of checkpoint {self.checkpoint_id} names partitions "
                f"{sorted(self.manifests)}, expected 0..{self.parallelism - 1}",
                path=self.path, checkpoint_id=self.checkpoint_id)
        for p, rel in self.manifests.items():
            prefix = f"{checkpoint_dir(self.checkpoint_id)}/p{p}/"
            if not rel.startswith(prefix) or rel.count("/") != 3 \
                    or not rel.endswith("/" + MANIFEST_NAME):
                raise CorruptStateError(
                    f"{self.path}: record of checkpoint {self.checkpoint_id} names {rel} for "
                    f"partition {p}, which is not a manifest of that checkpoint and partition "
                    f"({prefix}<attempt>/{MANIFEST_NAME})", path=self.path, partition=p,
                    checkpoint_id=self.checkpoint_id)

    def check_manifest(self, partition: int, manifest: PartitionManifest, raw: bytes,
                       where: str) -> None:
        """Check the manifest read for ``partition`` (``raw``: its bytes) against this
        record: the digest recorded for it, and the checkpoint, partition, operator and
        key-group range it describes.

        Raises
        ------
        CorruptStateError
            Naming the manifest's path.
        """
        def bad(what: str) -> CorruptStateError:
            return CorruptStateError(
                f"{where}: {what}; the record {self.path} of checkpoint "
                f"{self.checkpoint_id} names it for partition {partition}, so the store was "
                f"changed after completion: restore from another retained checkpoint",
                checkpoint_id=self.checkpoint_id, partition=partition, path=where)

        digest = self.manifest_digests.get(partition)
        if digest is not None and digest != manifest_digest(raw):
            raise bad(f"manifest is {manifest_digest(raw)}, its record says {digest}")
        if (manifest.checkpoint_id, manifest.partition) != (self.checkpoint_id, partition):
            raise bad(f"manifest describes checkpoint {manifest.checkpoint_id} partition "
                      f"{manifest.partition}")
        if manifest.operator_id != self.operator_id:
            raise bad(f"manifest belongs to operator {manifest.operator_id!r}")
        want = _kg_range(partition, self.parallelism, self.max_parallelism)
        got = (manifest.key_group_start, manifest.key_group_end)
        if manifest.max_parallelism != self.max_parallelism or got != want:
            raise bad(f"manifest covers key groups {got[0]}-{got[1]} of "
                      f"{manifest.max_parallelism}, partition {partition} of "
                      f"{self.parallelism} owns {want[0]}-{want[1]} of "
                      f"{self.max_parallelism}")

    @property
    def path(self) -> str:
        return completed_record_path(self.checkpoint_id)

    def to_json(self) -> str:
        d = asdict(self)
        d["manifests"] = {str(k): v for k, v in sorted(self.manifests.items())}
        d["manifest_digests"] = {str(k): v for k, v in sorted(self.manifest_digests.items())}
        if self.writer_epoch is None:  # unfenced: the bytes older versions wrote
            for k in ("writer_epoch", "writer_query", "writer_run"):
                d.pop(k)
        for k in ("num_retained", "placement"):
            if d[k] is None:
                d.pop(k)
        return json.dumps(d, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "<record>") -> CompletedCheckpoint:
        try:
            d = json.loads(text)
            _check_format(d, "completed-checkpoint record", where)
            d["manifests"] = {int(k): check_relative(v) for k, v in d["manifests"].items()}
            d["manifest_digests"] = {int(k): str(v) for k, v in d["manifest_digests"].items()}
            for k in ("writer_epoch", "num_retained"):
                if d.get(k) is not None:
                    d[k] = int(d[k])
            for k in ("writer_query", "writer_run", "placement"):
                d[k] = _opt_str(d.get(k))
            return cls(**d)
        except (CorruptStateError, FormatVersionError):
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptStateError(f"{where}: completed-checkpoint record is truncated or "
                                    f"malformed ({exc})", path=where) from exc


PLANS = ("shuffle", "carrier")
"""The streaming plans a manifest or record may name as its ``placement``."""


def check_placement(value: Any, what: str) -> None:
    if value is not None and value not in PLANS:
        raise ValueError(f"{what} placement {value!r} is not one of {PLANS}")


def _check_format(d: Any, what: str, where: str) -> None:
    version = d.get("format_version") if isinstance(d, dict) else None
    if version == FORMAT_VERSION:
        return
    if isinstance(version, int) and 0 < version < FORMAT_VERSION:
        raise FormatVersionError(where, what, version, FORMAT_VERSION)
    raise CorruptStateError(f"{where}: {what} format {version!r} is not supported (this "
                            f"version reads {FORMAT_VERSION})", path=where)


def manifest_digest(raw: bytes) -> str:
    """``<bytes>:crc32:<hex>`` of a manifest's bytes, as records keep it."""
    return f"{len(raw)}:crc32:{zlib.crc32(raw) & 0xFFFFFFFF:08x}"


def _kg_range(partition: int, parallelism: int, max_parallelism: int) -> tuple[int, int]:
    # keygroups.key_group_range's rule, restated on plain ints (this module imports nothing
    # of the project but errors): p owns [ceil(p*M/P), ceil((p+1)*M/P) - 1]
    start = -(-partition * max_parallelism // parallelism)
    end = -(-(partition + 1) * max_parallelism // parallelism) - 1
    return start, end


def choose_manifest(candidates: list[PartitionManifest]) -> PartitionManifest:
    """The deterministic choice among several published attempts of one (checkpoint, partition).

    Every reader (the coordinator completing a checkpoint, a task restoring before the record
    exists) applies the same rule: among the attempts of the newest writer epoch (a run
    that took the location over re-ran the batch: its attempts win over a fenced run's),
    the one whose name sorts first. For deterministic user functions all attempts hold the
    same logical state, so the choice only decides which files are referenced; the others
    become failed attempts.
    """
    if not candidates:
        raise ValueError("choose_manifest needs at least one candidate")
    return min(candidates, key=lambda m: (-(m.writer_epoch or 0), m.attempt))
