"""Offline max_parallelism migration of savepoints, without Spark.

State with value, list and map states, TTL and timers is built through KeyedStateBackend
over two partitions of max_parallelism 128, checkpointed, savepointed, migrated to 256 and
to 64, restored into every partition of the new layout, and read back through
KeyedStateBackend: the same values, lists, map entries, timers (in time order) and TTL
expiries as the original state.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint.publish import ManifestFacts
from statebackend.cli import main
from statebackend.coordinator import CheckpointCoordinator
from statebackend.errors import (
    CheckpointNotFoundError,
    IncompatibleStateError,
    OptionsError,
    StorageError,
)
from statebackend.keys.grouping_key import decode_grouping_key, encode_grouping_key
from statebackend.keys.groups import key_group
from statebackend.keys.ranges import KeyGroupRange, key_group_range
from statebackend.options import StateBackendOptions
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.savepoint.format import SAVEPOINT_MANIFEST
from statebackend.savepoint.migrate import KeyRehasher, migrate_savepoint
from statebackend.savepoint.reader import SavepointReader, check_max_parallelism
from statebackend.savepoint.writer import create_savepoint, savepoint_dir
from statebackend.state.backend import KeyedStateBackend
from statebackend.storage import FsspecStore, open_store

OP = "mig"
OLD_MAXP = 128
OLD_P = 2
TYPES = ["string", "bigint"]
KEYS = [(f"user-{i}", i * 7 - 50) for i in range(120)]
T0 = 1_000_000  # processing time when the state is written
TTL = 5_000  # "recent" values expire at T0 + TTL; the others never in these tests


def declare(be: KeyedStateBackend) -> dict[str, Any]:
    return {"count": be.value_state("count", "c BIGINT"),
            "recent": be.value_state("recent", "s STRING", ttl_ms=TTL),
            "events": be.list_state("events", "e INT", ttl_ms=10**12),
            "seen": be.map_state("seen", "b INT", "n BIGINT", ttl_ms=10**12),
            "tags": be.map_state("tags", "t STRING", "w DOUBLE")}


def enc(key: tuple, maxp: int) -> bytes:
    return encode_grouping_key(key, TYPES, key_group(key, TYPES, maxp))


def fill(be: KeyedStateBackend, keys: list[tuple]) -> None:
    s = declare(be)
    for key in keys:
        i = KEYS.index(key)  # the key's global index: what the tests expect of it
        be.set_current_key(enc(key, OLD_MAXP))
        n = key[1]
        s["count"].update((n * 3,))
        if i % 3:
            s["recent"].update((f"r{n}",))
        s["events"].put([(n,), (n + 1,)])
        if i % 2:
            s["events"].appendValue((-n,))
        for b in range(i % 4):
            s["seen"].updateValue((b,), (n + b,))
        if i % 5 == 0:
            s["tags"].updateValue((f"t{n}",), (n / 3,))
        be.register_timer(T0 + 10 * (i % 17))
        if i % 4 == 0:
            be.register_timer(T0 - i - 1)
    be.flush()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One source savepoint (``sp``) and its migrations to 256 and 64 key groups."""
    tmp = tmp_path_factory.mktemp("migrate")
    store = open_store(str(tmp / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(max_parallelism=OLD_MAXP, local_dir=str(tmp / "local"))
    coord = CheckpointCoordinator(store, OP, parallelism=OLD_P, max_parallelism=OLD_MAXP,
                                  num_retained=2)
    for p in range(OLD_P):
        rng = key_group_range(p, OLD_P, OLD_MAXP)
        mine = [k for k in KEYS if key_group(k, TYPES, OLD_MAXP) in rng]
        assert mine  # both partitions hold state
        cp = PartitionCheckpointer(store, OP, p, opts, str(tmp / "local"))
        inst, _ = cp.restore(None)
        be = KeyedStateBackend(inst, clock=lambda: T0)
        fill(be, mine)
        cp.checkpoint(inst, 0, "a0", (rng.start, rng.end), be.descriptors(),
                      facts=ManifestFacts(key_columns=("user", "n"), key_types=tuple(TYPES)))
        inst.close()
    assert coord.try_complete(0) is not None
    coord.close()
    create_savepoint(store, OP, "sp")
    m256 = migrate_savepoint(store, OP, "sp", "sp256", 256)
    m64 = migrate_savepoint(str(tmp / "durable"), OP, "sp", "sp64", 64, parallelism=3,
                            compression="none")
    return {"store": store, "tmp": tmp, "m256": m256, "m64": m64}


def reader(store: FsspecStore, name: str) -> SavepointReader:
    return SavepointReader(store.child(OP).child(savepoint_dir(name)))


def restore_all(store: FsspecStore, tmp: Path, name: str, parallelism: int, maxp: int,
                tag: str) -> Iterator[tuple[KeyGroupRange, RocksDBInstance]]:
    """Every partition of the layout, restored from savepoint ``name`` (caller closes)."""
    r = reader(store, name)
    for p in range(parallelism):
        rng = key_group_range(p, parallelism, maxp)
        inst = RocksDBInstance(str(tmp / f"{tag}-{name}-{p}"))
        r.restore_into(inst, rng, maxp)
        yield rng, inst


def read_state(be: KeyedStateBackend, key_bytes: bytes) -> dict[str, Any]:
    s = declare(be)
    be.set_current_key(key_bytes)
    return {"count": s["count"].get(), "recent": s["recent"].get(),
            "events": list(s["events"].get()), "seen": list(s["seen"].iterator()),
            "tags": list(s["tags"].iterator()), "timers": list(be.list_timers())}


def snapshot(store: FsspecStore, tmp: Path, name: str, parallelism: int, maxp: int,
             now: int, tag: str) -> dict[str, Any]:
    """Everything a processor can observe, per key, at processing time ``now``; plus the
    timers popped up to T0 + 50 (per partition in time order) and the TTL purge count."""
    per_key: dict[tuple, dict] = {}
    fired: list[tuple[int, tuple]] = []
    purged = 0
    clock = [now]
    for rng, inst in restore_all(store, tmp, name, parallelism, maxp, tag):
        try:
            be = KeyedStateBackend(inst, clock=lambda: clock[0])
            for key in KEYS:
                kb = enc(key, maxp)
                if key_group(key, TYPES, maxp) in rng:
                    assert key not in per_key
                    per_key[key] = read_state(be, kb)
                else:  # a key this partition does not own has no state here
                    assert read_state(be, kb) == {"count": None, "recent": None,
                                                  "events": [], "seen": [], "tags": [],
                                                  "timers": []}
            popped = [(ts, decode_grouping_key(k, TYPES)[1])
                      for k, ts in be.pop_expired_timers(T0 + 50)]
            assert [ts for ts, _ in popped] == sorted(ts for ts, _ in popped)
            fired.extend(popped)
            purged += be.purge_expired()
            be.close()
        finally:
            inst.close()
    return {"keys": per_key, "fired": sorted(fired), "purged": purged}


@pytest.mark.parametrize("name,parallelism,maxp", [("sp256", 2, 256), ("sp64", 3, 64)])
@pytest.mark.parametrize("now", [T0, T0 + TTL])  # before and at the expiry of "recent"
def test_migrated_state_reads_like_the_original(built, name, parallelism, maxp, now):
    store, tmp = built["store"], built["tmp"]
    want = snapshot(store, tmp, "sp", OLD_P, OLD_MAXP, now, f"old{now}")
    got = snapshot(store, tmp, name, parallelism, maxp, now, f"new{now}")
    assert set(want["keys"]) == set(KEYS)
    assert got == want
    # the reads are not vacuous: they show what fill() wrote, and TTL took effect
    k = KEYS[1]
    assert want["keys"][k]["count"] == (k[1] * 3,)
    assert want["keys"][k]["events"] == [(k[1],), (k[1] + 1,), (-k[1],)]
    assert want["keys"][k]["recent"] == ((f"r{k[1]}",) if now < T0 + TTL else None)
    assert want["purged"] == (0 if now < T0 + TTL else sum(1 for i in range(len(KEYS)) if i % 3))
    due = sum(1 for i in range(len(KEYS)) if 10 * (i % 17) <= 50) + len(KEYS[::4])
    assert len(want["fired"]) == due


@pytest.mark.parametrize("name,maxp", [("sp256", 256), ("sp64", 64)])
def test_every_entry_is_in_its_new_key_group_block_sorted(built, name, maxp):
    r = reader(built["store"], name)
    m = r.manifest
    assert m.max_parallelism == maxp
    assert m.metrics["migrated_from"] == {"savepoint": "sp", "max_parallelism": OLD_MAXP,
                                          "parallelism": OLD_P}
    assert m.metrics["key_types"] == TYPES
    src = reader(built["store"], "sp")
    assert m.states == src.manifest.states
    total = 0
    moved = 0
    for kg in range(maxp):
        for cf, entries in r.read_key_group(kg).items():
            keys = [k for k, _ in entries]
            assert keys == sorted(keys) and len(set(keys)) == len(keys), (cf, kg)
            for k in keys:
                if cf == "_ttl":
                    k = k[11 + k[10]:]  # the indexed entry's RocksDB key
                elif cf == "_timers_by_time":
                    k = k[10:]
                old_kg, values, _ = decode_grouping_key(k, TYPES)
                assert old_kg == kg == key_group(values, TYPES, maxp)
                moved += key_group(values, TYPES, OLD_MAXP) != kg
            total += len(entries)
    assert moved > total // 3  # most keys really changed key group
    old_total = sum(len(e) for kg in range(OLD_MAXP)
                    for e in src.read_key_group(kg).values())
    assert total == old_total
    assert r.read_global() == src.read_global()


def test_old_savepoint_is_refused_and_the_migrated_one_accepted(built):
    store, tmp = built["store"], built["tmp"]
    old = reader(store, "sp")
    with pytest.raises(IncompatibleStateError, match="migrate-savepoint"):
        check_max_parallelism(old.manifest.max_parallelism, 256, "savepoint 'sp'")
    inst = RocksDBInstance(str(tmp / "refused"))
    try:
        with pytest.raises(IncompatibleStateError, match="max_parallelism=128"):
            old.restore_into(inst, key_group_range(0, 2, 256), 256)
    finally:
        inst.close()
    new = reader(store, "sp256")
    check_max_parallelism(new.manifest.max_parallelism, 256, "savepoint 'sp256'")
    inst = RocksDBInstance(str(tmp / "accepted"))
    try:
        stats = new.restore_into(inst, key_group_range(1, 2, 256), 256)
        assert stats.entries > 0
    finally:
        inst.close()


def test_source_is_never_changed_nor_a_savepoint_overwritten(built):
    store = built["store"]
    sp_root = os.path.join(store.root, OP, savepoint_dir("sp"))
    before = {n: open(os.path.join(sp_root, n), "rb").read() for n in os.listdir(sp_root)}
    with pytest.raises(StorageError, match="already exists"):
        migrate_savepoint(store, OP, "sp", "sp256", 256)
    with pytest.raises(StorageError, match="new name"):
        migrate_savepoint(store, OP, "sp", "sp", 256)
    with pytest.raises(CheckpointNotFoundError):
        migrate_savepoint(store, OP, "nope", "x", 256)
    after = {n: open(os.path.join(sp_root, n), "rb").read() for n in os.listdir(sp_root)}
    assert after == before


def test_wrong_key_types_publish_nothing(built):
    store = built["store"]
    with pytest.raises(OptionsError, match="records key types"):
        migrate_savepoint(store, OP, "sp", "bad1", 256, key_types=["string"])
    # a savepoint that does not record its types: the wrong ones are caught by rehashing
    sp = json.loads(store.get_bytes(f"{OP}/{savepoint_dir('sp')}/{SAVEPOINT_MANIFEST}"))
    sp["metrics"].pop("key_types")
    sp["name"] = "untyped"
    src_dir = os.path.join(store.root, OP, savepoint_dir("sp"))
    dst_dir = os.path.join(store.root, OP, savepoint_dir("untyped"))
    os.makedirs(dst_dir)
    for n in os.listdir(src_dir):
        if n != SAVEPOINT_MANIFEST:
            os.link(os.path.join(src_dir, n), os.path.join(dst_dir, n))
    store.put_bytes_atomic(f"{OP}/{savepoint_dir('untyped')}/{SAVEPOINT_MANIFEST}",
                           json.dumps(sp).encode())
    with pytest.raises(OptionsError, match="key_types="):
        migrate_savepoint(store, OP, "untyped", "bad2", 256)
    for wrong in (["string", "int"], ["bigint", "string"], ["string", "string"]):
        with pytest.raises(IncompatibleStateError, match="key types"):
            migrate_savepoint(store, OP, "untyped", "bad3", 256, key_types=wrong)
        assert not store.exists(f"{OP}/{savepoint_dir('bad3')}/{SAVEPOINT_MANIFEST}")
    m = migrate_savepoint(store, OP, "untyped", "typed", 256, key_types=TYPES)
    assert m.metrics["key_types"] == TYPES


def test_rehasher_keeps_timestamps_and_dates_exact():
    """Decoding dates and timestamps as ints keeps their hash exact (no local-time trip)."""
    import datetime as dt

    types = ["timestamp", "date", "double", "boolean"]
    keys = [(dt.datetime(2021, 3, 28, 2, 30, 0, 123), dt.date(1969, 12, 31), -0.0, True),
            (dt.datetime(1960, 1, 1), dt.date(2038, 1, 19), float("nan"), None),
            (None, None, 1.5, False)]
    rh = KeyRehasher(types, 128, 1000, {"v": "value", "m": "map"})
    # one vectorised hash for all of them, as the migration does per key group
    rh.prime([encode_grouping_key(k, types, key_group(k, types, 128)) for k in keys], "v")
    for key in keys:
        gk = encode_grouping_key(key, types, key_group(key, types, 128))
        new = rh.rewrite("v", gk)
        assert new == encode_grouping_key(key, types, key_group(key, types, 1000))
        mk = gk + b"\x05user" + len(gk).to_bytes(4, "big")
        assert rh.rewrite("m", mk) == new[:2] + mk[2:]
    with pytest.raises(IncompatibleStateError, match="no state descriptor"):
        rh.rewrite("unknown", gk)


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def test_cli_migrate_savepoint(built, capsys):
    store = built["store"]
    url = store.root
    code, text = cli("migrate-savepoint", url, OP, "sp", "cli512", "--max-parallelism", "512",
                     "--parallelism", "4", "--json")
    assert code == 0, text
    out = json.loads(text)
    assert out["max_parallelism"] == 512 and out["parallelism"] == 4 and out["files"] == 4
    assert out["path"] == f"{OP}/_savepoints/cli512"
    assert reader(store, "cli512").manifest.max_parallelism == 512
    code, text = cli("migrate-savepoint", url, OP, "sp", "cli32", "--max-parallelism", "32")
    assert code == 0 and "from_savepoint='cli32'" in text
    assert cli("migrate-savepoint", url, OP, "sp", "cli512", "--max-parallelism", "8")[0] == 4
    assert cli("migrate-savepoint", url, OP, "nope", "x", "--max-parallelism", "8")[0] == 3
    assert cli("migrate-savepoint", url, OP, "sp", "y", "--max-parallelism", "0")[0] == 2
    assert cli("migrate-savepoint", url, OP, "sp", "y", "--max-parallelism", "8",
               "--key-types", "string")[0] == 2
