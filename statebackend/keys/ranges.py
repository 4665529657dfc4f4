"""Key-group ranges: which contiguous key groups partition ``p`` of ``P`` owns, the partition
of a key group, and where a partition's state comes from after a change of parallelism.

Partition ``p`` of ``P`` owns ``[ceil(p*maxP/P), ceil((p+1)*maxP/P) - 1]``, i.e. key group
``kg`` belongs to partition ``kg * P // maxP``. Pure integer arithmetic (numpy for whole
columns); how a key becomes a key group is :mod:`statebackend.keys.groups`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import overload

import numpy as np

from ..errors import OptionsError

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "EMPTY_KEY_GROUP_RANGE",
    "MAX_MAX_PARALLELISM",
    "KeyGroupRange",
    "check_max_parallelism",
    "check_parallelism",
    "key_group_range",
    "partition_for_key_group",
    "rescale_sources",
]

DEFAULT_MAX_PARALLELISM = 128
"""Key groups when the user sets none (Flink's default for small jobs)."""

MAX_MAX_PARALLELISM = 32768
"""Upper bound on key groups: a key group is stored in 2 bytes at the head of every key."""


@dataclass(frozen=True)
class KeyGroupRange:
    """The key groups ``start..end``, both inclusive; empty when ``end == start - 1``.

    Examples
    --------
    >>> r = KeyGroupRange(0, 63)
    >>> 5 in r, len(r), r.intersect(KeyGroupRange(60, 99))
    (True, 64, KeyGroupRange(start=60, end=63))
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise OptionsError(name, v, f"a key-group range {name} must be an int, got {v!r}")
            object.__setattr__(self, name, int(v))  # numpy ints become plain ints
        if self.start < 0 or self.end < self.start - 1 or self.end >= MAX_MAX_PARALLELISM:
            raise OptionsError("end", self.end,
                               f"invalid key-group range {self.start}..{self.end}: need "
                               f"0 <= start <= end + 1 and end < {MAX_MAX_PARALLELISM}")

    def __contains__(self, kg: object) -> bool:
        return isinstance(kg, (int, np.integer)) and bool(self.start <= kg <= self.end)

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    @property
    def is_empty(self) -> bool:
        """True if the range holds no key group."""
        return self.end < self.start

    def intersect(self, other: KeyGroupRange) -> KeyGroupRange:
        """The key groups in both ranges (``EMPTY_KEY_GROUP_RANGE`` if none)."""
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else EMPTY_KEY_GROUP_RANGE


EMPTY_KEY_GROUP_RANGE = KeyGroupRange(0, -1)


def check_max_parallelism(max_parallelism: int) -> None:
    if (not isinstance(max_parallelism, (int, np.integer)) or isinstance(max_parallelism, bool)
            or not 1 <= max_parallelism <= MAX_MAX_PARALLELISM):
        raise OptionsError("max_parallelism", max_parallelism,
                           f"max_parallelism must be an int in 1..{MAX_MAX_PARALLELISM} (key "
                           f"groups are stored in 2 bytes), got {max_parallelism!r}")


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    """Validate a (parallelism, max_parallelism) pair.

    Raises
    ------
    OptionsError
        Unless ``1 <= parallelism <= max_parallelism <= 32768`` (every partition must own
        at least one key group).
    """
    check_max_parallelism(max_parallelism)
    if (not isinstance(parallelism, (int, np.integer)) or isinstance(parallelism, bool)
            or not 1 <= parallelism <= max_parallelism):
        raise OptionsError("parallelism", parallelism,
                           f"parallelism must be an int in 1..max_parallelism "
                           f"({max_parallelism}), got {parallelism!r}; lower parallelism, or "
                           "raise max_parallelism (existing state: through a savepoint "
                           "rewritten by `statebackend migrate-savepoint`)")


def _check_partition(partition: int, parallelism: int) -> None:
    if (not isinstance(partition, (int, np.integer)) or isinstance(partition, bool)
            or not 0 <= partition < parallelism):
        raise OptionsError("partition", partition,
                           f"partition index must be in 0..{parallelism - 1}, got {partition!r}")


def key_group_range(partition: int, parallelism: int,
                    max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> KeyGroupRange:
    """The key groups owned by ``partition`` of ``parallelism``.

    ``[ceil(p*maxP/P), ceil((p+1)*maxP/P) - 1]``; the ranges of all partitions are
    contiguous, disjoint, cover ``0..maxP-1`` and differ in size by at most one.

    Examples
    --------
    >>> key_group_range(1, 3, 128)
    KeyGroupRange(start=43, end=85)
    """
    check_parallelism(parallelism, max_parallelism)
    _check_partition(partition, parallelism)
    start = (partition * max_parallelism + parallelism - 1) // parallelism
    end = ((partition + 1) * max_parallelism + parallelism - 1) // parallelism - 1
    return KeyGroupRange(int(start), int(end))


@overload
def partition_for_key_group(kg: int, parallelism: int, max_parallelism: int = ...) -> int: ...
@overload
def partition_for_key_group(kg: np.ndarray, parallelism: int,
                            max_parallelism: int = ...) -> np.ndarray: ...


def partition_for_key_group(kg: int | np.ndarray, parallelism: int,
                            max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int | np.ndarray:
    """The partition owning key group ``kg``: ``kg * parallelism // max_parallelism``.

    Accepts a scalar or a numpy array of key groups (returns ``int32`` then).
    """
    check_parallelism(parallelism, max_parallelism)
    if isinstance(kg, np.ndarray):
        if kg.dtype.kind not in "iu":
            raise OptionsError("key_group", kg.dtype, "key groups must be an integer array")
        if len(kg) and (int(kg.min()) < 0 or int(kg.max()) >= max_parallelism):
            raise OptionsError("key_group", None,
                               f"key groups must lie in 0..{max_parallelism - 1}")
        return (kg.astype(np.int64) * parallelism // max_parallelism).astype(np.int32)
    if (not isinstance(kg, (int, np.integer)) or isinstance(kg, bool)
            or not 0 <= kg < max_parallelism):
        raise OptionsError("key_group", kg,
                           f"a key group must be an int in 0..{max_parallelism - 1}, got {kg!r}")
    return int(kg) * parallelism // max_parallelism


def rescale_sources(new_partition: int, new_parallelism: int, old_parallelism: int,
                    max_parallelism: int = DEFAULT_MAX_PARALLELISM
                    ) -> list[tuple[int, KeyGroupRange]]:
    """Where the state of a partition comes from after a change of parallelism.

    Returns
    -------
    list of (old_partition, KeyGroupRange)
        Every old partition whose range overlaps the new partition's range, with the
        overlap, in key-group order. The overlaps are disjoint and their union is
        exactly the new partition's range.

    Examples
    --------
    >>> rescale_sources(0, 2, 4, 128)
    [(0, KeyGroupRange(start=0, end=31)), (1, KeyGroupRange(start=32, end=63))]
    """
    check_parallelism(old_parallelism, max_parallelism)
    target = key_group_range(new_partition, new_parallelism, max_parallelism)
    first = partition_for_key_group(target.start, old_parallelism, max_parallelism)
    last = partition_for_key_group(target.end, old_parallelism, max_parallelism)
    out = []
    for old in range(first, last + 1):
        overlap = key_group_range(old, old_parallelism, max_parallelism).intersect(target)
        if not overlap.is_empty:
            out.append((old, overlap))
    return out
