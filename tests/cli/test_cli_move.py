"""``statebackend move`` without Spark: its output on a shuffle-plan location, and each bad
argument refused with the documented exit code and nothing written (the whole move with
Spark, following the printed step: tests/spark/test_carrier_migration.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

from test_cli_bad_input import run

if TYPE_CHECKING:
    from conftest import Built


def _savepoints(url: str, op: str) -> list[str]:
    where = os.path.join(url, op, "_savepoints")
    return sorted(os.listdir(where)) if os.path.isdir(where) else []


def test_move_writes_the_savepoint_and_prints_the_restart_step(capsys, built_copy: Built,
                                                              tmp_path):
    to = str(tmp_path / "new-state")
    code, out, err = run(capsys, "move", built_copy.url, "op", "--to", to, "--json")
    assert code == 0, err
    step = json.loads(out)
    sp = f"{built_copy.url}/op/_savepoints/move-to-carrier"
    assert step["savepoint"] == step["from_savepoint"] == sp
    assert step["checkpoint_id"] == built_copy.checkpoints - 1
    assert (step["state_location"], step["placement"]) == (to, "carrier")
    assert _savepoints(built_copy.url, "op") == ["move-to-carrier"]
    # the text form is the restart step itself
    code, out, _ = run(capsys, "move", built_copy.url, "op", "--to", to, "--name", "b")
    assert code == 0
    assert "NEW Spark checkpointLocation" in out and 'placement="carrier"' in out
    assert f"from_savepoint={built_copy.url + '/op/_savepoints/b'!r}" in out
    assert f"RocksDBStateBackend({to!r}" in out


def test_a_move_of_an_unknown_operator_or_no_state_exits_3(capsys, built: Built, tmp_path):
    code, out, err = run(capsys, "move", built.url, "nosuch")
    assert (code, out) == (3, "") and "no completed checkpoint" in err, err
    code, _, err = run(capsys, "move", str(tmp_path / "empty"), "op")
    assert code == 3 and "no completed checkpoint" in err, err
    assert _savepoints(built.url, "nosuch") == []


def test_a_move_onto_state_or_onto_itself_exits_2(capsys, built_copy: Built, tmp_path):
    code, out, err = run(capsys, "move", built_copy.url, "op", "--to", built_copy.url)
    assert (code, out) == (2, "") and "must differ" in err, err
    other = str(tmp_path / "other")
    os.makedirs(os.path.join(other, "op", "_checkpoints"))
    with open(os.path.join(other, "op", "_checkpoints", "x"), "w") as f:
        f.write("x")
    code, out, err = run(capsys, "move", built_copy.url, "op", "--to", other)
    assert (code, out) == (2, "") and "already holds state" in err, err
    assert _savepoints(built_copy.url, "op") == []


def test_a_move_without_a_location_is_bad_usage(capsys):
    code, _, err = run(capsys, "move")
    assert code == 2 and "usage:" in err


def test_python_dash_m_statebackend_is_the_command(built_copy: Built, tmp_path):
    """``python -m statebackend move`` (no console script on PATH) moves as the command
    does, and refuses a bad argument with the same exit code."""
    to = str(tmp_path / "new-state")
    done = subprocess.run([sys.executable, "-m", "statebackend", "move", built_copy.url, "op",
                           "--to", to, "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state_location"] == to
    assert _savepoints(built_copy.url, "op") == ["move-to-carrier"]
    bad = subprocess.run([sys.executable, "-m", "statebackend", "move", built_copy.url],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "OPERATOR" in bad.stderr.upper(), bad.stderr
