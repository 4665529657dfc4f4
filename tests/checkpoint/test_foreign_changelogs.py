"""Which changelogs a manifest may list: a rescale's lineage runs through other partitions'
directories (including one of this partition's number under an older layout), while a
manifest edited to end with another partition's changelog is refused."""

from __future__ import annotations

from statebackend.model.manifest import FileEntry, PartitionManifest


def _manifest(partition: int, n: int, paths: list[str]) -> PartitionManifest:
    files = tuple(FileEntry(p.rsplit("/", 1)[1], p, 10, "crc32:00000000", False, True) for p in paths)
    return PartitionManifest(operator_id="op", partition=partition, checkpoint_id=n,
                             attempt=f"b{n}-p{partition}", key_group_start=0,
                             key_group_end=7, max_parallelism=8, files=files,
                             mode="changelog")


def cl(n: int, p: int) -> str:
    return f"chk-{n}/p{p}/b{n}-p{p}/changelog-{n:012d}.sbcl"


def test_a_rescale_lineage_through_an_older_layouts_same_number_is_accepted():
    # 2 -> 4 -> 3 partitions: new p1 runs through old p1 (P=2) and old p2 (P=4)
    m = _manifest(1, 2, [cl(0, 1), cl(1, 2), cl(2, 1)])
    assert m.foreign_changelogs() == ()


def test_a_lineage_of_this_partition_only_is_accepted():
    assert _manifest(0, 2, [cl(0, 0), cl(1, 0), cl(2, 0)]).foreign_changelogs() == ()


def test_a_new_partition_before_its_first_own_changelog_is_accepted():
    assert _manifest(2, 1, [cl(0, 1)]).foreign_changelogs() == ()


def test_another_partitions_changelog_in_place_of_the_latest_is_refused():
    m = _manifest(0, 2, [cl(0, 0), cl(1, 0), cl(2, 1)])
    assert [f.path for f in m.foreign_changelogs()] == [cl(2, 1)]
