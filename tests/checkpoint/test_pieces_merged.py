"""A restore merges the pieces of a rolling partition while its units download
(statebackend.checkpoint.deltas.Merged: the latest write of each key whose unit is older),
each merge within a bound of bytes and written as SST files; a piece holding a range delete
or a dropped column family is replayed alone between the merges before and after it.
Either way the state is the model's."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_changelog import restore_durable
from test_rolling_slices import KGR, N, checkpoint_each, key, random_batch

from statebackend.checkpoint import deltas as dl
from statebackend.checkpoint import restore as restore_mod
from statebackend.options import StateBackendOptions
from statebackend.storage import open_store
from statebackend.storage.fsspec_store import FsspecStore


def writes(rng: random.Random) -> list[tuple]:
    """Puts and deletes only (what merges)."""
    ops: list[tuple] = []
    for _ in range(rng.randint(2, 6)):
        cf, kg = rng.choice(["s1", "s2"]), rng.randint(*KGR)
        if rng.random() < 0.75:
            ops.append(("batch", cf, [(key(kg, rng.randint(0, 9)), rng.randbytes(50))
                                      for _ in range(rng.randint(1, 6))]))
        else:
            ops.append(("delete", cf, key(kg, rng.randint(0, 9))))
    return ops


@pytest.fixture
def merges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, list]]:
    """``(pieces merged, pieces replayed one by one, [(bytes, pieces) of each merge])`` of
    each restore."""
    seen: list[tuple[int, int, list]] = []
    merged_ahead = dl.merged_ahead

    def wrapped(*a: Any, **kw: Any):
        items = list(merged_ahead(*a, **kw))
        merged = [(i[1].bytes, i[1].pieces) for i in items if i[0] == "merged"]
        seen.append((sum(n for _b, n in merged), sum(1 for i in items if i[0] == "piece"),
                     merged))
        return iter(items)

    monkeypatch.setattr(dl, "merged_ahead", wrapped)
    return seen


@pytest.mark.parametrize("most", [dl.MERGE_BYTES, 300])
def test_pieces_of_writes_merge_within_their_bound(tmp_path: Path, merges: list,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   most: int) -> None:
    merged_ahead = dl.merged_ahead
    monkeypatch.setattr(dl, "merged_ahead",
                        lambda p, f, c, most=most, **kw: merged_ahead(p, f, c, most, **kw))
    rng = random.Random(7)
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(checkpoint_mode="changelog", rolling_slices=N,
                               max_parallelism=16)
    batches = [random_batch(rng, big=True)] + [writes(rng) for _ in range(11)]
    manifests, model = checkpoint_each(store, opts, str(tmp_path / "local"), batches, True)
    merges.clear()
    ingested: list[str] = []
    ingest = dl.ingest_moved
    monkeypatch.setattr(dl, "ingest_moved", lambda i, cf, paths: (
        ingested.extend(os.path.basename(p) for p in paths), ingest(i, cf, paths)))
    assert restore_durable(store, manifests[-1], opts) == model
    pieces = len([d for d in manifests[-1].slices if d.is_delta])
    [(merged, one_by_one, each)] = merges
    # pieces of writes only: every one merged, in merges within the bound (or one alone)
    assert (merged, one_by_one) == (pieces, 0) and pieces >= N
    assert all(b <= most or n == 1 for b, n in each)
    # what merged went in as one SST file per column family written, not as a write
    assert ingested and all(n.startswith("merged-") for n in ingested)
    assert len(ingested) <= 2 * len(each)  # s1, s2
    if most == dl.MERGE_BYTES:  # the default bound: one merge
        assert len(each) == 1
    else:  # 300 bytes: several, ingested in order (newer files win)
        assert len(each) > 2


def test_a_range_delete_or_drop_is_replayed_between_merges(tmp_path: Path,
                                                           merges: list) -> None:
    rng = random.Random(3)
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(checkpoint_mode="changelog", rolling_slices=N,
                               max_parallelism=16)
    batches = ([random_batch(rng, big=True)] + [writes(rng) for _ in range(7)]
               + [[("drop", "s1")], [("range", "s2", key(0, 0), key(KGR[1], 9))]]
               + [writes(rng) for _ in range(4)])
    manifests, model = checkpoint_each(store, opts, str(tmp_path / "local"), batches, True)
    assert restore_durable(store, manifests[-1], opts) == model
    for m in manifests[-6:]:  # batches 9..14 (each checked against the model as written)
        merges.clear()
        restore_durable(store, m, opts)
        pieces = [d for d in m.slices if d.is_delta]
        others = sum(1 for d in pieces if d.checkpoint_id in (9, 10))
        [(merged, one_by_one, each)] = merges
        # replayed alone: exactly the pieces of batch 9's drop and batch 10's range delete;
        # the pieces before and after them merged (in two merges when both sides have some)
        assert (merged, one_by_one) == (len(pieces) - others, others), m.checkpoint_id
        before = sum(1 for d in pieces if d.checkpoint_id < 9)
        after = sum(1 for d in pieces if d.checkpoint_id > 10)
        assert [n for _b, n in each] == [n for n in (before, after) if n], m.checkpoint_id


def test_pieces_are_read_fewer_at_once_while_the_units_download(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The units are the restore's critical path: while they download, at most
    PIECES_BESIDE_UNITS pieces are read at once (they would take the client's few
    connections), many more once the units are in; the state is the model's."""
    monkeypatch.setattr(restore_mod, "PIECES_BESIDE_UNITS", 2)
    rng = random.Random(11)
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    # 8 slices: a piece lives ~8 batches, so the last checkpoint has many
    opts = StateBackendOptions(checkpoint_mode="changelog", rolling_slices=2 * N,
                               max_parallelism=16)
    batches = [random_batch(rng, big=True)] + [writes(rng) for _ in range(15)]
    manifests, model = checkpoint_each(store, opts, str(tmp_path / "local"), batches, True)
    lock, units = threading.Lock(), threading.Event()
    seen = {"now": 0, "beside": 0, "after": 0, "read beside": 0}
    get_bytes, get_files_each = FsspecStore.get_bytes, FsspecStore.get_files_each

    def counted(self: FsspecStore, path: str) -> bytes:
        with lock:
            seen["now"] += 1
            when = "beside" if units.is_set() else "after"
            seen[when] = max(seen[when], seen["now"])
        try:
            time.sleep(0.03)  # a request's latency: reads of a window overlap
            return get_bytes(self, path)
        finally:
            with lock:
                seen["now"] -= 1
                seen["read beside"] += units.is_set()

    def downloading(self: FsspecStore, items: Any) -> Any:
        units.set()
        try:  # the units download until a few pieces were read beside them
            deadline = time.monotonic() + 10
            while seen["read beside"] < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            yield from get_files_each(self, items)
        finally:
            units.clear()

    monkeypatch.setattr(FsspecStore, "get_bytes", counted)
    monkeypatch.setattr(FsspecStore, "get_files_each", downloading)
    assert restore_durable(store, manifests[-1], opts) == model
    pieces = len([d for d in manifests[-1].slices if d.is_delta])
    assert pieces >= 8 and seen["read beside"] >= 4
    assert seen["beside"] == 2 and seen["after"] > 2, seen
