"""A restore merges the first pieces of a rolling partition while its units download
(statebackend.checkpoint.deltas.Merged: the latest write of each key whose unit is older),
up to a bound of bytes and up to the first piece holding a range delete or a dropped column
family; the pieces after it replay one by one. Either way the state is the model's."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from test_changelog import restore_durable
from test_rolling_slices import KGR, N, checkpoint_each, key, random_batch

from statebackend.checkpoint import deltas as dl
from statebackend.options import StateBackendOptions
from statebackend.storage import open_store


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
def merges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """``(pieces merged, pieces replayed one by one)`` of each restore."""
    seen: list[tuple[int, int]] = []
    merged_ahead = dl.merged_ahead

    def wrapped(*a: Any, **kw: Any):
        items = list(merged_ahead(*a, **kw))
        merged = [i[1].pieces for i in items if i[0] == "merged"]
        seen.append((sum(merged), sum(1 for i in items if i[0] == "piece")))
        return iter(items)

    monkeypatch.setattr(dl, "merged_ahead", wrapped)
    return seen


@pytest.mark.parametrize("most", [dl.MERGE_BYTES, 600])
def test_pieces_of_writes_merge_within_their_bound(tmp_path: Path, merges: list,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   most: int) -> None:
    merged_ahead = dl.merged_ahead
    monkeypatch.setattr(dl, "merged_ahead",
                        lambda p, f, c, most=most: merged_ahead(p, f, c, most))
    rng = random.Random(7)
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(checkpoint_mode="changelog", rolling_slices=N,
                               max_parallelism=16)
    batches = [random_batch(rng, big=True)] + [writes(rng) for _ in range(11)]
    manifests, model = checkpoint_each(store, opts, str(tmp_path / "local"), batches, True)
    merges.clear()
    assert restore_durable(store, manifests[-1], opts) == model
    pieces = len([d for d in manifests[-1].slices if d.is_delta])
    [(merged, one_by_one)] = merges
    assert merged + one_by_one == pieces and pieces >= N
    if most > 600:  # the default bound: all of them
        assert one_by_one == 0
    else:  # a few hundred bytes: the first one or two merge, the others replay
        assert 0 < merged < pieces and one_by_one > 0


def test_a_range_delete_or_drop_ends_the_merge(tmp_path: Path, merges: list) -> None:
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
        pieces = sorted((d for d in m.slices if d.is_delta), key=lambda d: d.checkpoint_id)
        first_other = next((i for i, d in enumerate(pieces) if d.checkpoint_id in (9, 10)),
                           len(pieces))
        [(merged, one_by_one)] = merges
        # merged: exactly the pieces before the first of batch 9's drop
        assert (merged, one_by_one) == (first_other, len(pieces) - first_other), m.checkpoint_id
