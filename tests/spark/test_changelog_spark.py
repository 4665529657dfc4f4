"""Changelog mode end to end: a running count across task retries, a restart, and the loss
of the machine's local state, equal to a failure-free reference; the state it leaves is
readable with read_state and passes `statebackend verify`. With materializations, and with
the default options past auto's line (rolling slices and changelog pieces)."""

from __future__ import annotations

import shutil

import processors as P
import pytest
from harness import check_batches, random_batches, run_stream, running_counts, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.cli import verify_checkpoints
from statebackend.storage import open_store, read_manifest

pytestmark = [pytest.mark.spark, pytest.mark.faults]

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"


def backend(tmp_path, keep_open: bool, ratio: float | None = 0.0) -> RocksDBStateBackend:
    if ratio is None:  # the default for large state: auto's rolling slices, every batch
        opts = StateBackendOptions(parallelism=2, local_dir=str(tmp_path / "local"),
                                   keep_instances_open=keep_open, auto_changelog_size=0,
                                   checkpoint_mode="auto", rolling_slices=None)
    else:
        opts = StateBackendOptions(
            parallelism=2, local_dir=str(tmp_path / "local"), checkpoint_mode="changelog",
            materialize_interval=2, keep_instances_open=keep_open,
            materialize_inline_ratio=ratio, rolling_slices=0)
    return RocksDBStateBackend(str(tmp_path / "state"), opts)


# keep_open: instances stay open in the workers between batches and resume recording;
# ratio 2: small batches checkpoint as their own materializations (materialize_inline_ratio);
# ratio None: the default options past auto's line (rolling slices, changelog pieces)
# (None kept open: tests/checkpoint/test_rolling_default.py; here a machine loss restores
# units and pieces from durable storage)
@pytest.mark.parametrize("keep_open, ratio", [(False, 0.0), (True, 0.0), (False, 2.0),
                                              (False, None)])
def test_running_count_in_changelog_mode_across_retry_restart_and_machine_loss(spark, tmp_path,
                                                                               keep_open, ratio):
    data = random_batches(6, seed=17)
    in_dir, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    write_batches(in_dir, data[:3])
    # FailOnce: partition 0's first attempt of batch 1 fails after updating state
    first = run_stream(spark, in_dir, SCHEMA,
                       lambda df: backend(tmp_path, keep_open, ratio).transform_with_state(
                           df.groupBy("k"), P.FailOnce(), OUT, operator_id="rc"), ck)
    # the machine is lost while the query is down: working directories, local copies and
    # local changelogs are gone; restore is materialization + changelog replay from durable
    if not keep_open:  # (kept-open instances would outlive a real machine loss's processes)
        shutil.rmtree(tmp_path / "local")
    write_batches(in_dir, data[3:], start=3)
    be = backend(tmp_path, keep_open, ratio)
    second = run_stream(spark, in_dir, SCHEMA,
                        lambda df: be.transform_with_state(
                            df.groupBy("k"), P.RunningCount(), OUT, operator_id="rc"), ck)
    ref, totals = running_counts(data)
    check_batches({**first, **second}, ref)
    be.complete("rc")

    store = open_store(str(tmp_path / "state"))
    rec = be.coordinator("rc").latest()
    assert rec is not None and rec.checkpoint_id == 5
    rows = be.read_state(spark, "rc", state_name="count").collect()
    assert {r.key.k: r.value["count"] for r in rows} == totals
    problems, nfiles, _ = verify_checkpoints(store, "rc")
    assert problems == [] and nfiles > 0
    manifests = [read_manifest(store, rel, operator_id="rc") for rel in rec.manifests.values()]
    if ratio is None:  # units and the pieces after them, no materialization
        assert all(m.mode == "changelog" and m.materialization is None and m.slices
                   and not m.changelog_files for m in manifests)
        assert any(d.is_delta for m in manifests for d in m.slices)
        return
    assert all(m.mode == "changelog" and m.materialization is not None for m in manifests)
    if ratio:  # the last batch's small snapshot: its own materialization, no changelog
        assert all(m.materialized_id == 5 and not m.changelog_files for m in manifests)
    else:  # materializations ran in the workers' background threads and were adopted
        assert all(m.changelog_files for m in manifests)
