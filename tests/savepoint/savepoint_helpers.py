"""Building keyed state of an operator at some parallelism, and reading it back whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.coordinator import CheckpointCoordinator
from statebackend.keys.grouping_key import encode_grouping_key
from statebackend.keys.groups import key_group
from statebackend.keys.ranges import key_group_range
from statebackend.options import StateBackendOptions
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.state.backend import KeyedStateBackend
from statebackend.storage import FsspecStore, open_store

OP = "op"
MAXP = 32


def dump(inst: RocksDBInstance) -> dict[str, dict[bytes, bytes]]:
    """Every non-empty column family's entries."""
    out = {cf: dict(inst.scan_range(cf, b"", None)) for cf in inst.column_family_names()}
    return {cf: kv for cf, kv in out.items() if kv}


def encoded_keys(n: int, maxp: int = MAXP) -> list[bytes]:
    return [encode_grouping_key((f"k{i}",), ["string"], key_group([f"k{i}"], ["string"], maxp))
            for i in range(n)]


def fill(backend: KeyedStateBackend, keys: list[bytes], batch: int, *,
         extra_state: bool = False) -> None:
    """Value, map (with TTL) and timers per key; ``extra_state`` declares one more state."""
    count = backend.value_state("count", "c BIGINT")
    seen = backend.map_state("seen", "b INT", "n BIGINT", ttl_ms=10**12)
    for i, k in enumerate(keys):
        backend.set_current_key(k)
        c = count.get()
        count.update(((c[0] if c else 0) + i + batch,))
        seen.updateValue((batch,), (i,))
        backend.register_timer(1000 * batch + i)
    if extra_state:
        only = backend.value_state("only_here", "x BIGINT")
        backend.set_current_key(keys[0])
        only.update((7,))
    backend.flush()


def opts(tmp_path: Path, **kw) -> StateBackendOptions:
    return StateBackendOptions(max_parallelism=MAXP, local_dir=str(tmp_path / "local"), **kw)


@pytest.fixture
def store(tmp_path: Path) -> FsspecStore:
    return open_store(str(tmp_path / "durable"), backoff_s=0.0)


def build_operator(store: FsspecStore, tmp_path: Path, parallelism: int, n_keys: int = 300,
                   batches: int = 2, **kw) -> tuple[CheckpointCoordinator, dict]:
    """Run ``batches`` checkpoints of ``parallelism`` partitions; returns the coordinator
    and the logical state per partition after the last one."""
    o = opts(tmp_path, **kw)
    coord = CheckpointCoordinator(store, OP, parallelism=parallelism, max_parallelism=MAXP,
                                  num_retained=2)
    keys = encoded_keys(n_keys)
    state: dict[int, dict] = {}
    for b in range(batches):
        for p in range(parallelism):
            rng = key_group_range(p, parallelism, MAXP)
            mine = [k for k in keys if int.from_bytes(k[:2], "big") in rng]
            cp = PartitionCheckpointer(store, OP, p, o, str(tmp_path / "local"))
            base = None if b == 0 else coord.restore(b - 1).manifests[p]
            inst, _ = cp.restore(base)
            be = KeyedStateBackend(inst, clock=lambda: 0)
            fill(be, mine, b, extra_state=(p == parallelism - 1))
            cp.checkpoint(inst, b, f"a{b}", (rng.start, rng.end), be.descriptors())
            state[p] = dump(inst)
            inst.close()
        assert coord.try_complete(b) is not None
    return coord, state


def merged(state: dict[int, dict]) -> dict[str, dict[bytes, bytes]]:
    out: dict[str, dict[bytes, bytes]] = {}
    for per in state.values():
        for cf, kv in per.items():
            out.setdefault(cf, {}).update(kv)
    return out


def restrict(full: dict[str, dict[bytes, bytes]], start: int, end: int
             ) -> dict[str, dict[bytes, bytes]]:
    """The entries a partition owning key groups start..end must hold."""
    out = {}
    for cf, kv in full.items():
        if cf == "_meta":
            sub = dict(kv)
        else:
            sub = {k: v for k, v in kv.items() if start <= int.from_bytes(k[:2], "big") <= end}
        if sub:
            out[cf] = sub
    return out
