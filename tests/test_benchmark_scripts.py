"""The benchmark scripts that drive the partition task directly still run.

They stand in for Spark's task identity (``runner.task_identity``) and call internals a
refactor may change; a stand-in with the wrong signature made ``benchmarks.large_state``
die at its first batch without any test noticing. Each runs here at a toy size (a few
seconds) and its figures are checked, not its speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_task, large_state, requests_per_checkpoint


@pytest.mark.parametrize("mode", ["incremental", "changelog"])
def test_large_state_runs_and_measures_against_the_logical_state(
        tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert large_state.main([
        "--keys", "3000", "--value-bytes", "64", "--batches", "4", "--churn", "0.1",
        "--lifecycle", "open", "--checkpoint-mode", mode, "--latency-ms", "0",
        "--bandwidth-mbps", "10000", "--workdir", str(tmp_path / "work"),
        "--out", str(out)]) == 0
    run = json.loads((out / "large_state.json").read_text())["runs"]["open"]
    batches = run["batches"]
    assert len(batches) == 5  # the load and four batches
    assert all(b["durable_bytes"] > 0 and b["local_bytes"] > 0 for b in batches)
    # every batch after the load changed 10% of the keys and made them durable
    assert all(b["changed_bytes"] > 0 for b in batches[1:])
    assert run["summary"]["logical_bytes"] == 3000 * (large_state.KEY_BYTES + 64)
    summary = run["summary"]
    # every batch after the load made at least its changed keys durable (incompressible values)
    assert summary["written_over_changed_mean"] >= 0.9
    assert summary["written_over_changed_max"] >= summary["written_over_changed_mean"]
    assert summary["restore_over_logical_download"] > 0
    assert set(summary["targets"]) >= {"durable_peak <= 1.5x logical",
                                       "written / changed, mean of the last 50 <= 3x"}
    assert "restore after losing the machine" in capsys.readouterr().out


def test_written_over_changed_is_sums_over_sums_of_the_last_window() -> None:
    rows = [{"uploaded_bytes": 100, "changed_bytes": 10},  # a materialization: 10x
            {"uploaded_bytes": 10, "changed_bytes": 10},
            {"uploaded_bytes": 10, "changed_bytes": 10}]
    w = large_state.written_over_changed(rows, window=2)
    assert w["written_over_changed_mean"] == 4.0  # 120 / 30, not the mean of 10, 1, 1
    assert w["written_over_changed_mean_last2"] == 1.0
    assert w["written_over_changed_max"] == 10.0
    assert w["written_bytes_per_batch_max"] == 100


def test_bench_task_runs_every_default_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_task.main(["--keys", "200", "--rows", "400", "--batches", "2"]) == 0
    text = capsys.readouterr().out
    assert "noop" in text and "count" in text


@pytest.mark.parametrize("mode", ["incremental", "changelog"])
def test_requests_per_checkpoint_counts_requests(
        mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert requests_per_checkpoint.main(
        ["--batches", "3", "--keys", "200", "--mode", mode, "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts and all(isinstance(row, dict) for row in counts.values())
    assert any(v > 0 for row in counts.values() for v in row.values())


def test_cluster_recovery_tells_the_lost_executors_downloads_from_the_others() -> None:
    from benchmarks.cluster_recovery import loss_downloads

    def row(batch: int, partition: int, executor: str, source: str = "resident") -> dict:
        return {"batch": batch, "partition": partition, "executor": executor,
                "source": source}

    rows = [row(4, 0, "0"), row(4, 1, "1"), row(4, 2, "1"), row(4, 3, "0"),
            row(5, 0, "0"), row(5, 1, "2", "durable"), row(5, 2, "0", "durable"),
            row(5, 3, "2", "durable"), row(6, 1, "2"), row(6, 2, "0", "durable"),
            row(7, 3, "0", "durable")]  # batch 7: after the phase
    loss = loss_downloads(rows, 4, range(5, 7))
    assert loss["lost_executor_partitions"] == [1, 2]
    assert loss["lost_partition_downloads"] == {1: 1, 2: 2}
    assert loss["other_partition_downloads"] == {3: 1}


def test_a_kept_state_restores_again(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import restore_kept

    kept = tmp_path / "kept"
    assert large_state.main([
        "--keys", "2000", "--value-bytes", "64", "--batches", "3", "--churn", "0.1",
        "--lifecycle", "open", "--latency-ms", "0", "--bandwidth-mbps", "10000",
        "--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
        "--keep", str(kept)]) == 0
    first = json.loads((tmp_path / "out" / "large_state.json").read_text())
    capsys.readouterr()
    assert restore_kept.main([str(kept), "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    # both restores read what the benchmark's own restore read, from the kept copy
    restored = first["runs"]["open"]["restore"]
    assert out.count(f"for {restored['bytes'] / 1e6:.0f} MB in {restored['files']} files") == 2
    with pytest.raises(SystemExit):  # a directory nothing was kept in: said, not a trace
        restore_kept.main([str(tmp_path / "nothing")])
    assert "--keep" in capsys.readouterr().err
