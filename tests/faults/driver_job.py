"""A streaming query's driver, run as its own process so a test can kill it (marker
``faults``): SIGKILL from outside, or ``os._exit`` from inside the coordinator.

Usage: ``python driver_job.py WORK_DIR``. The query is a running count over the parquet
files of ``WORK_DIR/in`` (one file per micro-batch, ``availableNow``), on ``local[2]``,
with ``num_retained=1`` so every completion also deletes files. Each micro-batch's output
is written to ``WORK_DIR/out/batch-<id>.json`` (atomically; a re-run batch overwrites its
own file, as an idempotent sink does). Environment:

``SB_DRIVER_FAULT``
    ``record:<n>``: exit (``os._exit(137)``) just before the completed-checkpoint record of
    checkpoint ``n`` is written. ``delete:<k>``: at the ``k``-th deletion call of the
    driver, delete the first half of the paths, then exit. The fault writes
    ``WORK_DIR/fault.json`` (what it cut) before exiting.
``SB_TASK_SLEEP_S``
    Seconds each task sleeps (slows micro-batches so a kill lands mid-stream).
``SB_WAIT_FOR_GO``
    ``1``: start the SparkSession, then wait for a line ``go`` on stdin before touching
    the query or its state (the test starts the next driver while the previous one runs;
    it exits without touching anything on any other line or at the end of stdin).

When the run ends normally it prints one line ``RESULT <json>`` with the completed
checkpoints (the test reads the committed state from durable storage itself).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
OP = "counts"


def _atomic_json(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def install_fault(work: str, spec: str) -> None:
    """Patch the driver's durable store so that the coordinator dies at the given step."""
    from statebackend.storage.fsspec_store import FsspecStore

    kind, _, arg = spec.partition(":")
    n = int(arg)
    marker = os.path.join(work, "fault.json")
    if kind == "record":
        put = FsspecStore.put_bytes_atomic

        def put_then_maybe_die(self, path, data):
            if path.endswith(f"_checkpoints/chk-{n}.json"):
                _atomic_json(marker, {"kind": kind, "path": path})
                os._exit(137)
            return put(self, path, data)

        FsspecStore.put_bytes_atomic = put_then_maybe_die
    elif kind == "delete":
        delete = FsspecStore.delete
        calls = [0]

        def delete_then_maybe_die(self, paths):
            paths = list(paths)
            calls[0] += 1
            if calls[0] >= n and paths:
                done = paths[: max(1, len(paths) // 2)]
                delete(self, done)
                _atomic_json(marker, {"kind": kind, "deleted": done, "kept": paths[len(done):]})
                os._exit(137)
            return delete(self, paths)

        FsspecStore.delete = delete_then_maybe_die
    else:
        raise ValueError(f"unknown SB_DRIVER_FAULT {spec!r}")


def main(work: str) -> dict:
    from pyspark.sql import SparkSession

    spec = os.environ.get("SB_DRIVER_FAULT", "")
    if spec:
        install_fault(work, spec)
    spark = (SparkSession.builder.master("local[2]").appName("statebackend-driver-kill")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.default.parallelism", "2")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    if os.environ.get("SB_WAIT_FOR_GO") == "1" and sys.stdin.readline().strip() != "go":
        spark.stop()
        return {"completed": None}
    import driver_procs

    from statebackend import RocksDBStateBackend, StateBackendOptions

    out_dir = os.path.join(work, "out")
    os.makedirs(out_dir, exist_ok=True)
    state = os.path.join(work, "state")
    backend = RocksDBStateBackend(state, StateBackendOptions(
        parallelism=2, num_retained=1, local_dir=os.path.join(work, "local")))

    def collect(batch_df, batch_id):
        rows = sorted(map(list, batch_df.toPandas().itertuples(index=False)))
        _atomic_json(os.path.join(out_dir, f"batch-{batch_id}.json"), [[k, int(v)] for k, v in rows])

    df = spark.readStream.schema("k STRING, x BIGINT").option("maxFilesPerTrigger", 1) \
        .parquet(os.path.join(work, "in"))
    proc = driver_procs.SlowCount(float(os.environ.get("SB_TASK_SLEEP_S", "0")))
    res = backend.transform_with_state(df.groupBy("k"), proc, "k STRING, v BIGINT",
                                       operator_id=OP)
    q = (res.writeStream.foreachBatch(collect).outputMode("update")
         .option("checkpointLocation", os.path.join(work, "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    # the listener may not have handled the last progress event yet: the query ended
    # normally, so Spark committed every micro-batch it ran
    last = q.lastProgress
    backend.complete(OP, up_to=None if last is None else int(last["batchId"]))
    result = {"completed": [c.checkpoint_id for c in backend.coordinator(OP).list_completed()]}
    spark.stop()
    return result


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
