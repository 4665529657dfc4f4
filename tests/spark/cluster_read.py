"""Read state and a change feed on ``local-cluster[2,1,1024]`` (its own process: a second
SparkSession cannot share the test session's JVM), for test_state_feed.py.

Usage: ``python cluster_read.py``; one cluster serves every request. Each line of stdin is a
JSON request ``[URL, OPERATOR, FROM, TO]``; for each the process prints one line
``RESULT {json}``: per retained checkpoint the rows of ``read_state`` (every state, JSON
values), the rows of ``read_changes(FROM, TO)``. The process ends at the end of stdin.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cluster"))


def read(spark, url: str, op: str, a: int, b: int) -> dict:
    from statebackend.read.rows import load_checkpoint
    from statebackend.spark.readers import read_changes, read_state
    from statebackend.storage import open_store

    latest = load_checkpoint(open_store(url), op).record.checkpoint_id
    out: dict = {"state": {}}
    for c in range(latest + 1):
        df = read_state(spark, url, op, checkpoint_id=c)
        out["state"][c] = [r.asDict(recursive=True) for r in df.collect()]
    out["changes"] = [r.asDict(recursive=True)
                      for r in read_changes(spark, url, op, a, b).collect()]
    return out


def main() -> None:
    from cluster_job import cluster_session

    spark = cluster_session("read-state")
    try:
        # the executors' Python workers started before the first request (the process
        # starts early and waits, test_state_feed.start_early)
        spark.range(8, numPartitions=4).mapInPandas(lambda it: it, "id LONG").collect()
        print("READY", flush=True)
        for line in sys.stdin:
            if line.strip():
                url, op, a, b = json.loads(line)
                print("RESULT " + json.dumps(read(spark, url, op, int(a), int(b))), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
