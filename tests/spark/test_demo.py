"""The README demo: runs, checks its own totals, and resumes with correct totals when more
input arrives after a stop (Spark resumes from its checkpoint, we from ours)."""

from __future__ import annotations

import re

import pytest

from statebackend import demo

pytestmark = pytest.mark.spark


def test_demo_runs_and_resumes_with_correct_totals(spark, tmp_path, capsys):
    common = ["--dir", str(tmp_path / "demo"), "--events", "400", "--keys", "60",
              "--partitions", "2"]
    assert demo.main(common + ["--batches", "2"]) == 0
    first = capsys.readouterr().out
    assert "batch   1" in first and "totals match" in first
    # the job stopped; more input arrives; the same command continues from committed state
    assert demo.main(common + ["--batches", "4"]) == 0
    second = capsys.readouterr().out
    assert "batch   0" not in second and "batch   3" in second
    # the state of the last committed batch came from this machine: the instances the
    # workers kept open, their directories, or the local copies; never downloaded
    (sources,) = re.findall(r"restore (\S+) \|", second.split("batch   2", 1)[1])[:1]
    counts = {s: int(n) for s, n in (kv.split(":") for kv in sources.split(","))}
    assert set(counts) <= {"resident", "working_dir", "local_copy"} and sum(counts.values()) == 2
    assert "totals match" in second
