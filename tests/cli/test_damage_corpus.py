"""A corpus of damaged checkpoints, in both checkpoint modes (issue 23): each damage ends in
a typed error naming the damaged file, or in a restore identical to the undamaged state;
never in another state.

The restore is the one a task of the next batch does: the latest completed record, the
manifests it names (checked against it), then each partition's RocksDB from durable storage
(no local copy) with its changelogs replayed.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable

import pytest
from test_cli_verify import edit_manifest, manifest_file, record, write_record

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint.fencing import claim, epoch_path
from statebackend.coordinator import CheckpointCoordinator
from statebackend.errors import CorruptStateError, RestoreError, StateBackendError
from statebackend.options import StateBackendOptions
from statebackend.storage import open_store
from statebackend.storage.manifests import read_recorded_manifests
from statebackend.storage.records import read_latest_record

OP = "op"
MAXP = 32  # tests/cli/conftest.py builds with it


def restore_all(url: str, tmp: str) -> dict[int, dict]:
    """Partition -> every entry of every column family, as a task restores it."""
    store = open_store(url, backoff_s=0.0, retries=0)
    ostore = store.child(OP)
    rec = read_latest_record(store, OP)
    assert rec is not None
    out = {}
    for p, m in read_recorded_manifests(ostore, rec).items():
        cp = PartitionCheckpointer(store, OP, p, StateBackendOptions(max_parallelism=MAXP),
                                   os.path.join(tmp, uuid.uuid4().hex[:8]))
        inst, _ = cp.restore(m)
        try:
            out[p] = {cf: dict(inst.scan_range(cf, b"", None))
                      for cf in inst.column_family_names()}
        finally:
            inst.close()
    return out


def latest(url: str) -> int:
    return max(int(f[4:-5]) for f in os.listdir(os.path.join(url, OP, "_checkpoints"))
               if f.startswith("chk-"))


def sst_of(url: str, n: int, p: int) -> dict:
    with open(manifest_file(url, n, p)) as fh:
        return next(f for f in json.load(fh)["files"] if f["name"].endswith(".sst"))


def flip_bytes(path: str) -> None:
    with open(path, "rb") as fh:
        data = fh.read()
    mid = len(data) // 2
    with open(path, "wb") as fh:
        fh.write(data[:mid] + bytes(b ^ 0xFF for b in data[mid:mid + 64]) + data[mid + 64:])


# Each damage changes the copy at ``url`` and returns the path (relative to the operator
# root) a typed error must name, or None when it must be repaired transparently.
def manifest_sst_entry_removed(url: str) -> str | None:
    n = latest(url)
    sst = sst_of(url, n, 0)["name"]
    edit_manifest(url, n, 0, lambda d: d.update(
        files=[f for f in d["files"] if f["name"] != sst]), resign=False)
    return record(url, n)["manifests"]["0"]


def manifest_sst_entry_removed_and_record_resigned(url: str) -> str | None:
    n = latest(url)
    sst = sst_of(url, n, 0)["name"]
    edit_manifest(url, n, 0, lambda d: d.update(
        files=[f for f in d["files"] if f["name"] != sst]))
    return record(url, n)["manifests"]["0"]


def key_groups_overlap(url: str) -> str | None:
    n = latest(url)
    edit_manifest(url, n, 0, lambda d: d.update(key_group_end=d["key_group_end"] + 1))
    return record(url, n)["manifests"]["0"]


def record_points_at_older_manifest(url: str) -> str | None:
    n = latest(url)
    rec = record(url, n)
    rec["manifests"]["0"] = record(url, n - 1)["manifests"]["0"]
    write_record(url, n, rec)
    return f"_checkpoints/chk-{n}.json"


def record_misses_a_partition(url: str) -> str | None:
    n = latest(url)
    rec = record(url, n)
    del rec["manifests"]["1"]
    write_record(url, n, rec)
    return f"_checkpoints/chk-{n}.json"


def latest_record_deleted(url: str) -> str | None:
    n = latest(url)
    os.remove(os.path.join(url, OP, "_checkpoints", f"chk-{n}.json"))
    return f"_checkpoints/chk-{n}.json"


def sst_bytes_flipped(url: str) -> str | None:
    f = sst_of(url, latest(url), 0)
    flip_bytes(os.path.join(url, OP, f["path"]))
    return f["path"]


def sst_deleted(url: str) -> str | None:
    f = sst_of(url, latest(url), 1)
    os.remove(os.path.join(url, OP, f["path"]))
    return f["path"]


def manifest_truncated(url: str) -> str | None:
    rel = record(url, latest(url))["manifests"]["1"]
    path = os.path.join(url, OP, rel)
    with open(path, "rb") as fh:
        data = fh.read()
    with open(path, "wb") as fh:
        fh.write(data[: len(data) // 2])
    return rel


def changelog_entry_removed_and_record_resigned(url: str) -> str | None:
    n = latest(url)
    with open(manifest_file(url, n, 0)) as fh:
        logs = [f for f in json.load(fh)["files"] if f["name"].startswith("changelog-")]
    if not logs:
        pytest.fail("the latest checkpoint of the changelog build replays changelogs")
    edit_manifest(url, n, 0, lambda d: d.update(
        files=[f for f in d["files"] if f["name"] != logs[0]["name"]]))
    return None  # the error names the changelog after the gap (or the manifest)


DAMAGES: list[Callable[[str], str | None]] = [
    manifest_sst_entry_removed, manifest_sst_entry_removed_and_record_resigned,
    key_groups_overlap, record_points_at_older_manifest, record_misses_a_partition,
    latest_record_deleted, sst_bytes_flipped, sst_deleted, manifest_truncated,
]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.__name__)
def test_every_damage_is_a_typed_error_naming_the_file_never_another_state(
        built, built_copy, tmp_path, damage):
    undamaged = restore_all(built.url, str(tmp_path / "ref"))
    named = damage(built_copy.url)
    try:
        got = restore_all(built_copy.url, str(tmp_path / "try"))
    except (CorruptStateError, RestoreError) as exc:
        assert named is not None
        assert named in str(exc) or getattr(exc, "path", None) == named, (named, str(exc))
        return
    except StateBackendError as exc:  # typed, but not the integrity error: not expected
        pytest.fail(f"{damage.__name__}: {type(exc).__name__}: {exc}")
    assert got == undamaged, f"{damage.__name__} restored another state"


@pytest.mark.parametrize("built", ["changelog"], indirect=True)
def test_a_changelog_gap_with_consistent_json_is_refused(built, built_copy, tmp_path):
    undamaged = restore_all(built.url, str(tmp_path / "ref"))
    changelog_entry_removed_and_record_resigned(built_copy.url)
    try:
        got = restore_all(built_copy.url, str(tmp_path / "try"))
    except CorruptStateError as exc:
        assert "changelog" in str(exc) and exc.path is not None
        return
    assert got == undamaged


def test_a_deleted_latest_record_is_completed_again_by_the_next_start(built_copy, tmp_path):
    n = latest(built_copy.url)
    before = record(built_copy.url, n)
    latest_record_deleted(built_copy.url)
    store = open_store(built_copy.url)
    with pytest.raises(CorruptStateError, match=f"chk-{n}.json"):
        read_latest_record(store, OP)
    coord = CheckpointCoordinator(store, OP, 2, MAXP, num_retained=10)  # a restart's planning
    assert coord.latest().checkpoint_id == n
    again = record(built_copy.url, n)
    assert again["manifests"] == before["manifests"]
    assert again["manifest_digests"] == before["manifest_digests"]
    assert read_latest_record(store, OP).checkpoint_id == n


def test_an_edited_writer_epoch_is_a_typed_error(built_copy):
    ostore = open_store(built_copy.url).child(OP)
    claim(ostore, "q", "run-1")
    with open(os.path.join(built_copy.url, OP, epoch_path(1)), "w") as fh:
        fh.write('{"epoch": 1, "run_id": "someone"}')
    with pytest.raises(CorruptStateError, match="epoch-000000000001.json"):
        claim(ostore, "q", "run-2")


# --- issue 34: damage to what fencing and the pointer rest on, and subtler swaps ----------
#
# Each returns (path a typed error must name or None for an exact restore, what the next
# start of the query leaves: "exact" state or "error" naming the same path).


def write_latest(url: str, body: bytes) -> None:
    with open(os.path.join(url, OP, "_checkpoints", "LATEST.json"), "wb") as fh:
        fh.write(body)


def latest_pointer_malformed(url: str) -> tuple[str | None, str]:
    write_latest(url, b'{"checkpoint_id": "x')
    return "_checkpoints/LATEST.json", "exact"


def latest_pointer_forward(url: str) -> tuple[str | None, str]:
    n = latest(url) + 3
    write_latest(url, json.dumps({"checkpoint_id": n}).encode())
    return f"_checkpoints/chk-{n}.json", "exact"


def latest_pointer_backward(url: str) -> tuple[str | None, str]:
    write_latest(url, json.dumps({"checkpoint_id": latest(url) - 1}).encode())
    return None, "exact"


def latest_record_deleted_and_pointer_rewritten(url: str) -> tuple[str | None, str]:
    """A silent rollback but for the metrics the completion wrote after the record."""
    from statebackend.metrics_store import record_checkpoint

    n = latest(url)
    store = open_store(url)
    rec = read_latest_record(store, OP)
    record_checkpoint(store, rec, None, None)  # as complete_pending does after completion
    os.remove(os.path.join(url, OP, "_checkpoints", f"chk-{n}.json"))
    write_latest(url, json.dumps({"checkpoint_id": n - 1}).encode())
    return f"_checkpoints/chk-{n}.json", "exact"  # the next start completes it again


def older_checkpoint_manifest_edited(url: str) -> tuple[str | None, str]:
    edit_manifest(url, latest(url) - 2, 0, lambda d: d.update(created_at_ms=1), resign=False)
    return None, "exact"  # reported by verify for that checkpoint, skipped by restores


def writer_epoch_files_deleted(url: str) -> tuple[str | None, str]:
    ostore = open_store(url).child(OP)
    claim(ostore, "q", "run-1")
    claim(ostore, "q", "run-2")
    os.remove(os.path.join(url, OP, epoch_path(1)))
    return None, "exact"  # fencing's business (a gap verify reports), not the state's


def sst_swapped_for_another_partitions(url: str) -> tuple[str | None, str]:
    """The entry of one SST of partition 0 points at an SST of partition 1 with its size
    and checksum, the record re-signed: every file is intact, the snapshot is not p0's."""
    n = latest(url)
    other = sst_of(url, n, 1)
    mine = sst_of(url, n, 0)
    edit_manifest(url, n, 0, lambda d: d.update(files=[
        {**f, "path": other["path"], "size": other["size"], "checksum": other["checksum"]}
        if f["name"] == mine["name"] else f for f in d["files"]]))
    # RocksDB refuses the file (its unique id is not the one its MANIFEST recorded); the
    # error names the partition manifest. Without --deep, verify sees it only when the
    # sizes differ (RocksDB's MANIFEST records each SST's size): here both are the same.
    return record(url, n)["manifests"]["0"], "error"


# verdicts only ``verify --deep`` reaches (the metadata does not show them)
DEEP_ONLY = {"sst_swapped_for_another_partitions"}


def foreign_changelog_listed(url: str) -> tuple[str | None, str]:
    """Partition 0's manifest lists partition 1's changelog (checksums are its own)."""
    n = latest(url)
    with open(manifest_file(url, n, 1)) as fh:
        theirs = [f for f in json.load(fh)["files"] if f["name"].startswith("changelog-")]
    # its test builds the location in changelog mode: a manifest without one is a broken build
    assert theirs, "partition 1 published no changelog: the build was not in changelog mode"
    edit_manifest(url, n, 0, lambda d: d.update(files=[
        theirs[-1] if f["name"] == theirs[-1]["name"] else f for f in d["files"]]))
    return theirs[-1]["path"], "error"


def foreign_changelog_listed_in_the_middle(url: str) -> tuple[str | None, str]:
    """A changelog before partition 0's last one is replaced by partition 1's changelog of
    the same batch: same (base, batch) span, its own checksums, the record re-signed. Only
    the directory tells, and only the segments the manifest records say which is right."""
    n = latest(url)
    with open(manifest_file(url, n, 0)) as fh:
        mine = [f for f in json.load(fh)["files"] if f["name"].startswith("changelog-")]
    with open(manifest_file(url, n, 1)) as fh:
        theirs = {f["name"]: f for f in json.load(fh)["files"]
                  if f["name"].startswith("changelog-")}
    # its test builds a lineage long enough: a changelog before the last one
    assert len(mine) >= 2, f"partition 0 lists {len(mine)} changelog(s): no middle one"
    swapped = theirs[mine[-2]["name"]]
    edit_manifest(url, n, 0, lambda d: d.update(files=[
        swapped if f["name"] == swapped["name"] else f for f in d["files"]]))
    return swapped["path"], "error"


DAMAGES_34 = [latest_pointer_malformed, latest_pointer_forward, latest_pointer_backward,
              latest_record_deleted_and_pointer_rewritten, older_checkpoint_manifest_edited,
              writer_epoch_files_deleted, sst_swapped_for_another_partitions]


def verify_problems(url: str, *flags: str) -> list[dict]:
    import io

    from statebackend.cli import main

    out = io.StringIO()
    code = main(["verify", url, OP, "--json", *flags], out=out)
    got = json.loads(out.getvalue())["problems"]
    assert code == (1 if got else 0)
    return got


def next_start(url: str) -> None:
    """What a restart's planning does before any task: open the coordinator, complete what
    was published."""
    from statebackend.coordinator.pending import complete_pending

    coord = CheckpointCoordinator(open_store(url), OP, 2, MAXP, num_retained=10)
    complete_pending(coord)
    coord.close()


def check_damage(built, built_copy, tmp_path, damage) -> None:
    undamaged = restore_all(built.url, str(tmp_path / "ref"))
    named, after_restart = damage(built_copy.url)
    restore_error = None
    try:
        got = restore_all(built_copy.url, str(tmp_path / "try"))
    except (CorruptStateError, RestoreError) as exc:
        restore_error = exc
    if named is None:
        assert restore_error is None, f"{damage.__name__}: {restore_error}"
        assert got == undamaged, f"{damage.__name__} restored another state"
    else:
        assert restore_error is not None, f"{damage.__name__}: restored, not refused"
        assert named in str(restore_error) or restore_error.path == named, (
            named, str(restore_error))
    # verify's verdict on what a restore reads (the latest checkpoint and the pointer; the
    # older checkpoints and _writers/ are reported too, but a restore never reads them)
    probs = verify_problems(built_copy.url,
                            *(["--deep"] if damage.__name__ in DEEP_ONLY else []))
    newest = max(int(f[4:-5]) for f in os.listdir(os.path.join(built_copy.url, OP,
                                                              "_checkpoints"))
                 if f.startswith("chk-"))
    about_restore = [p for p in probs if not p["path"].startswith("_writers/")
                     and (p["checkpoint_id"] is None or p["checkpoint_id"] >= newest)]
    assert bool(about_restore) == (restore_error is not None), (damage.__name__, probs)
    if named is not None:
        assert any(p["path"] == named for p in about_restore), (named, probs)
    if damage is older_checkpoint_manifest_edited:
        assert any(p["checkpoint_id"] == newest - 2 for p in probs), probs
        import io

        from statebackend.cli import main

        out = io.StringIO()
        assert main(["describe", built_copy.url, OP, "--json"], out=out) == 0
        assert [d["checkpoint_id"] for d in json.loads(out.getvalue())["damaged"]] == [
            newest - 2]
    if damage is writer_epoch_files_deleted:
        assert [p["path"] for p in probs] == [epoch_path(1)], probs
    # the next start of the query: degraded, never stuck, and never another state
    try:
        next_start(built_copy.url)
        got = restore_all(built_copy.url, str(tmp_path / "after"))
    except (CorruptStateError, RestoreError) as exc:
        assert after_restart == "error", f"{damage.__name__} after a restart: {exc}"
        assert named is not None and (named in str(exc) or exc.path == named)
        return
    assert after_restart == "exact", f"{damage.__name__}: a restart restored"
    assert got == undamaged, f"{damage.__name__}: a restart restored another state"


@pytest.mark.parametrize("damage", DAMAGES_34, ids=lambda d: d.__name__)
def test_verify_restore_and_restart_agree_on_each_damage(built, built_copy, tmp_path, damage):
    check_damage(built, built_copy, tmp_path, damage)


@pytest.mark.parametrize("built", ["changelog"], indirect=True)
def test_a_foreign_changelog_with_its_own_checksums_is_refused(built, built_copy, tmp_path):
    check_damage(built, built_copy, tmp_path, foreign_changelog_listed)


def test_a_foreign_changelog_in_the_middle_of_the_lineage_is_refused(
        built_long_lineage, built_long_lineage_copy, tmp_path):
    # verify without --deep gives restore's verdict: the manifest's metadata shows it
    check_damage(built_long_lineage, built_long_lineage_copy, tmp_path,
                 foreign_changelog_listed_in_the_middle)


# --- every remedy a message suggests works -----------------------------------------------


def test_a_malformed_pointer_remedy_delete_it(built, built_copy, tmp_path):
    undamaged = restore_all(built.url, str(tmp_path / "ref"))
    latest_pointer_malformed(built_copy.url)
    with pytest.raises(CorruptStateError, match="Delete it") as bad:
        restore_all(built_copy.url, str(tmp_path / "try"))
    assert bad.value.path == "_checkpoints/LATEST.json"
    os.remove(os.path.join(built_copy.url, OP, "_checkpoints", "LATEST.json"))
    assert restore_all(built_copy.url, str(tmp_path / "after")) == undamaged


def test_a_checkpoint_lost_with_its_files_remedy_delete_the_newer_evidence(
        built, built_copy, tmp_path):
    """The newest record and everything of its checkpoint are gone, but its metrics say it
    completed: readers and the next start refuse; the remedy the message names (delete
    LATEST.json and the later metrics) goes on from the checkpoint before, as it says."""
    import shutil

    from statebackend.metrics_store import record_checkpoint

    url = built_copy.url
    n = latest(url)
    store = open_store(url)
    record_checkpoint(store, read_latest_record(store, OP), None, None)
    os.remove(os.path.join(url, OP, "_checkpoints", f"chk-{n}.json"))
    shutil.rmtree(os.path.join(url, OP, f"chk-{n}"))
    for attempt in (lambda: restore_all(url, str(tmp_path / "try")),
                    lambda: next_start(url)):
        with pytest.raises(CorruptStateError, match="delete _checkpoints/LATEST.json") as bad:
            attempt()
        assert bad.value.path == f"_checkpoints/chk-{n}.json"
        assert "_metrics/" in str(bad.value)
    assert any(p["path"] == f"_checkpoints/chk-{n}.json" for p in verify_problems(url))
    os.remove(os.path.join(url, OP, "_checkpoints", "LATEST.json"))
    os.remove(os.path.join(url, OP, "_metrics", f"chk-{n}.jsonl"))
    next_start(url)
    assert read_latest_record(open_store(url), OP).checkpoint_id == n - 1
    restore_all(url, str(tmp_path / "after"))  # restores, typed checks all pass
    assert not [p for p in verify_problems(url) if not p["path"].startswith("_writers/")]
