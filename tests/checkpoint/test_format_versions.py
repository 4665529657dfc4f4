"""Files of a pre-release format are refused with FormatVersionError, never read half-way.

Manifests and completed-checkpoint records of format 1 and changelogs of version 1 could
hold layouts the readers no longer accept (docs/formats.md, "Format versions")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from statebackend.checkpoint.changelog import ChangelogWriter, read_records, span
from statebackend.errors import CorruptStateError, FormatVersionError, IncompatibleStateError
from statebackend.model.manifest import (
    FORMAT_VERSION,
    CompletedCheckpoint,
    FileEntry,
    PartitionManifest,
)


def _manifest() -> PartitionManifest:
    return PartitionManifest(
        operator_id="op", partition=0, checkpoint_id=3, attempt="a1", key_group_start=0,
        key_group_end=127, max_parallelism=128,
        files=(FileEntry("CURRENT", "chk-3/p0/a1/CURRENT", 16, "crc32:00000000", False, True),))


def _record() -> CompletedCheckpoint:
    return CompletedCheckpoint(operator_id="op", checkpoint_id=3, parallelism=1,
                               max_parallelism=128, manifests={0: "chk-3/p0/a1/_MANIFEST.json"},
                               full_size=16, incremental_size=16, created_at_ms=1,
                               committed=True, manifest_digests={0: "1:crc32:00000000"})


def _as_version(text: str, version: object) -> str:
    d = json.loads(text)
    d["format_version"] = version
    return json.dumps(d)


def test_the_current_format_round_trips() -> None:
    m, r = _manifest(), _record()
    assert FORMAT_VERSION == 2
    assert PartitionManifest.from_json(m.to_json()) == m
    assert CompletedCheckpoint.from_json(r.to_json()) == r


@pytest.mark.parametrize("model", [_manifest, _record])
def test_a_format_1_file_is_a_typed_error_naming_it(model) -> None:
    text = _as_version(model().to_json(), 1)
    with pytest.raises(FormatVersionError, match=r"where\.json: .* format 1 .*pre-release") as e:
        type(model()).from_json(text, where="where.json")
    assert isinstance(e.value, IncompatibleStateError)
    assert (e.value.path, e.value.found, e.value.expected) == ("where.json", 1, FORMAT_VERSION)


@pytest.mark.parametrize("model", [_manifest, _record])
@pytest.mark.parametrize("version", [None, 3, "2"])
def test_an_unknown_format_is_corrupt(model, version) -> None:
    with pytest.raises(CorruptStateError, match="not supported"):
        type(model()).from_json(_as_version(model().to_json(), version), where="w")


def test_a_record_without_manifest_digests_is_corrupt() -> None:
    d = json.loads(_record().to_json())
    del d["manifest_digests"]
    with pytest.raises(CorruptStateError, match="malformed"):
        CompletedCheckpoint.from_json(json.dumps(d), where="w")


def test_a_version_1_changelog_is_a_typed_error(tmp_path: Path) -> None:
    w = ChangelogWriter(str(tmp_path / "c.sbcl"))
    w.write("default", {b"k": b"v"})
    w.finish(base=-1, batch=0)
    data = Path(w.path).read_bytes()
    assert span(data) == (-1, 0) and len(list(read_records(data))) == 1
    old = data[:4] + bytes([1]) + data[5:]
    with pytest.raises(FormatVersionError, match="changelog format 1"):
        span(old, "c.sbcl")
    with pytest.raises(FormatVersionError):
        list(read_records(old, "c.sbcl"))
