"""The ``statebackend`` CLI end to end, on checkpoints of a real streaming run."""

from __future__ import annotations

import io
import json
import os

import pandas as pd
import pytest

from statebackend.cli import main, run_gc
from statebackend.coordinator import CheckpointCoordinator
from statebackend.storage import open_store

pytestmark = pytest.mark.spark

OPERATOR = "rc"  # as the streaming_run fixture (tests/cli/conftest.py) names it
BATCHES = 5


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def files_under(root: str) -> set[str]:
    out = set()
    for d, _, names in os.walk(root):
        for n in names:
            out.add(os.path.relpath(os.path.join(d, n), root))
    return out


def latest_manifest_files(url: str) -> list[dict]:
    code, text = cli("describe", url, OPERATOR, "--json")
    assert code == 0
    return [f for p in json.loads(text)["partitions"] for f in p["file_list"]]


def reference_counts(data: list[pd.DataFrame]) -> dict[str, int]:
    return pd.concat(data).groupby("k").size().astype(int).to_dict()


def test_list_shows_every_retained_checkpoint_with_sizes(streaming_run):
    code, text = cli("list", streaming_run.state_dir, OPERATOR, "--json")
    assert code == 0
    rows = json.loads(text)
    assert [r["checkpoint_id"] for r in rows] == list(range(BATCHES))
    assert all(r["parallelism"] == 2 and r["full_size"] > 0 for r in rows)
    code, text = cli("list", streaming_run.state_dir)
    assert code == 0 and OPERATOR in text


def test_describe_totals_match_the_record(streaming_run):
    code, text = cli("describe", streaming_run.state_dir, OPERATOR, "--json")
    assert code == 0
    d = json.loads(text)
    assert d["checkpoint_id"] == BATCHES - 1
    parts = d["partitions"]
    assert [p["partition"] for p in parts] == [0, 1]
    assert sum(p["shared_bytes"] + p["private_bytes"] for p in parts) == d["full_size"]
    assert sum(p["uploaded_bytes"] for p in parts) == d["incremental_size"]
    assert sum(p["rows"] for p in parts) == len(streaming_run.data[-1])
    assert any(f["shared"] for p in parts for f in p["file_list"])
    assert {s["name"] for s in d["states"]} == {"count"}
    assert all(isinstance(p["logical_bytes"], int) for p in parts)  # keys + values stored
    code, text = cli("describe", streaming_run.state_dir, OPERATOR, "0")
    assert code == 0 and "checkpoint 0" in text and "shared (SST)" in text
    assert "referenced / logical" in text


def test_verify_passes_on_intact_checkpoints(streaming_run):
    code, text = cli("verify", streaming_run.state_dir, OPERATOR)
    assert code == 0, text
    assert text.startswith("OK")


def test_verify_detects_a_deleted_file(streaming_run, tmp_path):
    url = streaming_run.copy(str(tmp_path / "state"))
    victim = next(f for f in latest_manifest_files(url) if f["shared"])
    os.remove(os.path.join(url, OPERATOR, victim["path"]))
    code, text = cli("verify", url, OPERATOR, "--json")
    assert code == 1
    problems = json.loads(text)["problems"]
    assert {p["path"] for p in problems} == {victim["path"]}
    assert problems[0]["what"] == "missing"


def test_verify_detects_a_truncated_file_and_a_flipped_byte(streaming_run, tmp_path):
    url = streaming_run.copy(str(tmp_path / "state"))
    files = [f for f in latest_manifest_files(url) if f["size"] > 16]
    truncated, flipped = files[0], files[-1]
    assert truncated["path"] != flipped["path"]
    with open(os.path.join(url, OPERATOR, truncated["path"]), "r+b") as fh:
        fh.truncate(truncated["size"] // 2)
    with open(os.path.join(url, OPERATOR, flipped["path"]), "r+b") as fh:
        fh.seek(flipped["size"] // 2)
        b = fh.read(1)
        fh.seek(flipped["size"] // 2)
        fh.write(bytes([b[0] ^ 0xFF]))
    code, text = cli("verify", url, OPERATOR)
    assert code == 1
    assert f"{truncated['path']}: size {truncated['size'] // 2} bytes" in text
    assert f"{flipped['path']}: checksum" in text
    # sizes only: the flipped byte goes unnoticed, the truncation does not
    code, text = cli("verify", url, OPERATOR, "--size-only", "--json")
    assert code == 1
    assert [p["path"] for p in json.loads(text)["problems"]] == [truncated["path"]]


def test_gc_dry_run_matches_what_the_coordinator_deletes(streaming_run, tmp_path):
    url = streaming_run.copy(str(tmp_path / "state"))
    before = files_under(url)
    code, text = cli("gc", url, OPERATOR, "--dry-run", "--num-retained", "2", "--json")
    assert code == 0
    plan = json.loads(text)
    assert files_under(url) == before, "a dry run changed the store"
    assert plan["checkpoints"] == list(range(BATCHES - 2))
    assert plan["files"], "retention of 2 out of 5 checkpoints frees files"
    # the coordinator itself, applying num_retained=2 as the gc command does (a driver
    # acting for no run in particular keeps the owner's recorded retention instead)
    store = open_store(url)
    CheckpointCoordinator(store, OPERATOR, parallelism=2, max_parallelism=128,
                          num_retained=2, own_retention=True).close()
    deleted = before - files_under(url)
    assert deleted == set(plan["files"])
    # what is left still verifies, and a second dry run finds nothing more
    assert cli("verify", url, OPERATOR)[0] == 0
    assert run_gc(store, OPERATOR, 2) == ([], [])


def test_gc_without_dry_run_deletes_what_the_dry_run_listed(streaming_run, tmp_path):
    url = streaming_run.copy(str(tmp_path / "state"))
    before = files_under(url)
    _, text = cli("gc", url, OPERATOR, "--dry-run", "--num-retained", "3", "--json")
    planned = json.loads(text)
    code, text = cli("gc", url, OPERATOR, "--num-retained", "3", "--json")
    assert code == 0
    done = json.loads(text)
    assert done["files"] == planned["files"] and done["checkpoints"] == planned["checkpoints"]
    assert before - files_under(url) == set(planned["files"])
    code, text = cli("list", url, OPERATOR, "--json")
    assert [r["checkpoint_id"] for r in json.loads(text)] == [BATCHES - 3, BATCHES - 2,
                                                              BATCHES - 1]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_read_dumps_the_state_a_pandas_reference_predicts(streaming_run, tmp_path, fmt):
    out = str(tmp_path / f"state.{fmt}")
    code, text = cli("read", streaming_run.state_dir, OPERATOR, "--state", "count", "-o", out)
    assert code == 0, text
    frame = pd.read_csv(out) if fmt == "csv" else pd.read_parquet(out)
    assert list(frame.columns) == ["partition_id", "key.k", "state_name", "value.count",
                                   "expiration_ms"]
    got = dict(zip(frame["key.k"], frame["value.count"].astype(int)))
    assert got == reference_counts(streaming_run.data)
    assert frame["key.k"].is_unique
    # a key sits in the partition its key group maps to
    from statebackend.keys.groups import key_groups
    from statebackend.keys.ranges import partition_for_key_group
    kg = key_groups([frame["key.k"].to_numpy()], ["string"], 128)
    assert list(partition_for_key_group(kg, 2, 128)) == list(frame["partition_id"])


def test_read_older_checkpoint_one_partition_all_states_as_json(streaming_run, tmp_path):
    out = str(tmp_path / "p1.csv")
    code, _ = cli("read", streaming_run.state_dir, OPERATOR, "--checkpoint", "1",
                  "--partition", "1", "-o", out)
    assert code == 0
    frame = pd.read_csv(out)
    assert set(frame["partition_id"]) == {1}
    expected = reference_counts(streaming_run.data[:2])
    for k, v in zip(frame["key.k"], frame["value"]):
        assert json.loads(v) == {"count": expected[k]}


def test_metrics_are_recorded_beside_every_checkpoint(streaming_run):
    code, text = cli("metrics", streaming_run.state_dir, OPERATOR, "--partitions")
    assert code == 0
    lines = [json.loads(x) for x in text.splitlines()]
    cps = [x for x in lines if x["kind"] == "checkpoint"]
    parts = [x for x in lines if x["kind"] == "partition"]
    assert [c["checkpoint_id"] for c in cps] == list(range(BATCHES))
    assert [c["rows"] for c in cps] == [len(d) for d in streaming_run.data]
    assert len(parts) == 2 * BATCHES
    for p in parts:
        if p["end_to_end_ms"] is not None:  # Flink's start delay
            assert p["start_delay_ms"] == pytest.approx(
                max(0.0, p["end_to_end_ms"] - p["sync_ms"] - p["async_ms"]))
        assert p["rocksdb"]["estimated_keys"] >= 0
    assert cps[0]["restore_sources"] == {"empty": 2}
    assert cps[-1]["rocksdb"]["estimated_keys"] >= len(reference_counts(streaming_run.data))
    # the names Spark's progress reports, with the same fold over the partition lines
    from statebackend.metrics import PROGRESS_METRICS, STATISTICS_METRICS

    for c in cps:
        prog = c["progress"]
        # the run's options leave RocksDB's statistics off: their names are absent
        assert set(prog) == set(PROGRESS_METRICS) - STATISTICS_METRICS
        assert prog["partitions"] == 2 and prog["input_rows"] == c["rows"]
        assert prog["bytes_uploaded"] == c["bytes_uploaded"] > 0
        assert prog["sync_ms_max"] == c["sync_ms"]
    assert cps[0]["progress"]["restore_empty"] == 2
    assert cps[-1]["progress"]["state_rows"] >= len(reference_counts(streaming_run.data))


@pytest.mark.parametrize("argv, code, message", [
    (["list", "{url}", "nosuch"], 3, "no completed checkpoint"),
    (["describe", "{url}", OPERATOR, "99"], 3, "retained: [0, 1, 2, 3, 4]"),
    (["read", "{url}", OPERATOR, "--state", "nosuch", "-o", "{tmp}/x.csv"], 3,
     "has no state 'nosuch'; its states are ['count']"),
    (["read", "{url}", OPERATOR, "-o", "-", "--format", "parquet"], 2, "standard output"),
    (["changes", "{url}", OPERATOR, "--from", "0", "--to", "1", "-o", "-", "--format",
      "parquet"], 2, "standard output"),
])
def test_errors_have_exit_codes_and_say_what_to_do(streaming_run, tmp_path, capsys, argv,
                                                   code, message):
    argv = [a.format(url=streaming_run.state_dir, tmp=tmp_path) for a in argv]
    assert cli(*argv)[0] == code
    assert message in capsys.readouterr().err


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["verify"])
    assert exc.value.code == 2


def test_savepoint_is_written_beside_the_checkpoints(streaming_run, tmp_path):
    url = streaming_run.copy(str(tmp_path / "state"))
    code, text = cli("savepoint", url, OPERATOR, "--name", "before-upgrade", "--checkpoint",
                     "3", "--json")
    assert code == 0, text
    sp = json.loads(text)
    assert sp["checkpoint_id"] == 3 and sp["entries"] > 0
    assert os.path.exists(os.path.join(url, sp["path"], "_SAVEPOINT.json"))
    # names are never reused
    assert cli("savepoint", url, OPERATOR, "--name", "before-upgrade")[0] == 4
