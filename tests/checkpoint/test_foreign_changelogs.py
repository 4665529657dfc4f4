"""Which changelogs a manifest may list. A rescale's lineage runs through other partitions'
directories (including one of this partition's number under an older layout), so the
writer records those segments (``changelog_sources``) and a reader checks every changelog
against them; a manifest written before they were recorded keeps the older rule, which
only sees a foreign changelog at the end of the lineage."""

from __future__ import annotations

import json

import pytest

from statebackend.checkpoint.materialize import Lineage
from statebackend.errors import CorruptStateError
from statebackend.model.changelog_sources import (
    ChangelogSource,
    derived_sources,
    extended_sources,
    live_sources,
)
from statebackend.model.manifest import FileEntry, MaterializationRef, PartitionManifest


def _manifest(partition: int, n: int, paths: list[str], sources=None, *,
              kg: tuple[int, int] = (0, 7)) -> PartitionManifest:
    files = tuple(FileEntry(p.rsplit("/", 1)[1], p, 10, "crc32:00000000", False, True) for p in paths)
    return PartitionManifest(operator_id="op", partition=partition, checkpoint_id=n,
                             attempt=f"b{n}-p{partition}", key_group_start=kg[0],
                             key_group_end=kg[1], max_parallelism=8, files=files,
                             mode="changelog", changelog_sources=sources)


def cl(n: int, p: int) -> str:
    return f"chk-{n}/p{p}/b{n}-p{p}/changelog-{n:012d}.sbcl"


def foreign(m: PartitionManifest) -> list[str]:
    return [f.path for f in m.foreign_changelogs()]


# --- with the segments recorded: every changelog is checked ----------------------------


def test_another_partitions_changelog_in_the_middle_is_refused():
    # the same batch's changelog of partition 1 has the same (base, batch) span: only its
    # directory tells, and the recorded segments (none: all partition 0's) say it is wrong
    m = _manifest(0, 3, [cl(1, 0), cl(2, 1), cl(3, 0)], ())
    assert foreign(m) == [cl(2, 1)]
    assert m.changelog_home(2) == "chk-2/p0/"


def test_every_foreign_changelog_is_named_not_only_the_last():
    m = _manifest(0, 4, [cl(1, 1), cl(2, 0), cl(3, 1), cl(4, 0)], ())
    assert foreign(m) == [cl(1, 1), cl(3, 1)]


def test_a_rescale_lineage_through_an_older_layouts_same_number_is_accepted_as_recorded():
    # 2 -> 4 -> 3 partitions: new p1 runs through old p1 (P=2, up to batch 0), old p2
    # (P=4, up to batch 1), then its own p1
    sources = (ChangelogSource(1, 0), ChangelogSource(2, 1))
    assert foreign(_manifest(1, 2, [cl(0, 1), cl(1, 2), cl(2, 1)], sources)) == []


def test_a_rescale_lineage_with_a_segment_swapped_is_refused():
    sources = ((1, 0), (2, 1))
    # batch 1 is old p2's: old p1's changelog of it (this partition's number) is not
    assert foreign(_manifest(1, 2, [cl(0, 1), cl(1, 1), cl(2, 1)], sources)) == [cl(1, 1)]
    # batch 0 is old p1's: old p2's of the same batch is not
    assert foreign(_manifest(1, 2, [cl(0, 2), cl(1, 2), cl(2, 1)], sources)) == [cl(0, 2)]
    # after the last segment every changelog is this partition's own
    assert foreign(_manifest(1, 2, [cl(0, 1), cl(1, 2), cl(2, 2)], sources)) == [cl(2, 2)]


def test_a_changelog_under_another_checkpoints_directory_or_name_is_refused():
    moved = "chk-1/p0/b1-p0/changelog-000000000002.sbcl"  # batch 2's name under chk-1
    renamed = FileEntry("changelog-000000000003.sbcl", cl(2, 0), 10, "crc32:00000000",
                        False, True)
    m = _manifest(0, 3, [cl(1, 0), moved], ())
    m = PartitionManifest(**{**m.__dict__, "files": (*m.files, renamed)})
    assert foreign(m) == [moved, cl(2, 0)]


def test_a_path_outside_the_layout_is_refused():
    odd = "elsewhere/changelog-000000000001.sbcl"
    assert foreign(_manifest(0, 1, [odd], ())) == [odd]


# --- manifests written before the segments were recorded: the older rule ---------------


def test_legacy_a_rescale_lineage_through_an_older_layouts_same_number_is_accepted():
    m = _manifest(1, 2, [cl(0, 1), cl(1, 2), cl(2, 1)])
    assert m.changelog_sources is None and m.changelog_home(1) is None
    assert foreign(m) == []


def test_legacy_a_lineage_of_this_partition_only_is_accepted():
    assert foreign(_manifest(0, 2, [cl(0, 0), cl(1, 0), cl(2, 0)])) == []


def test_legacy_a_new_partition_before_its_first_own_changelog_is_accepted():
    assert foreign(_manifest(2, 1, [cl(0, 1)])) == []


def test_legacy_another_partitions_changelog_in_place_of_the_latest_is_refused():
    assert foreign(_manifest(0, 2, [cl(0, 0), cl(1, 0), cl(2, 1)])) == [cl(2, 1)]


def test_legacy_a_middle_swap_is_not_seen_which_is_why_the_segments_are_recorded():
    assert foreign(_manifest(0, 3, [cl(1, 0), cl(2, 1), cl(3, 0)])) == []


# --- the field on disk --------------------------------------------------------------------


@pytest.mark.parametrize("sources", [None, (), ((1, 0), (2, 5))])
def test_the_field_round_trips_and_none_differs_from_empty(sources):
    m = _manifest(1, 6, [cl(6, 1)], sources)
    back = PartitionManifest.from_json(m.to_json())
    assert back == m
    assert back.changelog_sources == (None if sources is None else tuple(sources))
    assert ("changelog_sources" in json.loads(m.to_json())) == (sources is not None)


def test_a_manifest_written_without_the_field_reads_as_none():
    d = json.loads(_manifest(0, 2, [cl(1, 0), cl(2, 0)], ((3, 0),)).to_json())
    del d["changelog_sources"]  # the bytes a version before the field wrote
    back = PartitionManifest.from_json(json.dumps(d))
    assert back.changelog_sources is None
    assert foreign(back) == []  # the older rule


@pytest.mark.parametrize("bad", [[[1, 5], [2, 5]], [[1, 5], [2, 3]], [[-1, 2]], [[1]],
                                 [["1", 2]], [[1, 2.5]], [[True, 2]], 7])
def test_malformed_sources_are_a_corrupt_manifest(bad):
    d = json.loads(_manifest(0, 6, [cl(6, 0)], ()).to_json())
    d["changelog_sources"] = bad
    with pytest.raises(CorruptStateError, match="malformed"):
        PartitionManifest.from_json(json.dumps(d), "chk-6/p0/a/_MANIFEST.json")


# --- what the writer computes -------------------------------------------------------------


def test_sources_derived_from_a_legacy_manifest_follow_its_directories():
    files = _manifest(1, 3, [cl(0, 1), cl(1, 2), cl(2, 2), cl(3, 1)]).changelog_files
    assert derived_sources(files, 1) == ((1, 0), (2, 2))  # the last run is its own
    assert derived_sources(files[:3], 2) == ((1, 0),)
    assert derived_sources(files[:1], 2) == ((1, 0),)  # before its first own changelog


def test_extended_and_live_sources():
    s = ChangelogSource
    assert extended_sources((), 1, 4) == ((1, 4),)
    assert extended_sources((s(1, 4),), 2, 7) == ((1, 4), (2, 7))
    assert extended_sources((s(1, 4),), 1, 7) == ((1, 7),)  # one directory, one segment
    assert extended_sources((s(1, 4),), 2, 4) == ((1, 4),)  # holds no batch
    logs = _manifest(0, 9, [cl(5, 2), cl(8, 0), cl(9, 0)]).changelog_files
    assert live_sources((s(1, 4), s(2, 7)), logs) == ((2, 7),)  # batch 4 was materialized
    assert live_sources((s(1, 4), s(2, 7)), ()) == ()


def test_lineage_of_a_rescaled_base_adds_its_directory_even_with_this_partitions_number():
    # 4 -> 3: new p1 (key groups 3..5 of 8) built on old p1 (2..3): same number, other range
    base = _manifest(1, 4, [cl(3, 0), cl(4, 1)], ((0, 3),), kg=(2, 3))
    lin = Lineage.continuing(base, 1, (3, 5))
    assert lin.changelog_sources == ((0, 3), (1, 4))
    # not rescaled: the base's segments, nothing added
    assert Lineage.continuing(base, 1, (2, 3)).changelog_sources == ((0, 3),)


def test_lineage_of_a_legacy_base_derives_its_segments():
    base = _manifest(2, 4, [cl(2, 1), cl(3, 1), cl(4, 2)], None, kg=(4, 5))
    assert Lineage.continuing(base, 2, (4, 5)).changelog_sources == ((1, 3),)
    assert Lineage.continuing(base, 1, (3, 5)).changelog_sources == ((1, 3), (2, 4))


def test_lineage_of_another_partition_drops_its_pending_materialization_only():
    base = PartitionManifest(**{**_manifest(1, 4, [cl(4, 1)], (), kg=(2, 3)).__dict__,
                                "pending_materialization": MaterializationRef(4, "x")})
    assert Lineage.continuing(base, 2, (4, 5)).pending is None
    assert Lineage.continuing(base, 1, (3, 5)).pending == MaterializationRef(4, "x")
