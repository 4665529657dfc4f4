"""One writer per state location: writer epochs taken by compare-and-set on the store.

Every run of a query that writes an operator's state holds an *epoch*: the file
``<operator root>/_writers/epoch-<k>.json`` it created with the store's atomic
create-if-absent (:meth:`~statebackend.storage.base.DurableStore.create_exclusive`: a hard
link locally, ``If-None-Match: *`` on S3). The owner of the location is the writer of the
highest epoch (in these files or in the state, below). Epochs are taken in order, above
every epoch seen, so "a newer writer exists" is one listing of ``_writers/`` (and one read
of ``LATEST.json``, for a newer writer whose file is gone).

Who takes an epoch, and when
----------------------------
The first task of a run (Spark's run id: the job group of a streaming query's jobs; a
driver-made id for a batch DataFrame) claims it, before it restores anything:

* the newest epoch is its own run's: nothing to do (cached per worker process);
* its run held an older epoch: a newer run of the query took over, this run is a zombie:
  :class:`~statebackend.errors.WriterFencedError`, naming the newer writer;
* the newest epoch is another run of the *same* query (Spark's query id, which a restart
  keeps in the query's checkpoint): a restart (after a crash, or while the old driver still
  runs): it takes epoch ``k + 1``, fencing the older run;
* another query owns it: :class:`~statebackend.errors.StateLocationInUseError` at the
  query's start, before anything is written; the owner runs on undisturbed.

Every publication of a manifest, every completed-checkpoint record and every deletion then
proves that its writer still owns the location (:func:`check_owner`, a listing and a
read): a fenced writer is refused within one micro-batch, before it publishes or deletes
anything more.

Evidence in the state itself
----------------------------
The ``_writers/`` files are not the only proof: every completed-checkpoint record and
``_checkpoints/LATEST.json`` name the writer epoch, query id and run id they were written
under (:class:`~statebackend.model.manifest.WriterStamp`), and manifests their epoch. A
lifecycle rule, a cleanup script or a partial copy that loses epoch files therefore never
lets a fenced writer win: :func:`resolve_owner` takes the owner as the highest epoch seen
in the files *or* the state, a claim never reuses an epoch seen anywhere, a run the state
shows at an older epoch is fenced, and a run of another query is refused when the state
was written by another query. :func:`check_owner` lists ``_writers/`` (any newer epoch,
also past a missing middle one) and reads ``LATEST.json`` (a newer epoch whose file is
gone). :func:`writer_gaps` is what ``verify`` reports about ``_writers/``.

What it does not cover
----------------------
Object stores have no conditional delete, so a check and the deletion after it are two
requests: a writer fenced in between (milliseconds, against the seconds a new run takes
to restore and publish its first checkpoint) can still delete once. The new writer's first
completion rebuilds its registry from the records, and completion checks that every file
a new checkpoint references exists.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..errors import CorruptStateError, StateLocationInUseError, WriterFencedError
from ..model.manifest import (
    CHECKPOINTS_DIR,
    LATEST_PATH,
    CompletedCheckpoint,
    LatestPointer,
    PartitionManifest,
    WriterStamp,
    parse_latest,
)
from ..redact import redact_text
from ..storage.base import DurableStore
from ..storage.records import records_in

__all__ = ["WRITERS_DIR", "Evidence", "Owner", "WriterEpoch", "check_owner", "check_publisher",
           "claim", "epoch_path", "fenced_error", "held_before", "latest_writer",
           "list_epochs", "read_epoch", "read_evidence", "resolve_owner", "writer_gaps",
           "writer_history"]

WRITERS_DIR = "_writers"
_NAME = re.compile(r"^epoch-(\d{12})\.json$")
# Claims lost to a concurrent claimer before giving up (each loss means another writer
# took the epoch just then: re-evaluated from scratch).
_CLAIM_TRIES = 8


def epoch_path(epoch: int) -> str:
    """The file of writer epoch ``epoch``, relative to the operator root."""
    return f"{WRITERS_DIR}/epoch-{epoch:012d}.json"


@dataclass(frozen=True)
class WriterEpoch:
    """Who owns a state location from epoch ``epoch`` on.

    Attributes
    ----------
    epoch : int
        1, 2, ...; the highest is the owner.
    query_id : str or None
        Spark's query id (the same across restarts of one query); None for batch runs,
        which any later run may take over.
    run_id : str
        Spark's run id of that start of the query (a driver-made id for batch runs).
    created_at_ms : int
        When the epoch was taken.
    claimed_by : str
        ``host:pid`` of the process that took it (for messages).
    nonce : str
        Unique to the claim: a retried claim whose first try succeeded recognises itself.
    """

    epoch: int
    query_id: str | None
    run_id: str
    created_at_ms: int
    claimed_by: str
    nonce: str

    @property
    def path(self) -> str:
        return epoch_path(self.epoch)

    def describe(self) -> str:
        query = "a batch run" if self.query_id is None else f"query {self.query_id}"
        if not self.nonce:  # made from the state's evidence: no file, no time
            return (f"writer epoch {self.epoch} ({query}, run {self.run_id}, as the "
                    f"checkpoint records say; {self.claimed_by})")
        when = dt.datetime.fromtimestamp(self.created_at_ms / 1000, dt.timezone.utc)
        return (f"writer epoch {self.epoch} ({query}, run {self.run_id}, taken "
                f"{when:%Y-%m-%d %H:%M:%S}Z by {self.claimed_by})")

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @property
    def stamp(self) -> WriterStamp:
        """What records and ``LATEST.json`` written under this epoch carry."""
        return WriterStamp(self.epoch, self.query_id, self.run_id)

    @classmethod
    def from_stamp(cls, stamp: WriterStamp) -> WriterEpoch:
        """The owner as the state names it, when its epoch file is gone."""
        return cls(epoch=stamp.epoch, query_id=stamp.query_id, run_id=stamp.run_id or "?",
                   created_at_ms=0, claimed_by="(its _writers/ file is missing)", nonce="")

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> WriterEpoch:
        try:
            d = json.loads(raw)
            out = cls(epoch=int(d["epoch"]), query_id=d["query_id"], run_id=str(d["run_id"]),
                      created_at_ms=int(d["created_at_ms"]), claimed_by=str(d["claimed_by"]),
                      nonce=str(d["nonce"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptStateError(f"{where}: writer epoch file is malformed ({exc}); it "
                                    f"was written by compare-and-set and never changes, so "
                                    f"the store was edited", path=where) from exc
        if out.path != where:
            raise CorruptStateError(f"{where}: holds writer epoch {out.epoch}, which belongs "
                                    f"at {out.path}", path=where)
        return out


# Every function takes the store and ``prefix``: the operator root's path in that store
# ("" when the store is rooted at the operator root, "<operator_id>/" at the backend root).


def list_epochs(store: DurableStore, prefix: str = "") -> list[int]:
    """The epochs taken so far on an operator's location, ascending (one listing)."""
    out = []
    for full in store.list_dir(prefix + WRITERS_DIR):
        rel = full[len(prefix):]
        m = _NAME.match(rel.rsplit("/", 1)[-1])
        if m and rel == epoch_path(int(m.group(1))):
            out.append(int(m.group(1)))
    return sorted(out)


def read_epoch(store: DurableStore, epoch: int, prefix: str = "") -> WriterEpoch | None:
    try:
        raw = store.get_bytes(prefix + epoch_path(epoch))
    except FileNotFoundError:
        return None
    return WriterEpoch.from_json(raw, epoch_path(epoch))


def latest_writer(store: DurableStore, prefix: str = "") -> WriterEpoch | None:
    """The owner of the location (None: no writer has claimed it yet)."""
    epochs = list_epochs(store, prefix)
    return read_epoch(store, epochs[-1], prefix) if epochs else None


def held_before(store: DurableStore, epochs: list[int], run_id: str,
                prefix: str = "") -> int | None:
    """The epoch among ``epochs`` that run ``run_id`` held, if any (read in parallel)."""
    raws = store.get_bytes_many([prefix + epoch_path(k) for k in epochs])
    for k, raw in zip(epochs, raws):
        if raw is not None and WriterEpoch.from_json(raw, epoch_path(k)).run_id == run_id:
            return k
    return None


@dataclass(frozen=True)
class Evidence:
    """What the published state says about its writers.

    Attributes
    ----------
    newest : WriterStamp or None
        The highest writer epoch found in ``LATEST.json`` and the records.
    runs : dict
        Run id -> the highest epoch it wrote a record or ``LATEST.json`` under.
    queries : frozenset
        The query ids that wrote them (None for batch runs).
    """

    newest: WriterStamp | None
    runs: dict[str, int]
    queries: frozenset[str | None]


def read_evidence(store: DurableStore, prefix: str = "") -> Evidence:
    """The writers that ``LATEST.json`` and the completed-checkpoint records name (one read,
    one listing and the retained records read in parallel). A damaged file is passed over
    here: it is evidence of nothing, and ``verify`` and the readers report it."""
    stamps: list[WriterStamp] = []
    runs: dict[str, int] = {}
    try:
        ptr = parse_latest(store.get_bytes(prefix + LATEST_PATH))
        if ptr.writer is not None:
            stamps.append(ptr.writer)
        runs.update(ptr.runs)
    except (FileNotFoundError, CorruptStateError):
        pass
    rels = sorted(records_in(p[len(prefix):]
                             for p in store.list_dir(prefix + CHECKPOINTS_DIR)).values())
    for rel, raw in zip(rels, store.get_bytes_many([prefix + r for r in rels]) if rels else []):
        if raw is None:
            continue
        try:
            w = CompletedCheckpoint.from_json(raw, where=rel).writer
        except CorruptStateError:
            continue
        if w is not None:
            stamps.append(w)
    for w in stamps:
        if w.run_id is not None:
            runs[w.run_id] = max(runs.get(w.run_id, 0), w.epoch)
    newest = max(stamps, key=lambda w: w.epoch) if stamps else None
    return Evidence(newest, runs, frozenset(w.query_id for w in stamps))


@dataclass(frozen=True)
class Owner:
    """Who owns a location, from the ``_writers/`` files and the state's evidence.

    ``writer`` is the highest epoch seen in either (made from the evidence when its file is
    gone; None: nobody claimed it); ``epochs`` the epoch files listed."""

    writer: WriterEpoch | None
    epochs: list[int]
    evidence: Evidence

    @property
    def top(self) -> int:
        """The highest epoch seen anywhere (0: none): the next claim takes ``top + 1``."""
        return self.writer.epoch if self.writer is not None else 0

    def held_by(self, store: DurableStore, run_id: str, prefix: str = "") -> int | None:
        """The highest epoch run ``run_id`` held below :attr:`top`, from the files or the
        evidence (None: it never held one, or it is the owner)."""
        if self.writer is not None and self.writer.run_id == run_id:
            return None
        held = held_before(store, [k for k in self.epochs if k < self.top], run_id, prefix)
        seen = self.evidence.runs.get(run_id)
        got = [k for k in (held, seen) if k is not None and k < self.top]
        return max(got) if got else None


def resolve_owner(store: DurableStore, prefix: str = "") -> Owner:
    """The owner of the location: the newest epoch file, unless the state names a newer
    epoch (whose file was lost); see the module notes."""
    epochs = list_epochs(store, prefix)
    newest_file = read_epoch(store, epochs[-1], prefix) if epochs else None
    ev = read_evidence(store, prefix)
    writer = newest_file
    if ev.newest is not None and (writer is None or ev.newest.epoch > writer.epoch):
        writer = WriterEpoch.from_stamp(ev.newest)
    return Owner(writer, epochs, ev)


# how many runs LATEST.json remembers (restarts are rare; a fenced run of long ago whose
# files and records are all gone has nothing left to publish from)
HISTORY_RUNS = 64


def writer_history(store: DurableStore, owner: Owner, prefix: str = "") -> dict[str, int]:
    """Run id -> the highest epoch it held, from the last :data:`HISTORY_RUNS` epoch files
    and the evidence (read in parallel), for ``LATEST.json`` to carry."""
    out = dict(owner.evidence.runs)
    ks = owner.epochs[-HISTORY_RUNS:]
    for k, raw in zip(ks, store.get_bytes_many([prefix + epoch_path(k) for k in ks])
                      if ks else []):
        if raw is None:
            continue
        try:
            w = WriterEpoch.from_json(raw, epoch_path(k))
        except CorruptStateError:
            continue
        out[w.run_id] = max(out.get(w.run_id, 0), w.epoch)
    if owner.writer is not None and owner.writer.run_id != "?":
        out[owner.writer.run_id] = max(out.get(owner.writer.run_id, 0), owner.writer.epoch)
    newest = sorted(out.items(), key=lambda kv: kv[1])[-HISTORY_RUNS:]
    return dict(newest)


def _foreign(owner: WriterEpoch | None, query_id: str | None) -> bool:
    return (owner is not None and owner.query_id is not None and query_id is not None
            and owner.query_id != query_id)


def claim(ostore: DurableStore, query_id: str | None, run_id: str, *,
          clock: Callable[[], float] = time.time) -> WriterEpoch:
    """The epoch run ``run_id`` of query ``query_id`` writes under, taken if needed.

    The owner is the highest epoch in ``_writers/`` or in the state's records
    (:func:`resolve_owner`), so losing epoch files never hands the location back to a
    fenced run, and a new epoch is above every epoch seen anywhere.

    Parameters
    ----------
    ostore : DurableStore
        Rooted at the operator root; must support
        :meth:`~statebackend.storage.base.DurableStore.create_exclusive`.
    query_id : str or None
        Spark's query id; None for a batch run. Batch runs carry no identity to compare,
        so a batch run and a streaming query take over from each other like two runs of
        one query (docs/failure-semantics.md).
    run_id : str
        This run's id.

    Raises
    ------
    WriterFencedError
        This run held an older epoch (by its file or by the records): a newer run of the
        query owns the location.
    StateLocationInUseError
        Another streaming query owns the location, or wrote its state.
    FencingUnsupportedError
        The store offers no compare-and-set.
    """
    for _ in range(_CLAIM_TRIES):
        owner = resolve_owner(ostore)
        latest = owner.writer
        if latest is not None:
            if latest.run_id == run_id:
                if latest.nonce:
                    return latest
                # the state names this run the owner but its epoch file is gone: write it
                # again (the same epoch, never a new one that would fence nobody)
                mine = _new_epoch(latest.epoch, query_id, run_id, clock)
                if ostore.create_exclusive(mine.path, mine.to_json()):
                    return mine
                continue
            held = owner.held_by(ostore, run_id)
            if held is not None:
                raise fenced_error(ostore.root, held, latest)
            if _foreign(latest, query_id):
                raise _in_use(ostore.root, latest, query_id)
        mine = _new_epoch(owner.top + 1, query_id, run_id, clock)
        if ostore.create_exclusive(mine.path, mine.to_json()):
            return mine
        got = read_epoch(ostore, mine.epoch)
        if got is not None and got.nonce == mine.nonce:
            return mine  # our own first try went through; its answer was lost
        # another claimer took that epoch first (a sibling task of this run, or another
        # writer): evaluate again
    raise WriterFencedError(
        f"state location {_safe(ostore.root)}: could not take a writer epoch in "
        f"{_CLAIM_TRIES} tries, other writers keep taking them; is a restart loop running "
        f"elsewhere?")


def _in_use(root: str, owner: WriterEpoch, query_id: str | None) -> StateLocationInUseError:
    return StateLocationInUseError(
        f"state location {_safe(root)} belongs to another streaming query: "
        f"{owner.describe()}; this is query {query_id}. Nothing was written. Give this query "
        f"its own checkpoint_location or operator_id; to move the state to it, stop the "
        f"owner, take a savepoint and start this query from it (from_savepoint=) on a new "
        f"location.", owner=owner)


def _new_epoch(epoch: int, query_id: str | None, run_id: str,
               clock: Callable[[], float]) -> WriterEpoch:
    return WriterEpoch(epoch=epoch, query_id=query_id, run_id=run_id,
                       created_at_ms=int(clock() * 1000),
                       claimed_by=f"{socket.gethostname()}:{os.getpid()}",
                       nonce=uuid.uuid4().hex)


def _safe(url: str) -> str:
    """A location for messages: credentials in the URL redacted."""
    return redact_text(url)


def fenced_error(where: str, mine: int, newer: WriterEpoch) -> WriterFencedError:
    return WriterFencedError(
        f"this run held writer epoch {mine} of state location {_safe(where)}, and "
        f"{newer.describe()} has taken it over since: this run must stop (a newer start "
        f"of the same query owns the state). Nothing more was published or deleted.",
        newer=newer)


def check_owner(store: DurableStore, epoch: int, prefix: str = "") -> LatestPointer | None:
    """Prove that the writer of ``epoch`` still owns the location: no newer epoch file
    (one listing of ``_writers/``, so a missing middle epoch file does not hide a newer
    one) and no newer epoch in ``LATEST.json`` (one read: a newer writer whose epoch file
    is gone).

    Returns
    -------
    LatestPointer or None
        ``LATEST.json`` as read (None: absent or unreadable), for a caller that also
        wants to know whether another coordinator completed a checkpoint meanwhile.

    Raises
    ------
    WriterFencedError
        A newer writer took the location over.
    """
    where = f"{_safe(store.root)}/{prefix}".rstrip("/")
    newer = [k for k in list_epochs(store, prefix) if k > epoch]
    if newer:
        got = read_epoch(store, newer[-1], prefix)
        raise fenced_error(where, epoch, got if got is not None else
                           WriterEpoch(newer[-1], None, "?", 0, "?", "?"))
    try:
        ptr = parse_latest(store.get_bytes(prefix + LATEST_PATH))
    except (FileNotFoundError, CorruptStateError):
        return None  # no evidence there (a damaged pointer is reported by its readers)
    if ptr.writer is not None and ptr.writer.epoch > epoch:
        raise fenced_error(where, epoch, WriterEpoch.from_stamp(ptr.writer))
    return ptr


def writer_gaps(store: DurableStore, prefix: str = "") -> list[tuple[str, str]]:
    """What is wrong with ``_writers/`` against the state (``verify``): (path, what) for
    each epoch file missing below the highest epoch seen, each record or pointer whose
    writer epoch has no file or a file of another run, and each unreadable epoch file."""
    out: list[tuple[str, str]] = []
    epochs = list_epochs(store, prefix)
    files: dict[int, WriterEpoch] = {}
    for k, raw in zip(epochs, store.get_bytes_many([prefix + epoch_path(k) for k in epochs])
                      if epochs else []):
        if raw is None:
            continue
        try:
            files[k] = WriterEpoch.from_json(raw, epoch_path(k))
        except CorruptStateError as exc:
            out.append((epoch_path(k), f"unreadable ({exc})"))
    ev = read_evidence(store, prefix)
    top = max([*epochs, ev.newest.epoch if ev.newest is not None else 0, 0])
    for k in range(1, top + 1):
        if k not in epochs:
            out.append((epoch_path(k), f"missing: epochs up to {top} were taken (by the "
                        f"files or the records), so a fenced writer's evidence is gone; "
                        f"fencing still holds from the records"))
    for run, k in sorted(ev.runs.items()):
        f = files.get(k)
        if f is not None and f.run_id != run:
            out.append((epoch_path(k), f"held by run {f.run_id}, but the records name run "
                        f"{run} at epoch {k}: the file was rewritten"))
    return out


def check_publisher(ostore: DurableStore, manifest: PartitionManifest) -> None:
    """Right before ``manifest`` is published: prove that its writer epoch still owns the
    location (a manifest written without fencing, ``writer_epoch`` None, passes)."""
    if manifest.writer_epoch is not None:
        check_owner(ostore, manifest.writer_epoch)
