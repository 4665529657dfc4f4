"""Another Python worker of the same executor, for tests/spark/test_resident.py: runs one
task of the in-process running count with keep_instances_open, prints its result as JSON,
then exits cleanly ("exit"), dies with its instance still open ("crash"), or keeps it
busy (never handed over) for 1 s and then dies ("busy-crash"). An optional
last argument sets how long it waits for a handover (the tests of a live owner wait long:
a loaded machine may take more than the product's 1 s to run the owner's timer)."""

from __future__ import annotations

import json
import os
import sys
import time

import inproc
from inproc import frames, run_task

from statebackend.local import resident

if __name__ == "__main__":
    root, batch, attempt, rows, how = sys.argv[1:6]
    if len(sys.argv) > 6:
        resident.HANDOVER_WAIT_S = float(sys.argv[6])
    out, source = run_task(root, int(batch), attempt, frames(rows.split(",")),
                           keep_instances_open=True)
    print(json.dumps({"source": source, "pid": os.getpid(),
                      "reason": inproc.LAST_RESTORE.get("fallback_reason"),
                      "counts": {k: int(v) for k, v in out.groupby("k")["v"].max().items()}}),
          flush=True)
    if how == "busy-crash":
        for cache in list(resident._CACHES.values()):
            with cache._lock:
                cache._entries.clear()  # in use, as by a task: requests are not taken up
        time.sleep(1.0)
    if how in ("crash", "busy-crash"):
        os._exit(0)  # no atexit: the instance stays open until the kernel drops the process
