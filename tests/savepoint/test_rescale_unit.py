"""Rescaling from an incremental checkpoint: each new partition holds exactly its key
groups, its first checkpoint completes under the new parallelism, and reuses old files."""

from __future__ import annotations

from pathlib import Path

import pytest
from savepoint_helpers import MAXP, OP, build_operator, dump, merged, opts, restrict

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.errors import IncompatibleStateError
from statebackend.keys.ranges import key_group_range
from statebackend.restore.rescale import restore_rescaled
from statebackend.state.backend import KeyedStateBackend


@pytest.mark.parametrize(("old_p", "new_p", "local_recovery", "mode"), [
    *[(o, n, lr, "incremental") for o, n in [(2, 1), (2, 3), (2, 4), (3, 2)]
      for lr in (True, False)],
    # changelog mode: the old partitions' changelogs are replayed, then clipped to the range
    (2, 3, True, "changelog"), (3, 2, False, "changelog")])
def test_rescaled_partitions_hold_exactly_their_key_groups(store, tmp_path: Path, old_p, new_p,
                                                           local_recovery, mode):
    coord, state = build_operator(store, tmp_path, old_p, batches=3 if mode == "changelog" else 2,
                                  local_recovery=local_recovery, checkpoint_mode=mode)
    full = merged(state)
    record = coord.latest()
    o = opts(tmp_path, local_recovery=local_recovery, checkpoint_mode=mode)
    coord.parallelism = new_p  # what the backend does when the query's parallelism changes
    after: dict[int, dict] = {}
    for p in range(new_p):
        rng = key_group_range(p, new_p, MAXP)
        cp = PartitionCheckpointer(store, OP, p, o, str(tmp_path / "local"))
        inst, metrics, sources = restore_rescaled(cp, record, new_p, MAXP, str(tmp_path / "local"))
        try:
            want = restrict(full, rng.start, rng.end)
            # global entries (state descriptors) come from the old partitions it overlaps
            want["_meta"] = {k: v for m in sources for k, v in state[m.partition]["_meta"].items()}
            assert dump(inst) == want, p
            assert sources[0].partition == metrics.base_partition
            assert sorted(m.partition for m in sources) == sorted(
                q for q in range(old_p) if key_group_range(q, old_p, MAXP).intersect(rng))
            be = KeyedStateBackend(inst, clock=lambda: 0)
            names = {d.name for d in be.descriptors()}
            if old_p - 1 in [m.partition for m in sources]:
                assert "only_here" in names  # _meta merged from a source that is not the base
            man, cm = cp.checkpoint(inst, record.checkpoint_id + 1, "r", (rng.start, rng.end),
                                    be.descriptors())
            if new_p < old_p or (new_p % old_p == 0 and new_p > old_p):
                # the base's SST files survive the clip and are not uploaded again
                assert cm.files_reused > 0
            after[p] = dump(inst)
        finally:
            inst.close()
    done = coord.try_complete(record.checkpoint_id + 1)
    assert done is not None and done.parallelism == new_p
    # the first checkpoint after the rescale restores to the same state
    rp = coord.restore(done.checkpoint_id)
    for p in range(new_p):
        cp = PartitionCheckpointer(store, OP, p, o, str(tmp_path / "fresh"))
        inst, _ = cp.restore(rp.manifests[p])
        assert dump(inst) == after[p]
        inst.close()


def test_changed_max_parallelism_is_refused(store, tmp_path: Path):
    coord, _ = build_operator(store, tmp_path, 2, batches=1)
    cp = PartitionCheckpointer(store, OP, 0, opts(tmp_path), str(tmp_path / "local"))
    with pytest.raises(IncompatibleStateError, match="migrate"):
        restore_rescaled(cp, coord.latest(), 3, 64, str(tmp_path / "local"))
