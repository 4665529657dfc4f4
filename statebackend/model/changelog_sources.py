"""Whose directory each changelog of a changelog-mode manifest must come from (pure).

A changelog is replayed onto the state of the partition that wrote it, and lives in that
partition's directory: ``chk-<n>/p<q>/<attempt>/changelog-<n:012d>.sbcl``. A lineage
(a base materialization and the changelogs after it) stays in its own partition's
directory until a rescale: the first checkpoint after one builds on the first overlapping
old partition's checkpoint (``restore_rescaled``'s ``sources[0]``), whose changelogs, up
to the rescale point, come before this partition's own. Each rescale the lineage still
replays adds one such segment. The old layout's directory may carry this partition's
*number* (2 -> 4 -> 3 partitions: new p1 runs through old p1, then old p2, then its own
p1), so a directory alone does not say whether a changelog belongs.

So the writer records the segments in the manifest (``changelog_sources``): ordered
``(partition, through)`` pairs, each saying that the lineage's changelogs of batches after
the previous pair's ``through`` and up to this one's are in ``p<partition>``; the
changelogs after the last pair are the partition's own. A reader checks every changelog
against them (:func:`foreign`) from the manifest alone: a manifest edited to list another
partition's changelog of the same batch (its span and checksums are right, so the chain
check passes) is refused. Manifests written before the field existed (``None``) keep the
weaker rule of :func:`foreign_legacy`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

__all__ = ["ChangelogSource", "changelog_home", "changelog_id", "changelog_name",
           "checked_sources", "derived_sources", "extended_sources", "foreign",
           "foreign_legacy", "is_changelog_name", "live_sources", "misplaced"]

_CHANGELOG_NAME = re.compile(r"^changelog-(\d{12})\.sbcl$")
_CHANGELOG_DIR = re.compile(r"^chk-(\d+)/p(\d+)/[^/]+/[^/]+$")


def changelog_name(checkpoint_id: int) -> str:
    """File name of the changelog of batch ``checkpoint_id`` (names sort in batch order)."""
    return f"changelog-{checkpoint_id:012d}.sbcl"


def is_changelog_name(name: str) -> bool:
    return _CHANGELOG_NAME.match(name) is not None


def changelog_id(name: str) -> int:
    m = _CHANGELOG_NAME.match(name)
    if m is None:
        raise ValueError(f"{name!r} is not a changelog file name")
    return int(m.group(1))


class ChangelogSource(NamedTuple):
    """One segment of a lineage in another partition's directory: its changelogs up to
    batch ``through`` (after the previous segment's) are in ``p<partition>``."""

    partition: int
    through: int


class _Entry(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str: ...


E = TypeVar("E", bound=_Entry)
Sources = tuple[ChangelogSource, ...]


def checked_sources(value: Iterable[Any]) -> Sources:
    """``value`` (JSON gives lists) as segments; ValueError unless each is a pair of
    non-negative ints and the ``through`` bounds strictly increase."""
    items = list(value)
    out: list[ChangelogSource] = []
    for item in items:
        pair = tuple(item)
        if len(pair) != 2 or any(type(x) is not int or x < 0 for x in pair):
            raise ValueError(f"changelog source {item!r} is not a pair of non-negative "
                             f"integers (partition, through)")
        if out and pair[1] <= out[-1].through:
            raise ValueError(f"changelog sources {items!r} do not end at increasing "
                             f"batches")
        out.append(ChangelogSource(*pair))
    return tuple(out)


def _home_partition(sources: Sources, own: int, batch: int) -> int:
    return next((s.partition for s in sources if batch <= s.through), own)


def changelog_home(sources: Sources, own: int, batch: int) -> str:
    """The directory (``chk-<batch>/p<q>/``) the changelog of ``batch`` of partition
    ``own``'s lineage was written in, by ``sources``."""
    return f"chk-{batch}/p{_home_partition(sources, own, batch)}/"


def misplaced(f: _Entry, own: int, sources: Sources | None) -> str:
    """What is wrong with changelog ``f`` of partition ``own``'s lineage, which
    :func:`foreign` (or :func:`foreign_legacy`, ``sources`` None) returned: for the
    messages of the restore, the writer and ``verify``."""
    wrote = "" if sources is None else \
        f" (its lineage wrote that batch in {changelog_home(sources, own, changelog_id(f.name))})"
    return f"changelog {f.path} was written by another partition than {own}{wrote}"


def _directory(path: str) -> tuple[int, int] | None:
    """``(n, q)`` of a durable path ``chk-<n>/p<q>/<attempt>/<name>``; None otherwise."""
    m = _CHANGELOG_DIR.match(path)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def foreign(logs: Sequence[E], own: int, sources: Sources) -> tuple[E, ...]:
    """The changelogs of ``logs`` not at the path partition ``own``'s lineage wrote them
    at: ``<changelog_home>/<attempt>/<name>``. All of them, in order."""
    def at_home(f: E) -> bool:
        n = changelog_id(f.name)
        return _directory(f.path) == (n, _home_partition(sources, own, n)) \
            and posixpath.basename(f.path) == f.name

    return tuple(f for f in logs if not at_home(f))


def foreign_legacy(logs: Sequence[E], db_files: Sequence[_Entry], own: int) -> tuple[E, ...]:
    """The rule for manifests without ``changelog_sources`` (written before it existed):
    only the end of the lineage says whose it is. Its last changelog in another
    partition's directory after anything of this partition's is another partition's
    state; a foreign changelog edited in *before* this partition's last one looks like a
    rescale's lineage and is not seen here (``verify --deep`` reads the entries)."""
    pid = f"p{own}"

    def part(f: _Entry) -> str | None:
        parts = f.path.split("/")
        return parts[1] if len(parts) > 2 and parts[0].startswith("chk-") else None

    if not logs or part(logs[-1]) == pid:
        return ()
    earlier = [part(f) for f in (*db_files, *logs[:-1])]
    return (logs[-1],) if pid in earlier or part(logs[-1]) is None else ()


def derived_sources(logs: Sequence[_Entry], own: int) -> Sources:
    """The segments of a manifest written without ``changelog_sources``, from where its
    changelogs are: each run of consecutive changelogs in one partition's directory is a
    segment up to its last batch, but a final run in ``p<own>`` is the partition's own.
    The manifest passed :func:`foreign_legacy` when it was restored; what that rule does
    not see stays unseen."""
    out: list[ChangelogSource] = []
    for f in logs:
        where = _directory(f.path)
        if where is None:
            continue  # refused by the strict check of the manifest built on it
        if out and out[-1].partition == where[1]:
            out[-1] = ChangelogSource(where[1], changelog_id(f.name))
        else:
            out.append(ChangelogSource(where[1], changelog_id(f.name)))
    if out and out[-1].partition == own:
        out.pop()
    return tuple(out)


def extended_sources(sources: Sources, partition: int, through: int) -> Sources:
    """``sources`` followed by ``p<partition>``'s changelogs up to ``through`` (a base of
    another key-group range: a rescale)."""
    if sources and through <= sources[-1].through:
        return sources  # that segment holds no batch
    if sources and sources[-1].partition == partition:
        return (*sources[:-1], ChangelogSource(partition, through))
    return (*sources, ChangelogSource(partition, through))


def live_sources(sources: Sources, logs: Sequence[_Entry]) -> Sources:
    """The segments a manifest listing ``logs`` still needs: none ends before its first
    changelog (a materialization, an adoption or rolling slices subsumed them)."""
    if not logs:
        return ()
    first = min(changelog_id(f.name) for f in logs)
    return tuple(s for s in sources if s.through >= first)
