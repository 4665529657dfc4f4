"""``statebackend verify`` checks what a restore checks (issue 23, item 3), in both
checkpoint modes, on state written without Spark (tests/cli/conftest.py ``built``)."""

from __future__ import annotations

import glob
import io
import json
import os

import pytest

from statebackend.checkpoint.restore import open_checkpoint
from statebackend.cli import main
from statebackend.errors import CorruptStateError
from statebackend.model.manifest import PartitionManifest, manifest_digest
from statebackend.storage import open_store
from statebackend.storage.checksum import file_crc32
from statebackend.verify import CHECKS, LoadedCheckpoint, Problem, verify_checkpoints


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, out.getvalue(), err


def record(url: str, n: int) -> dict:
    with open(os.path.join(url, "op", "_checkpoints", f"chk-{n}.json")) as fh:
        return json.load(fh)


def write_record(url: str, n: int, rec: dict) -> None:
    with open(os.path.join(url, "op", "_checkpoints", f"chk-{n}.json"), "w") as fh:
        json.dump(rec, fh)


def manifest_file(url: str, n: int, p: int) -> str:
    return os.path.join(url, "op", record(url, n)["manifests"][str(p)])


def edit_manifest(url: str, n: int, p: int, change, *, resign: bool = True) -> dict:
    """Edit a manifest as valid JSON. ``resign``: also update the digest its record keeps,
    as an editor who knows the format would, so the checks behind the digest are tested
    (without it the digest alone reports the edit)."""
    path = manifest_file(url, n, p)
    with open(path) as fh:
        d = json.load(fh)
    change(d)
    with open(path, "w") as fh:
        json.dump(d, fh)
    if resign:
        with open(path, "rb") as fh:
            digest = manifest_digest(fh.read())
        for rec_path in glob.glob(os.path.join(url, "op", "_checkpoints", "chk-*.json")):
            with open(rec_path) as fh:
                rec = json.load(fh)
            if rec["manifests"].get(str(p)) == os.path.relpath(path, os.path.join(url, "op")):
                rec.setdefault("manifest_digests", {})[str(p)] = digest
                with open(rec_path, "w") as fh:
                    json.dump(rec, fh)
    return d


def problems(capsys, url: str, *extra: str) -> list[dict]:
    code, out, err = cli(capsys, "verify", url, "op", *extra, "--json")
    got = json.loads(out)["problems"]
    assert code == (1 if got else 0), err
    return got


def test_describe_names_each_partitions_checkpoint_mode(capsys, built):
    # checkpoint_mode="auto" chooses per partition: describe says which one each used
    code, out, _ = cli(capsys, "describe", built.url, "op", "--json")
    assert code == 0
    assert [p["mode"] for p in json.loads(out)["partitions"]] == [built.mode] * 2
    code, out, _ = cli(capsys, "describe", built.url, "op")
    assert code == 0
    assert [line.split()[-2] for line in out.splitlines()[-2:]] == [built.mode] * 2, out


@pytest.mark.parametrize("deep", [False, True])
def test_intact_checkpoints_verify_ok(capsys, built, deep):
    flags = ["--deep"] if deep else []
    code, out, _ = cli(capsys, "verify", built.url, "op", *flags)
    assert code == 0 and out.startswith("OK"), out


def latest_with_sst(url: str) -> tuple[int, int, str]:
    """(checkpoint, partition, SST name) of an SST the latest checkpoint's RocksDB needs."""
    n = max(int(f[4:-5]) for f in os.listdir(os.path.join(url, "op", "_checkpoints"))
            if f.startswith("chk-"))
    with open(manifest_file(url, n, 0)) as fh:
        d = json.load(fh)
    return n, 0, next(f["name"] for f in d["files"] if f["name"].endswith(".sst"))


@pytest.mark.parametrize("size_only", [False, True])
def test_a_manifest_missing_one_sst_entry_is_reported_as_restore_refuses_it(
        capsys, built_copy, size_only):
    url = built_copy.url
    n, p, sst = latest_with_sst(url)
    d = edit_manifest(url, n, p, lambda d: d.update(
        files=[f for f in d["files"] if f["name"] != sst]))
    got = problems(capsys, url, *(["--size-only"] if size_only else []))
    assert [(x["checkpoint_id"], x["partition"]) for x in got] == [(n, p)]
    assert f"needs {sst}, which the manifest does not list" in got[0]["what"]
    # what restore does with it: refuses to open (the check above predicts that)
    m = PartitionManifest.from_json(json.dumps(d))
    store = open_store(os.path.join(url, "op"))
    with pytest.raises(Exception, match=sst):
        open_checkpoint(store, m, os.path.join(url, "..", "restore-try")).close()
    # and read and savepoint say so with a typed error and exit 1, no traceback
    code, _, err = cli(capsys, "read", url, "op", "-o", "-", "--key-types", "string")
    assert code == 1 and "CorruptStateError" in err and f"checkpoint {n} partition {p}" in err
    code, _, err = cli(capsys, "savepoint", url, "op")
    assert code == 1 and "CorruptStateError" in err and f"checkpoint {n} partition {p}" in err


def test_deep_reports_a_snapshot_rocksdb_refuses(capsys, built_copy):
    url = built_copy.url
    n, p, sst = latest_with_sst(url)
    edit_manifest(url, n, p, lambda d: d.update(
        files=[f for f in d["files"] if f["name"] != sst]))
    got = problems(capsys, url, "--deep")
    assert any(x["what"].startswith("deep: does not open") and sst in x["what"] for x in got)


def test_deep_reads_every_entry_back(capsys, built_copy):
    """A damaged SST whose recorded checksum was rewritten to match passes the file checks;
    only opening and reading it (RocksDB's block checksums) finds it."""
    url = built_copy.url
    n, p, sst = latest_with_sst(url)
    with open(manifest_file(url, n, p)) as fh:
        entry = next(f for f in json.load(fh)["files"] if f["name"] == sst)
    path = os.path.join(url, "op", entry["path"])
    with open(path, "r+b") as fh:
        fh.seek(entry["size"] // 2)
        b = fh.read(1)
        fh.seek(entry["size"] // 2)
        fh.write(bytes([b[0] ^ 0x55]))
    crc = file_crc32(path)[1]

    def fix(d):
        for f in d["files"]:
            if f["path"] == entry["path"]:
                f["checksum"] = crc
    for k in range(n + 1):  # every manifest that references the file
        for q in (0, 1):
            edit_manifest(url, k, q, fix)
    assert problems(capsys, url) == []
    got = problems(capsys, url, "--deep")
    assert got and all(x["what"].startswith("deep:") for x in got)


def test_a_missing_file_reused_from_an_older_checkpoint_is_reported(capsys, built_copy):
    url = built_copy.url
    n = built_copy.checkpoints - 1
    with open(manifest_file(url, n, 1)) as fh:
        old = next(f for f in json.load(fh)["files"]
                   if not f["path"].startswith(f"chk-{n}/"))
    os.remove(os.path.join(url, "op", old["path"]))
    got = problems(capsys, url, str(n))  # only the latest: the file is not under chk-<n>/
    assert [(x["checkpoint_id"], x["path"], x["what"]) for x in got] == [
        (n, old["path"], "missing")]


def test_a_record_pointing_at_another_checkpoints_manifest_is_reported(capsys, built_copy):
    url = built_copy.url
    n = built_copy.checkpoints - 1
    rec = record(url, n)
    rec["manifests"]["0"] = record(url, n - 1)["manifests"]["0"]
    write_record(url, n, rec)
    got = problems(capsys, url, str(n))
    # the record itself is refused: it names a manifest of another checkpoint
    assert any(x["partition"] == 0 and x["path"] == f"_checkpoints/chk-{n}.json"
               and "not a manifest of that checkpoint and partition" in x["what"]
               for x in got), got


def test_key_group_ranges_that_do_not_tile_are_reported(capsys, built_copy):
    url = built_copy.url
    n = built_copy.checkpoints - 1
    edit_manifest(url, n, 0, lambda d: d.update(key_group_end=d["key_group_end"] + 1))
    got = problems(capsys, url, str(n))
    assert len(got) == 1 and "covers key groups 0-16" in got[0]["what"]


def test_a_record_naming_too_few_partitions_is_reported(capsys, built_copy):
    url = built_copy.url
    n = built_copy.checkpoints - 1
    rec = record(url, n)
    del rec["manifests"]["1"]
    write_record(url, n, rec)
    got = problems(capsys, url, str(n))
    assert any("expected 0..1" in x["what"] for x in got), got


@pytest.mark.parametrize("built", ["changelog"], indirect=True)
def test_a_changelog_removed_from_a_manifest_is_reported(capsys, built_copy):
    url = built_copy.url
    n = built_copy.checkpoints - 1
    with open(manifest_file(url, n, 0)) as fh:
        logs = [f["name"] for f in json.load(fh)["files"] if f["name"].startswith("changelog-")]
    assert logs, "the latest checkpoint of the changelog run replays changelogs"
    edit_manifest(url, n, 0, lambda d: d.update(
        files=[f for f in d["files"] if f["name"] != logs[0]]))
    got = problems(capsys, url, str(n))
    assert len(got) == 1 and got[0]["what"].startswith("changelog:"), got


def test_checks_are_a_list_that_can_be_extended(built):
    seen = []

    def mine(ctx, c: LoadedCheckpoint):
        seen.append((c.checkpoint_id, sorted(c.manifests)))
        if c.checkpoint_id == 1:
            yield Problem(1, None, c.record.path, "mine")

    store = open_store(built.url)
    got, nfiles, _ = verify_checkpoints(store, "op", checks=[*CHECKS, mine])
    assert [p.what for p in got] == ["mine"] and nfiles > 0
    assert seen == [(n, [0, 1]) for n in range(built.checkpoints)]


def test_read_of_a_damaged_snapshot_is_a_typed_error(built_copy):
    from statebackend.read.rows import read_rows

    url = built_copy.url
    n, p, sst = latest_with_sst(url)
    edit_manifest(url, n, p, lambda d: d.update(
        files=[f for f in d["files"] if f["name"] != sst]))
    with pytest.raises(CorruptStateError) as err:
        list(read_rows(open_store(url), "op", key_types=["string"]))
    assert err.value.partition == p and err.value.checkpoint_id == n


def test_a_manifest_edited_after_completion_fails_its_records_digest(capsys, built_copy):
    # valid JSON, a plausible change (one SST entry fewer), the record left as it was: the
    # digest the record keeps tells, in verify and in every reader that restores
    from statebackend.storage.manifests import read_completed_record, read_recorded_manifests

    url = built_copy.url
    n, p, sst = latest_with_sst(url)
    edit_manifest(url, n, p, lambda d: d.update(
        files=[f for f in d["files"] if f["name"] != sst]), resign=False)
    got = problems(capsys, url, str(n))
    assert [(x["checkpoint_id"], x["partition"]) for x in got] == [(n, p)]
    assert "its record says" in got[0]["what"], got
    ostore = open_store(os.path.join(url, "op"))
    rec = read_completed_record(ostore, n)
    with pytest.raises(CorruptStateError, match="its record says") as info:
        read_recorded_manifests(ostore, rec)
    assert info.value.path == rec.manifests[p] and info.value.partition == p


@pytest.mark.parametrize("built", ["changelog"], indirect=True)
@pytest.mark.parametrize("which", ["first", "last"])
def test_a_changelog_removed_with_its_record_resigned_is_refused_by_restore(
        built_copy, tmp_path, which):
    # an editor who knows the format removes a changelog entry and fixes the record's
    # digest: the JSON is consistent, the changelogs are not (each names its base)
    from statebackend.storage.manifests import read_completed_record, read_recorded_manifests

    url = built_copy.url
    n = built_copy.checkpoints - 1
    with open(manifest_file(url, n, 0)) as fh:
        logs = sorted(f["name"] for f in json.load(fh)["files"]
                      if f["name"].startswith("changelog-"))
    victim = logs[0] if which == "first" else logs[-1]
    edit_manifest(url, n, 0, lambda d: d.update(
        files=[f for f in d["files"] if f["name"] != victim]))
    ostore = open_store(os.path.join(url, "op"))
    m = read_recorded_manifests(ostore, read_completed_record(ostore, n), [0])[0]
    with pytest.raises(CorruptStateError, match="changelog") as info:
        open_checkpoint(ostore, m, str(tmp_path / "try")).close()
    assert info.value.checkpoint_id == n and info.value.partition == 0
