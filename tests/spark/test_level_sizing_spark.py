"""Level sizing and the compaction of a load before its snapshot, in a streaming query:
a load batch then small batches through ``map_in_pandas`` on Spark, with the thresholds
lowered in the workers (``sizing_procs``). The checkpoint mode is the tests' default
(``STATEBACKEND_TEST_CHECKPOINT_MODE`` runs it in changelog mode), and what each mode
must leave in durable storage is asserted: the load's checkpoint holds no level-0 file in
both modes; the level sizes are derived from the state in incremental mode, and in
changelog mode only with ``materialize_inline_ratio`` (its own test, whatever the default
mode), whose small batches then checkpoint as materializations of their own."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import sizing_procs
from harness import check_batches, run_stream, running_counts, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.checkpoint import PartitionCheckpointer
from statebackend.model.manifest import changelog_name
from statebackend.rocksdb.options import sizes_levels
from statebackend.storage import open_store, read_manifest
from statebackend.storage.manifests import operator_store

pytestmark = pytest.mark.spark

OP = "sized"
ROCKSDB_BASE = str(256 << 20)


def _batches(seed: int = 5) -> list[pd.DataFrame]:
    """A load of 80,000 keys of 100 bytes (~5 MB per partition: above the lowered
    threshold, and in changelog mode more changelog than state, so it materializes
    inline), then five batches of 500 rows, a fifth of them new keys."""
    rng = np.random.default_rng(seed)
    # incompressible, as the changelog compresses
    pads = rng.bytes(42 * 80_000).hex()
    keys = [f"load-key-{i:07d}{pads[84 * i:84 * (i + 1)]}" for i in range(80_000)]
    out = [keys]
    for b in range(5):
        old = [keys[i] for i in rng.integers(0, len(keys), 400)]
        new = [f"new-{b}-{i:03d}" for i in range(100)]
        keys = keys + new
        out.append(old + new)
    return [pd.DataFrame({"k": ks, "x": np.zeros(len(ks), "int64"),
                          "ts": pd.Timestamp("2026-01-01")}) for ks in out]


def _level0_files(be_root: str, opts: StateBackendOptions, manifest, local: str) -> int:
    """Level-0 files of the state ``manifest`` restores to (every column family)."""
    cp = PartitionCheckpointer(open_store(be_root), OP, manifest.partition, opts, local)
    inst, _ = cp.restore(manifest)
    try:
        return sum(inst.property_int("rocksdb.num-files-at-level0", cf) or 0
                   for cf in inst.column_family_names())
    finally:
        inst.close()


def _level_bases(be_root: str, manifest) -> set[str]:
    """``max_bytes_for_level_base`` of every column family in the OPTIONS file the
    checkpoint references in durable storage."""
    store = operator_store(open_store(be_root), OP)
    (options,) = [f for f in manifest.db_files if f.name.startswith("OPTIONS-")]
    text = store.get_bytes(options.path).decode()
    return set(re.findall(r"max_bytes_for_level_base=(\d+)", text))


def _run_query(spark, tmp_path, seed: int, **options):
    """The load and five small batches through map_in_pandas with ``options``, checked
    against the running counts and completed; the backend, its options, its state
    location and its durable store."""
    root = tmp_path / sizing_procs.MARKER
    opts = StateBackendOptions(parallelism=2, local_dir=str(root / "local"), num_retained=6,
                               **options)
    be = RocksDBStateBackend(str(root / "state"), opts)
    data = _batches(seed)
    write_batches(str(tmp_path / "in"), data)
    ours = run_stream(spark, str(tmp_path / "in"), "k STRING, x BIGINT, ts TIMESTAMP",
                      lambda df: be.map_in_pandas(df, "k", sizing_procs.vector_count,
                                                  "k STRING, v BIGINT", state_schema="c BIGINT",
                                                  operator_id=OP),
                      str(tmp_path / "ck"))
    check_batches(ours, running_counts(data)[0])
    be.complete(OP)
    state = str(root / "state")
    return be, opts, data, state, open_store(state)


def test_load_compacted_and_levels_sized_in_a_streaming_query(spark, tmp_path):
    # (the inline ratio: its own test)
    be, opts, _data, state, store = _run_query(spark, tmp_path, 5, materialize_inline_ratio=0)
    records = {n: be.coordinator(OP).get(n) for n in (0, 1, 5)}
    manifests = {n: [read_manifest(store, rel, operator_id=OP)
                     for _p, rel in sorted(rec.manifests.items())]
                 for n, rec in records.items()}
    restore_dir = str(tmp_path / "restore")
    # the load: compacted before its snapshot, so its checkpoint holds no level-0 file
    # (above sizing_procs.BULK_LOAD_MIN_BYTES of level 0 in each partition)
    for m in manifests[0]:
        assert m.db_files, m.path
        assert _level0_files(state, opts, m, restore_dir) == 0, m.path
    latest = manifests[5]
    if {m.mode for m in latest} == {"incremental"}:  # (auto: these partitions are small)
        # a batch of 500 rows is left to RocksDB: its flush stays in level 0
        l0 = [_level0_files(state, opts, m, restore_dir) for m in manifests[1]]
        assert l0 == [1, 1], l0
    else:
        # the base is the load's materialization (inline, in the load's critical path)
        assert all(m.mode == "changelog" and m.materialized_id == 0 for m in latest)
        assert all(len(m.changelog_files) == 5 for m in latest)
    if sizes_levels(opts):  # incremental mode (auto sizes with an inline ratio only)
        # sizes derived from each partition's state (a tenth of it above the bottom level)
        for m in latest:
            bases = _level_bases(state, m)
            assert bases - {ROCKSDB_BASE}, (m.path, bases)
            ssts = sum(f.size for f in m.db_files if f.name.endswith(".sst"))
            assert all(0 < int(b) <= ssts // 4 for b in bases - {ROCKSDB_BASE}), (bases, ssts)
    else:  # materializations ten batches apart keep RocksDB's own sizes
        assert all(_level_bases(state, m) == {ROCKSDB_BASE} for m in latest)


def test_changelog_mode_with_inline_materializations_sizes_levels(spark, tmp_path):
    # materialize_inline_ratio: a small batch's snapshot (its flush) is uploaded in its
    # critical path instead of its changelog, so its checkpoint is a materialization of its
    # own batch; a batch after which RocksDB compacted publishes its changelog and
    # materializes in the background. The level sizes are derived as in incremental mode.
    be, opts, data, state, store = _run_query(spark, tmp_path, 11, checkpoint_mode="changelog",
                                              materialize_inline_ratio=2)
    restore_dir = str(tmp_path / "restore")
    inline = 0
    for n in range(6):
        rec = be.coordinator(OP).get(n)
        for _p, rel in sorted(rec.manifests.items()):
            m = read_manifest(store, rel, operator_id=OP)
            assert m.mode == "changelog", m.path
            if m.materialized_id == n:
                assert m.changelog_files == () and m.pending_materialization is None
                assert m.metrics["changelog"]["materialized_inline"] is True
                inline += n > 0
            else:  # a compaction's rewrite, in the background
                assert m.pending_materialization is not None, m.path
                assert m.pending_materialization.checkpoint_id == n, m.path
                assert m.changelog_files[-1].name == changelog_name(n), m.path
            if n == 0:
                assert _level0_files(state, opts, m, restore_dir) == 0, m.path
            if n == 5:
                bases = _level_bases(state, m)
                assert bases - {ROCKSDB_BASE}, (m.path, bases)
    assert inline >= 6, inline  # of the 10 small checkpoints (5 batches, 2 partitions)
    # the state read back (the last batch's materialization) is every key's running count
    rows = be.read_state(spark, OP, state_name="columnState").toPandas()
    assert {r["key"]["k"]: r["value"]["c"] for _, r in rows.iterrows()} == \
        running_counts(data)[1]


@pytest.mark.parametrize("rolling", [None])  # 0: tests/checkpoint/test_auto_mode.py
def test_auto_mode_switches_a_large_partition_to_changelog(spark, tmp_path, rolling):
    # checkpoint_mode="auto" with the line at 1 MiB; every batch after the load restores a
    # state over the line, on the instance kept open in its worker (or its working
    # directory, in another worker process), and checkpoints in changelog mode. By default
    # (rolling_slices=None) the load (~5 MB a partition, from empty state) is written as
    # rolling slices and the later batches rewrite a slice each with their changelog's
    # pieces; with rolling_slices=0 the load checkpoints incrementally and the later
    # batches' small snapshots go inline. The answers and the state read back are Spark's.
    be, opts, data, state, store = _run_query(spark, tmp_path, 13, checkpoint_mode="auto",
                                              auto_changelog_size="1m",
                                              rolling_slices=rolling)
    modes = {}
    for n in range(6):
        rec = be.coordinator(OP).get(n)
        for p, rel in sorted(rec.manifests.items()):
            m = read_manifest(store, rel, operator_id=OP)
            modes[n, p] = m.mode
            if n > 0:
                assert m.metrics["restore"]["source"] in ("resident", "working_dir"), m.path
            if rolling is None:  # units (every one of the load's), no snapshot files
                assert m.slices and not m.db_files, m.path
                assert n > 0 or all(u.checkpoint_id == 0 for u in m.slices), m.slices
    first = "changelog" if rolling is None else "incremental"
    assert {modes[0, p] for p in (0, 1)} == {first}, modes
    assert {v for (n, _p), v in modes.items() if n > 0} == {"changelog"}, modes
    rows = be.read_state(spark, OP, state_name="columnState").toPandas()
    assert {r["key"]["k"]: r["value"]["c"] for _, r in rows.iterrows()} == \
        running_counts(data)[1]
