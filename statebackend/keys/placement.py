"""Exact placement: for each Spark partition index ``i`` an int ``v_i`` whose Spark hash
routes it to partition ``i``, so ``repartition(P, v[partition_for_key_group(kg)])`` puts
key-group range ``i`` in Spark partition ``i``."""

from __future__ import annotations

import functools

import numpy as np

from ..errors import OptionsError
from .groups import SEED
from .kernels import _np_hash_i32
from .ranges import MAX_MAX_PARALLELISM

__all__ = ["placement_values"]


@functools.lru_cache(maxsize=64)
def _placement(parallelism: int) -> tuple[int, ...]:
    found = np.full(parallelism, -1, dtype=np.int64)
    missing = parallelism
    base, chunk = 0, max(1024, 4 * parallelism)
    while missing:
        cand = np.arange(base, base + chunk, dtype=np.int64)
        h = _np_hash_i32(cand.astype(np.int32), np.full(chunk, SEED, np.uint32)).view(np.int32)
        pid = np.mod(h, parallelism)
        # First candidate per partition index in this chunk (cand is increasing).
        uniq, first = np.unique(pid, return_index=True)
        todo = found[uniq] < 0
        found[uniq[todo]] = cand[first[todo]]
        missing = int((found < 0).sum())
        base += chunk
    return tuple(int(v) for v in found)


def placement_values(parallelism: int) -> list[int]:
    """Route values for ``repartition(parallelism, col)``: ``v_i`` lands in partition ``i``.

    For each partition index ``i``, the smallest non-negative int ``v_i`` with
    ``pmod(hash(v_i), parallelism) == i`` (``v_i`` as a Spark ``int``). Routing each row by
    ``v[partition_for_key_group(kg)]`` puts key-group range ``i`` in Spark partition ``i``.

    Examples
    --------
    >>> vs = placement_values(4)
    >>> [spark_hash([v], ["int"]) % 4 for v in vs]
    [0, 1, 2, 3]
    """
    if (not isinstance(parallelism, (int, np.integer)) or isinstance(parallelism, bool)
            or not 1 <= parallelism <= MAX_MAX_PARALLELISM):
        raise OptionsError("parallelism", parallelism,
                           f"parallelism must be an int in 1..{MAX_MAX_PARALLELISM}, "
                           f"got {parallelism!r}")
    return list(_placement(int(parallelism)))
