"""The replay of the move from Spark's store in one process, without Spark: the rows one
import task receives for ``--keys`` keys (a value, a list element and a map entry with
TTLs, and a timer per key, as ``benchmarks.import_spark`` builds them) are replayed into
a scratch instance by :func:`statebackend.task.import_spark._replay`; prints the time and
the process's peak RSS growth (a Python worker's share of an import).

    PYTHONPATH=. python -m benchmarks.import_replay --keys 600000
    PYTHONPATH=. python -m benchmarks.import_replay --keys 600000 --cache-defaults
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Iterator


def _batches(imp, keys: int, rows_per_batch: int = 10_000) -> Iterator:
    import pyarrow as pa

    exp = 1_795_910_574_722
    payloads = (
        lambda i: {"value": {"n": i, "pad": "x" * 32}, "ttlExpirationMs": exp},
        lambda i: [{"value": {"v": i}, "ttlExpirationMs": exp}],
        lambda i: {"user_map_key": {"t": "t"},
                   "user_map_value": {"value": {"c": i}, "ttlExpirationMs": exp}},
        lambda i: 4_102_444_800_000,
    )
    for var, payload in enumerate(payloads):
        for start in range(0, keys, rows_per_batch):
            yield pa.RecordBatch.from_pylist([
                {"k": f"key{i}", imp.VAR: var, imp.payload_column(var): payload(i)}
                for i in range(start, min(keys, start + rows_per_batch))])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=600_000)
    ap.add_argument("--cache-defaults", action="store_true",
                    help="replay with KeyedStateBackend's default caches (as before f66aeba)")
    args = ap.parse_args(argv)
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from statebackend.rocksdb.instance import RocksDBInstance
    from statebackend.task import import_spark as imp
    from statebackend.task.import_spark import peak_rss_mb

    if args.cache_defaults:
        made = imp.KeyedStateBackend

        def defaults(inst, **kw):
            kw.pop("max_dirty_entries", None)
            kw.pop("max_cached_entries", None)
            return made(inst, **kw)

        imp.KeyedStateBackend = defaults
    value = StructType([StructField("n", LongType()), StructField("pad", StringType())])
    variables = (
        imp.StateVariable("val", "value", value, None, True),
        imp.StateVariable("hist", "list", StructType([StructField("v", LongType())]), None, True),
        imp.StateVariable("tags", "map", StructType([StructField("c", LongType())]),
                          StructType([StructField("t", StringType())]), True),
        imp.StateVariable("$timers", "timers"))
    plan = imp.ImportPlan("unused", {}, "op", "unused", ("k",), ("string",), variables, 1, 128)
    scratch = tempfile.mkdtemp(prefix="import-replay-")
    try:
        inst = RocksDBInstance(f"{scratch}/db")
        before, t0 = peak_rss_mb(), time.perf_counter()
        rows, _states = imp._replay(inst, _batches(imp, args.keys), plan, 0)
        seconds = time.perf_counter() - t0
        inst.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{args.keys} keys, {sum(rows.values())} rows replayed in {seconds:.1f} s; peak RSS "
          f"{before:.0f} -> {peak_rss_mb():.0f} MB"
          f"{' (default caches)' if args.cache_defaults else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
