"""Scenarios run on a Spark Connect session, as a user on a Connect-only client runs them.

Run as ``python connect_job.py WORKDIR FIDELITY_INPUT [SCENARIO ...]`` by tests/connect/test_connect.py,
in its own process: pyspark switches a whole process into Connect mode
(``SPARK_CONNECT_MODE_ENABLED``), so Connect and classic sessions cannot share one. The
session is a local Connect server that pyspark starts (``remote("local[2,2]")``, no
network). Each scenario writes what it observed under ``WORKDIR/results/<scenario>/``
(pickled pandas frames, one per micro-batch, or JSON); the test compares them with the
same scenarios on a classic session. Nothing here touches a JVM: this process has none.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SPARK_TESTS = os.path.join(os.path.dirname(HERE), "spark")
sys.path.insert(0, SPARK_TESTS)
# the server's Python workers unpickle the test processors by module name
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (SPARK_TESTS, os.environ.get("PYTHONPATH", "")) if p)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# pyspark's test mode: the local Connect server takes an ephemeral port and the client asks
# it which (otherwise both use 15002, and a second run on the machine, another test suite
# or the demo, would connect to the first one's server)
os.environ["SPARK_TESTING"] = "1"

import pandas as pd  # noqa: E402

# Scenarios of the fidelity suite run here (tests/spark/fidelity_cases.py): both
# transformWithState flavours, event-time timers and late rows, an applyInPandasWithState
# event-time timeout, initialState, TTL with processing time, null keys.
FIDELITY = ("event-sessions", "row-min-max-event-time", "apply-event-sessions",
            "initial-state-by-position", "map-with-ttl", "apply-null-keys", "min-max-event-time")
SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"
EVERY_STATE = "*"  # read_state's rows of every state (no state has this name)


def session():
    from pyspark.sql import SparkSession

    return (SparkSession.builder.remote("local[2,2]")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.streaming.stateStore.providerClass",
                    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .getOrCreate())


def _source(spark, input_dir: str, schema: str, watermark=None):
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(input_dir)
    return df if watermark is None else df.withWatermark(*watermark)


def run_stream(spark, input_dir: str, schema: str, build, checkpoint_dir: str, out_dir: str,
               watermark=None):
    """``build(stream)`` run over the files, one file per micro-batch, each micro-batch's
    output pickled to ``out_dir/<batch>.pkl``.

    Our operators write through a file sink, and each micro-batch's rows are read back
    from the files its log entry lists: a foreachBatch function runs on the Connect server,
    which executes its DataFrame outside the streaming query, where Spark gives tasks no
    micro-batch id (our operator refuses to run there, statebackend.task.context). Spark's
    own operators go through foreachBatch (the server pickles each batch's rows)."""
    q = start_stream(spark, input_dir, schema, build, checkpoint_dir, watermark)
    q.awaitTermination()
    pickle_output(checkpoint_dir, out_dir)
    return q


def start_stream(spark, input_dir: str, schema: str, build, checkpoint_dir: str,
                 watermark=None):
    """The query of :func:`run_stream`, started."""
    return (build(_source(spark, input_dir, schema, watermark)).writeStream.format("parquet")
            .option("path", checkpoint_dir + "-out")
            .option("checkpointLocation", checkpoint_dir).trigger(availableNow=True).start())


def pickle_output(checkpoint_dir: str, out_dir: str) -> None:
    """Each micro-batch's rows of an ended :func:`start_stream` query, from the files its
    sink log lists, pickled to ``out_dir/<batch>.pkl``."""
    os.makedirs(out_dir, exist_ok=True)
    log = os.path.join(checkpoint_dir + "-out", "_spark_metadata")
    columns = None
    frames = {}
    for name in sorted(os.listdir(log)):
        if not name.split(".")[0].isdigit():
            continue
        with open(os.path.join(log, name)) as f:
            entries = [json.loads(line) for line in f.read().splitlines()[1:] if line.strip()]
        paths = [e["path"].removeprefix("file://") for e in entries]
        frame = (pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True) if paths
                 else None)
        frames[int(name.split(".")[0])] = frame
        if frame is not None:
            columns = list(frame.columns)
    for batch, frame in frames.items():
        if frame is None:
            frame = pd.DataFrame({c: [] for c in columns or []})
        frame.to_pickle(os.path.join(out_dir, f"{batch}.pkl"))


def run_theirs(spark, input_dir: str, schema: str, build, checkpoint_dir: str, out_dir: str,
               watermark=None):
    """Spark's own operator, each micro-batch's rows pickled by the server's foreachBatch."""
    start_theirs(spark, input_dir, schema, build, checkpoint_dir, out_dir,
                 watermark).awaitTermination()


def start_theirs(spark, input_dir: str, schema: str, build, checkpoint_dir: str,
                 out_dir: str, watermark=None):
    """The query of :func:`run_theirs`, started."""
    os.makedirs(out_dir, exist_ok=True)

    def sink(batch_df, batch_id):
        import os as _os

        batch_df.toPandas().to_pickle(_os.path.join(out_dir, f"{batch_id}.pkl"))

    return (build(_source(spark, input_dir, schema, watermark)).writeStream.foreachBatch(sink)
            .outputMode("update").option("checkpointLocation", checkpoint_dir)
            .trigger(availableNow=True).start())


def backend_for(root: str, **options):
    from statebackend import RocksDBStateBackend, StateBackendOptions

    return RocksDBStateBackend(os.path.join(root, "state"), StateBackendOptions(
        parallelism=2, local_dir=os.path.join(root, "local"), **options))


def fidelity(spark, work: str, input_dir: str, name: str) -> None:
    from fidelity_cases import CASE_BY_NAME, WATERMARK, builders
    from fidelity_cases import SCHEMA as FSCHEMA
    from harness import NO_DATA_BATCHES, never_ends_under_defaults, run_together

    case = CASE_BY_NAME[name]
    root = os.path.join(work, "runs", name)
    out = os.path.join(work, "results", name)
    backend = backend_for(root)
    init_df = spark.createDataFrame(pd.DataFrame({"k": ["user-1", "user-4", "nobody"],
                                                  "init": [1000, 4000, 9000]}))
    # ours writes through a file sink, whose mode is Append: the mode ours declares
    theirs_q, ours_q = builders(case, backend, init_df, our_mode="Append")
    wm = WATERMARK if case.watermark else None
    # Spark's defaults, but no-data micro-batches off for these two queries where their
    # availableNow run would never end (a query takes the session's conf when it starts;
    # a Connect session has no newSession)
    if never_ends_under_defaults(case.mode):
        spark.conf.set(NO_DATA_BATCHES, "false")
    # Spark's query and ours side by side (each mostly waits on the server's driver)
    try:
        run_together([
            lambda: start_theirs(spark, input_dir, FSCHEMA, theirs_q,
                                 os.path.join(root, "ck-spark"), os.path.join(out, "theirs"),
                                 wm),
            lambda: start_stream(spark, input_dir, FSCHEMA, ours_q,
                                 os.path.join(root, "ck-ours"), wm)])
    finally:
        spark.conf.unset(NO_DATA_BATCHES)
    pickle_output(os.path.join(root, "ck-ours"), os.path.join(out, "ours"))
    backend.complete()
    # the state as Connect reads it: every state as JSON, and each state typed (timestamps
    # and maps take Connect's own conversion path)
    op = next(iter(backend.operator_ids()))
    views = {EVERY_STATE: backend.read_state(spark, op).toPandas()}
    latest = backend.coordinator(op).latest()
    from statebackend.read.rows import load_checkpoint
    from statebackend.storage import open_store

    view = load_checkpoint(open_store(backend.checkpoint_location), op)
    for state in sorted(view.states):
        views[state] = backend.read_state(spark, op, state_name=state).toPandas()
    pd.to_pickle(views, os.path.join(out, "read_state.pkl"))
    _json(out, "meta.json", {"operator_id": op, "state": backend.checkpoint_location,
                             "latest": latest.checkpoint_id})


def restart_and_feed(spark, work: str) -> None:
    """The exactly-once restart (a task fails once, the query stops and restarts on more
    input with a new backend object), then the change feed and a savepoint."""
    import processors as P
    from harness import random_batches, write_batches

    root = os.path.join(work, "runs", "restart")
    out = os.path.join(work, "results", "restart")
    data = random_batches(5, seed=29)
    in_dir = os.path.join(root, "in")
    write_batches(in_dir, data[:3])
    ck = os.path.join(root, "ck")
    run_stream(spark, in_dir, SCHEMA, lambda df: backend_for(root).transform_with_state(
        df.groupBy("k"), P.FailOnce(), OUT, operator_id="rc"), ck, os.path.join(out, "batches"))
    write_batches(in_dir, data[3:], start=3)
    be = backend_for(root)
    q = run_stream(spark, in_dir, SCHEMA, lambda df: be.transform_with_state(
        df.groupBy("k"), P.FailOnce(), OUT, operator_id="rc"), ck, os.path.join(out, "batches"))
    # the backend's metrics in Spark's progress, under the operator's observation name
    from statebackend.spark.progress import progress_metrics

    observed = [progress_metrics(p, be.observation_name("rc")) for p in q.recentProgress]
    # the session's listener completes the last micro-batch's checkpoint by itself (its
    # progress event reaches the client on Connect's listener stream)
    waited = time.monotonic()
    while time.monotonic() - waited < 60:
        latest = be.coordinator("rc").latest()
        if latest is not None and latest.checkpoint_id == 4:
            break
        time.sleep(0.1)
    by_listener = latest.checkpoint_id if latest is not None else None
    be.complete("rc")
    retained = sorted(c.checkpoint_id for c in be.coordinator("rc").list_completed())
    changes = be.read_changes(spark, "rc", retained[0], retained[-1]).toPandas()
    sp = be.savepoint("rc", "sp")
    _json(out, "meta.json", {"state": be.checkpoint_location, "retained": retained,
                             "by_listener": by_listener,
                             "latest": be.coordinator("rc").latest().checkpoint_id,
                             "observed": [None if o is None else {k: o.get(k) for k in
                                          ("rows", "partitions", "input_rows", "bytes_uploaded")}
                                          for o in observed],
                             "savepoint": sp.name if hasattr(sp, "name") else str(sp)})
    pd.to_pickle(changes, os.path.join(out, "changes.pkl"))


def vector_blocks(spark, work: str) -> None:
    """map_in_pandas with value blocks, read back typed."""
    import processors as P
    from harness import random_batches, write_batches

    root = os.path.join(work, "runs", "vector")
    out = os.path.join(work, "results", "vector")
    data = random_batches(3, seed=41, rows=120, keys=60)
    write_batches(os.path.join(root, "in"), data)
    be = backend_for(root)
    run_stream(spark, os.path.join(root, "in"), SCHEMA,
               lambda df: be.map_in_pandas(df, "k", P.vector_count, OUT,
                                           state_schema="c BIGINT", operator_id="vec",
                                           value_blocks=3),
               os.path.join(root, "ck"), os.path.join(out, "batches"))
    be.complete("vec")
    pd.to_pickle({"typed": be.read_state(spark, "vec", state_name="columnState").toPandas(),
                  "driver": be.read_state(spark, "vec", state_name="columnState",
                                          distributed=False).toPandas()},
                 os.path.join(out, "read_state.pkl"))
    _json(out, "meta.json", {"state": be.checkpoint_location})


def supervised(spark, work: str) -> None:
    """``backend.supervise`` runs a query to its end on Connect."""
    import processors as P
    from harness import random_batches, write_batches

    from statebackend.restart import NoRestart

    root = os.path.join(work, "runs", "supervise")
    out = os.path.join(work, "results", "supervise")
    data = random_batches(2, seed=5)
    write_batches(os.path.join(root, "in"), data)
    be = backend_for(root)

    def start():
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(
            os.path.join(root, "in"))
        return (be.transform_with_state(df.groupBy("k"), P.RunningCount(), OUT,
                                        operator_id="sup")
                .writeStream.format("noop").option("checkpointLocation",
                                                   os.path.join(root, "ck"))
                .trigger(availableNow=True).start())

    result = be.supervise(start, NoRestart())
    be.complete("sup")
    _json(out, "meta.json", {"starts": result.starts, "failures": len(result.failures),
                             "latest": be.coordinator("sup").latest().checkpoint_id})


def import_from_spark(spark, work: str) -> None:
    """The one-step move from Spark's store on Connect: Spark's own operator runs three
    micro-batches and stops, its state becomes our savepoint, then Spark's query continues
    from its checkpoint and ours from the savepoint on the same later input."""
    import import_procs as IP
    from harness import NO_DATA_BATCHES, write_batches

    from statebackend import RocksDBStateBackend, StateBackendOptions

    root = os.path.join(work, "runs", "import")
    out = os.path.join(work, "results", "import")
    in_spark, in_ours = os.path.join(root, "in-spark"), os.path.join(root, "in-ours")
    ck = os.path.join(root, "ck-spark")
    write_batches(in_spark, IP.BEFORE)
    spark.conf.set(NO_DATA_BATCHES, "false")  # ProcessingTime under availableNow
    try:
        run_theirs(spark, in_spark, SCHEMA, IP.spark_query, ck, os.path.join(out, "before"))
        be = backend_for(root)
        step = be.import_spark_state(spark, ck, "every")
        exports = {"spark": IP.spark_export(spark, ck),
                   "ours": IP.ours_export(be, spark, "every", step.savepoint)}
        write_batches(in_spark, IP.AFTER, start=3)
        run_theirs(spark, in_spark, SCHEMA, IP.spark_query, ck, os.path.join(out, "theirs"))
        write_batches(in_ours, IP.AFTER)
        moved = RocksDBStateBackend(be.checkpoint_location, StateBackendOptions(
            parallelism=2, local_dir=os.path.join(root, "local")), from_savepoint=step.savepoint)
        # ours writes through a file sink, whose mode is Append: the mode ours declares
        run_stream(spark, in_ours, SCHEMA, lambda df: moved.transform_with_state(
            df.groupBy("k"), IP.EveryState(), IP.OUT, "Append", "ProcessingTime",
            operator_id="every"), os.path.join(root, "ck-ours"), os.path.join(out, "ours"))
    finally:
        spark.conf.unset(NO_DATA_BATCHES)
    pd.to_pickle(exports, os.path.join(out, "exports.pkl"))
    _json(out, "meta.json", {"rows": step.rows, "entries": step.entries})


def demo_on_its_own_session(work: str) -> None:
    """The demo with ``--remote local[2,2]`` after the scenarios' session stopped (which
    stops the local Connect server): the demo starts a local Connect server of its own,
    owns its session, and releases its listener and stops the session at the end."""
    import contextlib

    from statebackend import demo

    out = os.path.join(work, "results", "demo")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "stdout.txt"), "w") as f, contextlib.redirect_stdout(f):
        code = demo.main(["--remote", "local[2,2]", "--dir", os.path.join(work, "runs", "demo"),
                          "--batches", "3", "--events", "600", "--keys", "80"])
    _json(out, "meta.json", {"code": code})


def _json(out: str, name: str, value) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "w") as f:
        json.dump(value, f)


def main(argv: list[str]) -> int:
    work, fidelity_input = argv[0], argv[1]
    spark = session()
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    scenarios = [(name, lambda n=name: fidelity(spark, work, fidelity_input, n))
                 for name in FIDELITY]
    scenarios += [("restart", lambda: restart_and_feed(spark, work)),
                  ("vector", lambda: vector_blocks(spark, work)),
                  ("supervise", lambda: supervised(spark, work)),
                  ("import", lambda: import_from_spark(spark, work))]
    only = set(argv[2:])  # names: run only these (by hand, while debugging one)
    failed = sum(not _scenario(work, name, run) for name, run in scenarios
                 if not only or name in only)
    from statebackend.spark.listener import release

    release(spark)
    spark.stop()
    # last, on a session of its own (a second local Connect server in this process)
    if not only or "demo" in only:
        failed += not _scenario(work, "demo", lambda: demo_on_its_own_session(work))
    return 1 if failed else 0


def _scenario(work: str, name: str, run) -> bool:
    try:
        run()
        print(f"scenario {name}: done", flush=True)
        return True
    except Exception:  # noqa: BLE001 - every scenario runs; the test reports each
        _json(os.path.join(work, "results", name), "error.json",
              {"error": traceback.format_exc()})
        print(f"scenario {name}: FAILED\n{traceback.format_exc()}", flush=True)
        return False


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
