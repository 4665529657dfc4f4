"""A unit of a rolling checkpoint (``rolling_slices``): which key groups, which batch, which
files, and the names those files take."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["SliceRef", "is_slice_name", "slice_from_dict"]

_SLICE_NAME = re.compile(r"^slice-(\d+)-(\d+)-(\d+)\.sst$|^slice-g-(\d+)\.sst$"
                         r"|^delta-(\d+)-(\d+)-(\d+)\.sbcl$")
UNIT, DELTA = "unit", "delta"


def is_slice_name(name: str) -> bool:
    """Whether ``name`` is a file of a rolling slice (:class:`SliceRef`)."""
    return _SLICE_NAME.match(name) is not None


@dataclass(frozen=True)
class SliceRef:
    """One unit of a rolling checkpoint (``rolling_slices``): the entries of key groups
    ``first_kg..last_kg`` of every column family keyed by key group, as of the end of batch
    ``checkpoint_id``, one SST file per non-empty column family (``column_families[i]`` in
    :meth:`file_name` ``(i)``). ``first_kg = last_kg = -1``: the column families not keyed
    by key group (``_meta``), whole.

    ``kind="delta"``: a piece of batch ``checkpoint_id``'s changelog, its records on key
    groups ``first_kg..last_kg`` (one file in the changelog format, ``delta-...sbcl``); a
    restore replays it onto the key groups whose unit is older than its batch, and it is
    dropped once none is.
    """

    first_kg: int
    last_kg: int
    checkpoint_id: int
    column_families: tuple[str, ...] = ()
    kind: str = UNIT
    of: int = 0  # a unit's count of slices in its cut (0: not recorded)

    def __post_init__(self) -> None:
        if self.column_families.__class__ is not tuple:
            object.__setattr__(self, "column_families", tuple(self.column_families))

    @property
    def is_global(self) -> bool:
        return self.first_kg < 0

    @property
    def is_delta(self) -> bool:
        return self.kind == DELTA

    def file_name(self, i: int) -> str:
        if self.is_delta:
            return f"delta-{self.checkpoint_id}-{self.first_kg}-{self.last_kg}.sbcl"
        if self.is_global:
            return f"slice-g-{i}.sst"
        return f"slice-{self.first_kg}-{self.last_kg}-{i}.sst"

    def file_names(self) -> tuple[str, ...]:
        if self.is_delta:
            return (self.file_name(0),)
        return tuple(self.file_name(i) for i in range(len(self.column_families)))


def slice_from_dict(d: Any) -> SliceRef:
    kind = str(d.get("kind", UNIT))
    if kind not in (UNIT, DELTA):
        raise ValueError(f"slice kind {kind!r} is neither {UNIT!r} nor {DELTA!r}")
    return SliceRef(int(d["first_kg"]), int(d["last_kg"]), int(d["checkpoint_id"]),
                    tuple(str(c) for c in d.get("column_families", ())), kind,
                    int(d.get("of", 0)))
