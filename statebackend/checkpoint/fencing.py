"""One writer per state location: writer epochs taken by compare-and-set on the store.

Every run of a query that writes an operator's state holds an *epoch*: the file
``<operator root>/_writers/epoch-<k>.json`` it created with the store's atomic
create-if-absent (:meth:`~statebackend.storage.base.DurableStore.create_exclusive`: a hard
link locally, ``If-None-Match: *`` on S3). The owner of the location is the writer of the
highest epoch. Epochs are taken in order, ``k + 1`` only after ``k`` exists, so "a newer
writer exists" is one HEAD of the next epoch's file.

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
proves that its writer still owns the location (:func:`check_owner`, one HEAD): a fenced
writer is refused within one micro-batch, before it publishes or deletes anything more.

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
from ..model.manifest import PartitionManifest
from ..storage.base import DurableStore

__all__ = ["WRITERS_DIR", "WriterEpoch", "check_owner", "claim", "epoch_path",
           "fenced_error", "held_before", "latest_writer", "list_epochs", "check_publisher", "read_epoch"]

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
        when = dt.datetime.fromtimestamp(self.created_at_ms / 1000, dt.timezone.utc)
        query = "a batch run" if self.query_id is None else f"query {self.query_id}"
        return (f"writer epoch {self.epoch} ({query}, run {self.run_id}, taken "
                f"{when:%Y-%m-%d %H:%M:%S}Z by {self.claimed_by})")

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

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


def claim(ostore: DurableStore, query_id: str | None, run_id: str, *,
          clock: Callable[[], float] = time.time) -> WriterEpoch:
    """The epoch run ``run_id`` of query ``query_id`` writes under, taken if needed.

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
        This run held an older epoch: a newer run of the query owns the location.
    StateLocationInUseError
        Another streaming query owns the location.
    FencingUnsupportedError
        The store offers no compare-and-set.
    """
    for _ in range(_CLAIM_TRIES):
        epochs = list_epochs(ostore)
        latest = read_epoch(ostore, epochs[-1]) if epochs else None
        if latest is not None:
            if latest.run_id == run_id:
                return latest
            held = held_before(ostore, epochs[:-1], run_id)
            if held is not None:
                raise fenced_error(ostore.root, held, latest)
            if (latest.query_id is not None and query_id is not None
                    and latest.query_id != query_id):
                raise StateLocationInUseError(
                    f"state location {ostore.root} belongs to another streaming query: "
                    f"{latest.describe()}; this is query {query_id}. Nothing was written. "
                    f"Give this query its own checkpoint_location or operator_id; to move "
                    f"the state to it, stop the owner, take a savepoint and start this "
                    f"query from it (from_savepoint=) on a new location.", owner=latest)
        mine = WriterEpoch(epoch=(epochs[-1] + 1) if epochs else 1, query_id=query_id,
                           run_id=run_id, created_at_ms=int(clock() * 1000),
                           claimed_by=f"{socket.gethostname()}:{os.getpid()}",
                           nonce=uuid.uuid4().hex)
        if ostore.create_exclusive(mine.path, mine.to_json()):
            return mine
        got = read_epoch(ostore, mine.epoch)
        if got is not None and got.nonce == mine.nonce:
            return mine  # our own first try went through; its answer was lost
        # another claimer took that epoch first (a sibling task of this run, or another
        # writer): evaluate again
    raise WriterFencedError(
        f"state location {ostore.root}: could not take a writer epoch in {_CLAIM_TRIES} "
        f"tries, other writers keep taking them; is a restart loop running elsewhere?")


def fenced_error(where: str, mine: int, newer: WriterEpoch) -> WriterFencedError:
    return WriterFencedError(
        f"this run held writer epoch {mine} of state location {where}, and "
        f"{newer.describe()} has taken it over since: this run must stop (a newer start "
        f"of the same query owns the state). Nothing more was published or deleted.",
        newer=newer)


def check_owner(store: DurableStore, epoch: int, prefix: str = "") -> None:
    """Prove that the writer of ``epoch`` still owns the location (one HEAD of the next
    epoch's file).

    Raises
    ------
    WriterFencedError
        A newer writer took the location over.
    """
    if store.exists(prefix + epoch_path(epoch + 1)):
        newer = latest_writer(store, prefix)
        raise fenced_error(f"{store.root}/{prefix}".rstrip("/"), epoch,
                           newer if newer is not None else
                           WriterEpoch(epoch + 1, None, "?", 0, "?", ""))


def check_publisher(ostore: DurableStore, manifest: PartitionManifest) -> None:
    """Right before ``manifest`` is published: prove that its writer epoch still owns the
    location (a manifest written without fencing, ``writer_epoch`` None, passes)."""
    if manifest.writer_epoch is not None:
        check_owner(ostore, manifest.writer_epoch)
