"""Progress of the long CLI commands: drawn on a terminal (a pseudo-terminal here), absent
when stderr is a pipe or with ``--quiet``; and ``--json`` output of every command that
prints a table parses."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys

import pytest

from statebackend.cli import main

pytestmark = pytest.mark.spark

OPERATOR = "rc"  # as the streaming_run fixture (tests/cli/conftest.py) names it
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(argv: list[str], tty: bool) -> tuple[int, str, str]:
    """``statebackend ARGV`` in a subprocess, its stderr a pseudo-terminal or a pipe."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "statebackend.cli", *argv]
    if not tty:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        return p.returncode, p.stdout, p.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, text=True, env=env)
    os.close(slave)
    err = b""
    while True:  # read while it runs, so a full terminal buffer cannot block it
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    assert proc.stdout is not None
    out = proc.stdout.read()
    return proc.wait(timeout=300), out, err.decode()


@pytest.mark.parametrize("command, label, unit", [
    (["verify"], "verify", "files"),
    (["read", "-o", "{tmp}/out.parquet"], "read", "partitions"),
    (["savepoint", "--name", "sp1"], "savepoint", "partitions"),
])
def test_progress_on_a_terminal_only(streaming_run, tmp_path, command, label, unit):
    url = streaming_run.copy(str(tmp_path / "state"))
    argv = [command[0], url, OPERATOR] + [a.format(tmp=tmp_path) for a in command[1:]]
    code, out, err = run(argv, tty=True)
    assert code == 0, err
    lines = [ln for ln in err.replace("\r\n", "\n").split("\r") if ln.strip()]
    assert lines and all(ln.startswith(f"{label}: ") for ln in lines), err
    # the last redraw: all items and bytes done, a rate and the time left
    last = re.fullmatch(rf"{label}: (\d+)/(\d+) {unit}, ([\d.]+ \w+)/([\d.]+ \w+), "
                        rf"[\d.]+ \w+/s, \d+s left", lines[-1].strip())
    assert last is not None, lines[-1]
    assert last.group(1) == last.group(2) and last.group(3) == last.group(4)
    assert out.strip(), "the result still goes to standard output"
    if command[0] == "savepoint":  # a second savepoint needs another name
        argv[argv.index("sp1")] = "sp2"
    # the same command, stderr not a terminal: no progress; on a terminal with --quiet: none
    code, out2, err2 = run(argv, tty=False)
    assert code == 0 and err2 == "" and out2.strip()
    if command[0] == "savepoint":
        argv[argv.index("sp2")] = "sp3"
    code, _, err3 = run(argv + ["--quiet"], tty=True)
    assert code == 0 and err3.strip() == "", err3


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def test_every_table_command_prints_json(streaming_run, tmp_path):
    url = streaming_run.copy(str(tmp_path / "state"))
    docs = {}
    for argv in (["list", url], ["list", url, OPERATOR], ["describe", url, OPERATOR],
                 ["verify", url, OPERATOR], ["gc", url, OPERATOR, "--dry-run"],
                 ["read", url, OPERATOR, "-o", str(tmp_path / "s.parquet")],
                 ["savepoint", url, OPERATOR, "--name", "j1"],
                 ["migrate-savepoint", url, OPERATOR, "j1", "j2", "--max-parallelism", "256"]):
        code, text = cli(*argv, "--json")
        assert code == 0, (argv, text)
        assert len(text.splitlines()) == 1, (argv, text)  # one document, nothing else
        docs[" ".join(argv[:1] + argv[2:3])] = json.loads(text)
    assert docs["list"][0]["operator"] == OPERATOR
    assert docs["verify rc"]["ok"] is True and docs["verify rc"]["files"] > 0
    assert docs["read rc"]["rows"] > 0 and docs["read rc"]["format"] == "parquet"
    assert docs["migrate-savepoint rc"]["max_parallelism"] == 256
    # metrics are JSON lines with or without --json
    code, text = cli("metrics", url, OPERATOR, "--json")
    assert code == 0 and all(json.loads(x)["kind"] for x in text.splitlines())
