"""Every subcommand with bad arguments: the documented exit code, one line on stderr, never
a traceback (issue 23, item 3). Exit codes: 2 bad usage, 3 no such operator, checkpoint,
state or partition (or no state at the URL at all)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # cli's conftest; another directory's conftest may own the name at run time
    from conftest import Built

from statebackend.cli import main

SECRET = "pa55-w0rd-xyz"
COMMANDS = ["list", "describe", "verify", "gc", "read", "metrics", "savepoint",
            "migrate-savepoint", "move"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of one CLI call (argparse's SystemExit included)."""
    out = io.StringIO()
    try:
        code = main(list(argv), out=out)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # the typed paths answered, not the last-resort catch of an unexpected error
    assert "unexpected" not in err
    return code, out.getvalue(), err


def required(command: str, url: str, op: str) -> list[str]:
    """The smallest well-formed argument list of ``command``."""
    return {"list": [url],
            "read": [url, op, "-o", "-", "--format", "csv", "--key-types", "string"],
            "migrate-savepoint": [url, op, "sp", "sp2", "--max-parallelism", "64"],
            }.get(command, [url, op])


@pytest.mark.parametrize("command", COMMANDS)
def test_missing_arguments_exit_2(capsys, command):
    code, _, err = run(capsys, command)
    assert code == 2 and "usage:" in err


def test_no_command_exits_2(capsys):
    assert run(capsys)[0] == 2
    assert run(capsys, "nosuch-command")[0] == 2


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_protocol_exits_2(capsys, command):
    code, _, err = run(capsys, command, *required(command, "bogus://x", "op"))
    assert code == 2
    assert "unknown protocol 'bogus'" in err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("options, why", [("[1]", "must be a JSON object"),
                                          ('"abc"', "must be a JSON object"),
                                          ("{bad", "not valid JSON")])
def test_storage_options_that_are_not_a_json_object_exit_2(capsys, built, command, options,
                                                          why):
    code, _, err = run(capsys, command, *required(command, built.url, built.operator),
                       "--storage-options", options)
    assert code == 2 and why in err


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "list"])
def test_a_missing_operator_exits_3(capsys, built, command):
    code, _, err = run(capsys, command, *required(command, built.url, "nosuch"))
    assert code == 3, err
    assert "nosuch" in err


def test_list_of_a_missing_operator_exits_3(capsys, built):
    assert run(capsys, "list", built.url, "nosuch")[0] == 3


@pytest.mark.parametrize("argv", [
    ["describe", "{url}", "op", "99"],
    ["verify", "{url}", "op", "99"],
    ["read", "{url}", "op", "--checkpoint", "99", "-o", "-", "--key-types", "string"],
    ["savepoint", "{url}", "op", "--checkpoint", "99"],
    ["read", "{url}", "op", "--partition", "7", "-o", "-", "--key-types", "string"],
    ["read", "{url}", "op", "--state", "nosuch", "-o", "-", "--key-types", "string"],
    ["migrate-savepoint", "{url}", "op", "nosuch", "new", "--max-parallelism", "64"],
])
def test_a_missing_checkpoint_partition_state_or_savepoint_exits_3(capsys, built, argv):
    code, _, err = run(capsys, *[a.format(url=built.url) for a in argv])
    assert code == 3, err


@pytest.mark.parametrize("argv", [
    ["describe", "{url}", "op", "-1"],
    ["describe", "{url}", "op", "one"],
    ["verify", "{url}", "op", "x"],
    ["gc", "{url}", "op", "--num-retained", "0"],
    ["gc", "{url}", "op", "--num-retained", "-3"],
    ["gc", "{url}", "op", "--num-retained", "three"],
    ["read", "{url}", "op", "--partition", "-1", "-o", "-"],
    ["changes", "{url}", "op", "--from", "0", "--to", "1", "--partition", "-1", "-o", "-"],
    ["read", "{url}", "op", "--checkpoint", "1.5", "-o", "-"],
    ["read", "{url}", "op"],  # no -o
    ["read", "{url}", "op", "-o", "-", "--format", "parquet"],
    ["read", "{url}", "op", "-o", "-", "--format", "xml"],
    ["metrics", "{url}", "op", "--last", "-1"],
    ["savepoint", "{url}", "op", "--checkpoint", "-2"],
    ["savepoint", "{url}", "op", "--compression", "zip"],
    ["migrate-savepoint", "{url}", "op", "a", "b", "--max-parallelism", "0"],
    ["migrate-savepoint", "{url}", "op", "a", "b", "--max-parallelism", "64",
     "--parallelism", "0"],
    ["migrate-savepoint", "{url}", "op", "a", "b"],  # no --max-parallelism
    ["verify", "{url}", "op", "--no-such-flag"],
])
def test_bad_numbers_and_flags_exit_2(capsys, built, argv):
    code, _, err = run(capsys, *[a.format(url=built.url) for a in argv])
    assert code == 2, err


@pytest.mark.parametrize("as_json", [False, True])
def test_a_path_with_no_state_exits_3(capsys, tmp_path, as_json):
    flags = ["--json"] if as_json else []
    for url in [str(tmp_path / "no" / "such" / "path"), str(tmp_path), "memory://nothing/here"]:
        code, out, err = run(capsys, "list", url, *flags)
        assert code == 3, (url, err)
        assert "no statebackend state" in err and out == ""


def test_credentials_in_the_url_never_reach_the_output(capsys, built):
    url = f"memory://user:{SECRET}@host/state"
    for command in COMMANDS:
        for op in ("op", "nosuch"):
            code, out, err = run(capsys, command, *required(command, url, op))
            assert code in (2, 3), (command, err)
            assert SECRET not in out + err
    code, _, err = run(capsys, "list", f"bogus://user:{SECRET}@host/x")
    assert code == 2 and SECRET not in err and "user:***@host" in err


def test_storage_option_values_never_reach_the_output(capsys, built):
    code, out, err = run(capsys, "list", built.url, "--storage-options",
                         f'{{"password": "{SECRET}", "no_such_kwarg": {{"x": 1}}')
    assert code == 2 and SECRET not in out + err  # not JSON (a brace is missing)


@pytest.mark.parametrize("argv, code", [(["list", "bogus://x"], 2),
                                        (["list", "/no/such/path"], 3),
                                        (["gc", "/no/such/path", "op", "--num-retained", "0"], 2)])
def test_the_console_script_prints_no_traceback(argv, code):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-m", "statebackend.cli", *argv],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.startswith(("statebackend", "usage"))


def test_built_fixture_is_sane(built: Built):
    assert os.path.isdir(os.path.join(built.url, built.operator, "_checkpoints"))


# --- issue 34: each edge exits with the code of what it is ---------------------------------


@pytest.mark.parametrize("argv", [
    ["verify", "{url}", "../x"],
    ["describe", "{url}", "op/../x"],
    ["savepoint", "{url}", "op", "--name", "../sp"],
    ["migrate-savepoint", "{url}", "op", "../sp", "sp2", "--max-parallelism", "64"],
])
def test_an_unsafe_name_is_bad_usage_not_a_storage_error(capsys, built, argv):
    code, _, err = run(capsys, *[a.format(url=built.url) for a in argv])
    assert code == 2 and "unsafe path component" in err, err


def test_an_unknown_key_type_is_bad_usage(capsys, built):
    code, _, err = run(capsys, "read", built.url, "op", "-o", "-", "--format", "csv",
                       "--key-types", "string,nosuch")
    assert code == 2 and "nosuch" in err


def test_key_types_other_than_the_recorded_ones_are_bad_usage_not_corruption(
        capsys, streaming_run, tmp_path):
    # the streaming run records its grouping-key types (string)
    code, _, err = run(capsys, "read", streaming_run.state_dir, streaming_run.operator,
                       "-o", str(tmp_path / "x.csv"), "--key-types", "int,int")
    assert code == 2 and "does not match" in err and "string" in err, err
    # the same types as recorded are fine
    code, _, err = run(capsys, "read", streaming_run.state_dir, streaming_run.operator,
                       "-o", str(tmp_path / "y.csv"), "--key-types", "string")
    assert code == 0, err


@pytest.mark.parametrize("command", ["list", "describe", "verify", "gc"])
def test_an_unreachable_http_store_is_a_storage_error_not_an_empty_one(capsys, command):
    url = "http://127.0.0.1:9/state"  # the discard port: nothing listens
    code, _, err = run(capsys, command, *required(command, url, "op"))
    assert code == 4, err
    assert "no completed checkpoint" not in err and "no statebackend state" not in err
