"""More faults against small streaming queries (markers ``spark``, ``faults``): the S3
server stopped and restarted during a run, and duplicate attempts of the same micro-batch.

Spark never launches a speculative copy on a host where an attempt of the task is
running, and ``local-cluster`` runs every executor on one host, so speculation cannot make
duplicates here. They are forced instead: an attempt that fails right after publishing
(its retry publishes a second manifest for the same checkpoint, before completion), and a
zombie twin of the query (a copy of its Spark checkpoint) that re-runs micro-batches which
are already complete and publishes late attempts for them.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
import uuid

import fault_more_procs as M
import pandas as pd
import pytest
from harness import write_batches
from test_faults_spark import OP, Env, add_batch, batches, check, reference, run

from statebackend.read.rows import read_rows
from statebackend.storage import open_store

pytestmark = [pytest.mark.spark, pytest.mark.faults]


def _state(env: Env, op: str = OP) -> dict[str, int]:
    store = open_store(env.backend.checkpoint_location,
                       storage_options=env.backend.storage_options or None)
    return {r.key[0]: int(r.value[0])
            for r in read_rows(store, op, state_name="count", temp_dir=str(env.tmp))}


def _totals(data: list[pd.DataFrame]) -> dict[str, int]:
    return {str(k): int(v) for k, v in pd.concat(data).groupby("k").size().items()}


# --- the S3 server stopped and restarted ------------------------------------------------


class RestartableS3:
    """A moto S3 server that can be stopped and started again on the same port; moto keeps
    its buckets in process memory, so data written before the outage is there after it."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server = None
        self.start()

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="session")
def s3():
    # Session-long: the session's completion listener keeps every backend it has seen and
    # completes its checkpoints after any query's micro-batch, so a server that stayed
    # down would slow every later Spark test with failing (logged) retries.
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    server = RestartableS3()
    yield server
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.mark.s3
def test_s3_server_stopped_between_batches_and_while_uploading(spark, tmp_path, s3):
    import boto3

    bucket = f"sb-outage-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing"
                 ).create_bucket(Bucket=bucket)
    options = {"client_kwargs": {"endpoint_url": s3.endpoint, "region_name": "us-east-1"},
               "key": "testing", "secret": "testing", "skip_instance_cache": True,
               "use_listings_cache": False,
               # a refused connection fails fast; our store's own retries remain
               "config_kwargs": {"retries": {"max_attempts": 1}}}
    env = Env(tmp_path, location=f"s3://{bucket}/state", storage_options=options)
    data = batches(5, seed=41)
    write_batches(env.in_dir, data[:3])
    sync = str(tmp_path / "sync")
    os.makedirs(sync)
    proc = M.HoldFirstUpload(sync, checkpoint_id=4, root_contains=bucket)
    out: dict[int, pd.DataFrame] = {}
    df = spark.readStream.schema("k STRING, x BIGINT, ts TIMESTAMP") \
        .option("maxFilesPerTrigger", 1).parquet(env.in_dir)

    # 1. the server goes away between micro-batches 1 and 2 (from the sink of batch 1)
    def collect(batch_df, batch_id):
        pdf = batch_df.toPandas()
        out[batch_id] = pdf.sort_values(list(pdf.columns)).reset_index(drop=True)
        if batch_id == 1:
            s3.stop()

    q = (env.build(proc)(df).writeStream.foreachBatch(collect).outputMode("update")
         .option("checkpointLocation", env.ck).trigger(availableNow=True).start())
    with pytest.raises(Exception, match="StorageError"):
        q.awaitTermination()
    assert sorted(out) == [0, 1]
    s3.start()  # back on the same port with the data it had
    assert env.completed() == [0, 1]
    committed = _state(env)
    assert committed == _totals(data[:2])

    # 2. started again, the query continues from micro-batch 2 exactly once; then the
    # server dies while checkpoint 4 uploads its first SST and comes back a moment later
    add_batch(env.in_dir, 3, data[3])
    add_batch(env.in_dir, 4, data[4])

    def outage_during_upload() -> None:
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(sync, "uploading")):
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        s3.stop()
        open(os.path.join(sync, "stopped"), "w").close()
        time.sleep(0.3)
        s3.start()

    t = threading.Thread(target=outage_during_upload, daemon=True)
    t.start()
    try:
        run(spark, env.in_dir, env.build(proc), env.ck, out)
    finally:
        t.join(timeout=130)
        open(os.path.join(sync, "stopped"), "a").close()  # never leave a worker waiting
    assert os.path.exists(os.path.join(sync, "uploading")), "the upload was never held"
    check(out, reference(data))
    assert env.completed() == [2, 3, 4]
    assert _state(env) == _totals(data)


# --- duplicate attempts of one micro-batch ------------------------------------------------


def chosen_files(record) -> tuple:
    """What a completed checkpoint's record chose (its ``committed`` flag may still turn
    true when Spark's commit becomes known)."""
    return dict(record.manifests), record.full_size, record.created_at_ms


def test_duplicate_attempts_publish_for_one_checkpoint_and_one_is_chosen(spark, tmp_path):
    data = batches(4, seed=43)
    env = Env(tmp_path)
    op = f"dups-{uuid.uuid4().hex[:6]}"

    def build(df):
        return env.backend.transform_with_state(
            df.groupBy("k"), M.FailAfterPublish(op, str(tmp_path / "failed-once")),
            "k STRING, v BIGINT", operator_id=op)

    write_batches(env.in_dir, data[:3])
    out: dict[int, pd.DataFrame] = {}

    op_root = os.path.join(env.state, op)

    def attempts(n: int, p: int) -> set[str]:
        d = os.path.join(op_root, f"chk-{n}", f"p{p}")
        return {a for a in os.listdir(d)
                if os.path.exists(os.path.join(d, a, "_MANIFEST.json"))} if os.path.isdir(d) \
            else set()

    # the query, whose micro-batch 1 publishes two attempts for partition 0; a copy of its
    # Spark checkpoint after micro-batch 0 makes a zombie twin later
    published: dict[int, set[str]] = {}

    def collect(batch_df, batch_id):
        pdf = batch_df.toPandas()
        out[batch_id] = pdf.sort_values(list(pdf.columns)).reset_index(drop=True)
        if batch_id == 0:
            shutil.copytree(env.ck, str(tmp_path / "ck-twin"))
        published[batch_id] = attempts(batch_id, 0)

    q = (build(spark.readStream.schema("k STRING, x BIGINT, ts TIMESTAMP")
               .option("maxFilesPerTrigger", 1).parquet(env.in_dir))
         .writeStream.foreachBatch(collect).outputMode("update")
         .option("checkpointLocation", env.ck).trigger(availableNow=True).start())
    q.awaitTermination()
    assert os.path.exists(tmp_path / "failed-once"), "the first attempt never failed"
    check(out, reference(data[:3]))
    coord = env.backend.coordinator(op)
    env.backend.complete(op)

    # both attempts published before the checkpoint completed; the record names one of
    # them, and the other was swept once a newer checkpoint completed
    assert len(published[1]) == 2
    chosen = coord.get(1).manifests[0]
    assert chosen.split("/")[2] in published[1]
    assert attempts(1, 0) == {chosen.split("/")[2]}
    records = {n: chosen_files(coord.get(n)) for n in (0, 1, 2)}

    # the zombie twin re-runs micro-batches 1 and 2, which are complete: late attempts
    twin_out: dict[int, pd.DataFrame] = {}
    run(spark, env.in_dir, build, str(tmp_path / "ck-twin"), twin_out)
    check({b: twin_out[b] for b in (1, 2)}, {b: reference(data[:3])[b] for b in (1, 2)})
    assert len(attempts(2, 0)) == 2 and len(attempts(2, 1)) == 2
    env.backend.complete(op)
    # completed checkpoints never change; the late attempts are never chosen
    assert {n: chosen_files(coord.get(n)) for n in (0, 1, 2)} == records

    # the query goes on from the chosen attempts; state equals the failure-free reference
    add_batch(env.in_dir, 3, data[3])
    run(spark, env.in_dir, build, env.ck, out)
    check(out, reference(data))
    env.backend.complete(op)
    assert _state(env, op) == _totals(data)
    # Late attempts of checkpoint 2 (published while it was the latest) are swept once
    # checkpoint 3 completes. Those of checkpoint 1 came after the sweep watermark had
    # passed 1: they are never chosen nor referenced, but nothing sweeps them (a known gap
    # of the coordinator, reported; the assertion above holds only for pre-completion
    # duplicates).
    coord.collect_garbage()
    for p in (0, 1):
        assert attempts(2, p) == {coord.get(2).manifests[p].split("/")[2]}

