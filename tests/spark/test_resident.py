"""Instances kept open between micro-batches (keep_instances_open): reused only when they
hold exactly the base the task resolved, handed over safely otherwise, and the counts are
exactly-once throughout. Tasks run in this process (tests/spark/inproc.py); another
worker process of the executor is a subprocess (resident_procs.py)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from inproc import config, frames, run_task

from statebackend.local import resident
from statebackend.local.resident import resident_instances
from statebackend.metrics import aggregate
from statebackend.model.manifest import CompletedCheckpoint
from statebackend.storage import open_store
from statebackend.storage.manifests import list_published_manifests, operator_store

HERE = os.path.dirname(os.path.abspath(__file__))
ON = {"keep_instances_open": True}


@pytest.fixture(autouse=True)
def _close_kept_instances():
    yield
    resident.close_all()


def counts(out):
    return out.groupby("k")["v"].max().to_dict()


def work_dirs(root) -> list[str]:
    """The kept-open working directories of partition 0."""
    d = os.path.join(str(root), "local", "frames", "p0")
    return sorted(n for n in os.listdir(d) if n.startswith("work-") and "." not in n)


def other_worker(root, batch: int, attempt: str, rows: list[str], how: str = "exit",
                 wait_s: float | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (HERE, os.path.dirname(os.path.dirname(HERE)), os.environ.get("PYTHONPATH"))
        if p))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "resident_procs.py"), str(root),
                           str(batch), attempt, ",".join(rows), how,
                           *([] if wait_s is None else [str(wait_s)])],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_next_batch_in_the_same_worker_reuses_the_open_instance(tmp_path):
    cache = resident_instances(300.0)
    out0, src0 = run_task(str(tmp_path), 0, "t0", frames(["a", "b", "a"]), **ON)
    assert src0 == "empty" and counts(out0) == {"a": 2, "b": 1}
    (kept,) = work_dirs(tmp_path)
    out1, src1 = run_task(str(tmp_path), 1, "t1", frames(["a", "c"]), **ON)
    assert src1 == "resident" and counts(out1) == {"a": 3, "c": 1}
    assert work_dirs(tmp_path) == [kept] and len(cache) == 1
    # closed (process exit), its directory goes; the old lifecycle then restores the
    # same state from the local copy into "work"
    resident.close_all()
    assert work_dirs(tmp_path) == []
    out2, src2 = run_task(str(tmp_path), 2, "t2", frames(["a"]), keep_instances_open=False)
    assert src2 == "local_copy" and counts(out2) == {"a": 4}


@pytest.mark.parametrize("fail_at", [0, 2])
def test_a_failed_task_never_hands_back_its_instance(tmp_path, fail_at):
    # Before the state is opened (first frame) the kept instance is untouched and the retry
    # reuses it; after, the failed task has written to it: it is closed and deleted, and
    # the retry restores batch 0 from the verified local copy. Batch 1 counts once.
    run_task(str(tmp_path), 0, "t0", frames(["a", "b", "a", "c", "a", "d", "b"]), **ON)

    def lost(rows):
        for i, frame in enumerate(frames(rows)):
            if i == fail_at:
                raise OSError("shuffle block lost")
            yield frame

    b1 = ["a", "b", "e", "a", "e", "e", "f", "a"]
    with pytest.raises(OSError, match="shuffle block lost"):
        run_task(str(tmp_path), 1, "t1-failed", lost(b1), **ON)
    assert len(work_dirs(tmp_path)) == (1 if fail_at == 0 else 0)
    out1, source = run_task(str(tmp_path), 1, "t1-retry", frames(b1), **ON)
    assert source == ("resident" if fail_at == 0 else "local_copy")
    assert counts(out1) == {"a": 6, "b": 3, "e": 3, "f": 1}
    assert len(work_dirs(tmp_path)) == 1


def test_an_instance_of_another_attempt_is_not_the_base(tmp_path):
    # Two attempts of batch 1 publish (speculation); the kept instance is the second's.
    # Batch 2 reuses it only if the deterministic choice is that attempt, else restores
    # the chosen one's local copy; the count is the same either way.
    from statebackend.model.manifest import choose_manifest
    from statebackend.storage import open_store
    from statebackend.storage.manifests import list_published_manifests, operator_store

    # incremental checkpoints: each attempt's local copy is a directory of its own (in
    # changelog mode the second attempt's pruning may leave the first's replay to durable
    # storage, which is correct too)
    on = dict(ON, checkpoint_mode="incremental")
    run_task(str(tmp_path), 0, "t0", frames(["a", "b"]), **on)
    _, s_a = run_task(str(tmp_path), 1, "t1-a", frames(["a"]), **on)
    _, s_b = run_task(str(tmp_path), 1, "t1-b", frames(["a"]), **on)
    # the second attempt's base is batch 0, which the kept instance (t1-a) no longer holds
    assert (s_a, s_b) == ("resident", "local_copy")
    store = operator_store(open_store(f"{tmp_path}/durable"), "frames")
    chosen = choose_manifest(list_published_manifests(store, 1, 0))
    out2, s2 = run_task(str(tmp_path), 2, "t2", frames(["a", "b"]), **on)
    assert s2 == ("resident" if chosen.attempt == "t1-b" else "local_copy")
    assert counts(out2) == {"a": 3, "b": 2}


def test_an_instance_written_after_its_checkpoint_is_not_reused(tmp_path):
    cache = resident_instances(300.0)
    run_task(str(tmp_path), 0, "t0", frames(["a"]), **ON)
    (entry,) = cache._entries.values()
    entry.instance.write({"default": {b"stray": b"write"}})  # sequence number moves
    out, source = run_task(str(tmp_path), 1, "t1", frames(["a"]), **ON)
    assert source == "local_copy" and counts(out) == {"a": 2}


def test_operators_and_partitions_of_one_worker_keep_their_own_instances(tmp_path):
    cache = resident_instances(300.0)
    for b in range(3):
        for op in ("x", "y"):
            out, source = run_task(str(tmp_path), b, f"t{b}{op}", frames([op] * (b + 1)),
                                   operator_id=op, **ON)
            assert source == ("empty" if b == 0 else "resident")
            assert counts(out) == {op: (b + 1) * (b + 2) // 2}
    assert len(cache) == 2


def test_idle_instances_are_closed_and_their_directories_deleted(tmp_path):
    cache = resident_instances(0.1)
    run_task(str(tmp_path), 0, "t0", frames(["a"]), instance_idle_timeout=0.1, **ON)
    deadline = time.monotonic() + 30  # waiting for the timer thread, not timing it
    while (len(cache) or work_dirs(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(cache) == 0 and work_dirs(tmp_path) == []
    out, source = run_task(str(tmp_path), 1, "t1", frames(["a"]), instance_idle_timeout=0.1,
                           **ON)
    assert source == "local_copy" and counts(out) == {"a": 2}


def test_handover_between_worker_processes(tmp_path):
    # Batch 0 here keeps partition 0 open (LOCK held). Batch 1 runs in another worker
    # process: ours hands the idle instance over (closed, directory renamed to the
    # requester's) and the other reopens it as its working directory.
    cache = resident_instances(300.0)
    run_task(str(tmp_path), 0, "t0", frames(["a", "b"]), **ON)
    (ours,) = work_dirs(tmp_path)
    r1 = other_worker(tmp_path, 1, "t1", ["a", "c"], wait_s=60.0)
    assert r1["source"] == "working_dir" and r1["counts"] == {"a": 2, "c": 1}
    assert len(cache) == 0 and ours not in work_dirs(tmp_path)
    # That worker exited cleanly: its closed directory waits, marked, for the next task.
    out2, s2 = run_task(str(tmp_path), 2, "t2", frames(["a", "c"]), **ON)
    assert s2 == "working_dir" and counts(out2) == {"a": 3, "c": 2}
    # A worker that dies with its instance open: the kernel drops its LOCK, and the next
    # task takes its directory over (clean marker and sequence number checked).
    r3 = other_worker(tmp_path, 3, "t3", ["c"], how="crash")
    assert r3["source"] == "working_dir" and r3["counts"] == {"c": 3}
    out4, s4 = run_task(str(tmp_path), 4, "t4", frames(["a", "c"]), **ON)
    assert s4 == "working_dir" and counts(out4) == {"a": 4, "c": 4}
    assert [d for d in work_dirs(tmp_path) if f"work-{r3['pid']}-" in d] == []
    assert len(work_dirs(tmp_path)) == 1 and len(cache) == 1


def test_a_request_read_before_it_is_written_is_left_alone(tmp_path, monkeypatch):
    # The owner's timer polls every 10 ms; a request it reads before its writer filled it
    # in must not be taken up (it used to be: the empty target was refused, the instance
    # closed and its directory deleted, and the requester waited 2 s for nothing).
    cache = resident_instances(300.0)
    handed: list[str] = []  # hand-overs by this test's calls and by the timer alike
    hand_over = cache._hand_over
    monkeypatch.setattr(cache, "_hand_over",
                        lambda entry, target: handed.append(target) or hand_over(entry, target))
    run_task(str(tmp_path), 0, "t0", frames(["a", "b"]), **ON)
    (ours,) = work_dirs(tmp_path)
    d = os.path.join(str(tmp_path), "local", "frames", "p0")
    request = os.path.join(d, ours + resident.RELEASE_SUFFIX)
    open(request, "w").close()  # created, not yet written
    assert cache.release_requested() == 0 and handed == []
    assert work_dirs(tmp_path) == [ours] and len(cache) == 1 and os.path.exists(request)
    target = resident.resident_dir_name()
    with open(request, "w") as fh:
        fh.write(target)
    cache.release_requested()  # (the timer may have taken it up first: once, either way)
    assert handed == [target]
    assert work_dirs(tmp_path) == [target] and len(cache) == 0
    assert os.path.exists(os.path.join(d, target + resident.MARKER_SUFFIX))
    assert not os.path.exists(request)
    # requests are created whole: a second one for the same directory is refused
    assert resident.atomic_write(request, target.encode(), exclusive=True, sync=False)
    assert not resident.atomic_write(request, b"x", exclusive=True, sync=False)
    assert open(request).read() == target
    assert not [n for n in os.listdir(d) if ".tmp" in n]


def test_a_busy_owner_never_blocks_the_next_task(tmp_path):
    # The instance is open here but not idle (as if a task of ours were using it): the
    # request is never taken up, the other worker withdraws it after a bounded wait and
    # restores from the local copy into a directory of its own, ours untouched.
    cache = resident_instances(300.0)
    run_task(str(tmp_path), 0, "t0", frames(["a", "b"]), **ON)
    (ours,) = work_dirs(tmp_path)
    with cache._lock:
        (key,) = cache._entries
        busy = cache._entries.pop(key)
    try:
        r1 = other_worker(tmp_path, 1, "t1", ["a", "c"])
        assert r1["source"] == "local_copy" and r1["counts"] == {"a": 2, "c": 1}
        # the restore report says why the kept instance was not used, and so do the
        # checkpoint's stats (the metrics line and the benchmarks read them)
        why = (f"the instance kept open by worker {os.getpid()} was not handed over "
               f"within 1 s: it did not take the request up (busy with it, or slow)")
        assert r1["reason"] == why
        store = operator_store(open_store(config(str(tmp_path)).checkpoint_location), "frames")
        (m1,) = list_published_manifests(store, 1, 0)
        assert aggregate(CompletedCheckpoint("frames", 1, 1, m1.max_parallelism,
                                             {0: m1.path}), [m1]).restore_fallbacks == {0: why}
        assert ours in work_dirs(tmp_path) and not busy.instance.closed
        assert not os.path.exists(busy.instance.path + resident.RELEASE_SUFFIX)
        # our instance is now superseded: the next task here closes it and restores
        # the other worker's checkpoint
        with cache._lock:
            cache._entries[key] = busy
        out2, s2 = run_task(str(tmp_path), 2, "t2", frames(["a"]), **ON)
        assert s2 == "working_dir" and counts(out2) == {"a": 3}
        assert busy.instance.closed and ours not in work_dirs(tmp_path)
    finally:
        busy.instance.close()


def test_an_owner_that_dies_while_asked_hands_over_by_dying(tmp_path, monkeypatch):
    # Another worker kept partition 0 open and is busy (it never takes up requests) when
    # it dies, as a Python worker killed mid-task does: the waiting task sees the owner
    # dead, its LOCK free, and takes the directory over instead of waiting out its limit
    # and restoring from the local copy. The owner is left unreaped (a zombie) meanwhile.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (HERE, os.path.dirname(os.path.dirname(HERE)), os.environ.get("PYTHONPATH"))
        if p))
    owner = subprocess.Popen([sys.executable, os.path.join(HERE, "resident_procs.py"),
                              str(tmp_path), "0", "t0", "a,b", "busy-crash"],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(owner.stdout.readline())
        assert first["source"] == "empty" and first["counts"] == {"a": 1, "b": 1}
        monkeypatch.setattr(resident, "HANDOVER_WAIT_S", 120.0)
        out1, s1 = run_task(str(tmp_path), 1, "t1", frames(["a", "c"]), **ON)
        assert owner.poll() is not None or not resident.pid_alive(owner.pid)
    finally:
        owner.wait(timeout=120)
    assert s1 == "working_dir" and counts(out1) == {"a": 2, "c": 1}
    assert [d for d in work_dirs(tmp_path) if f"work-{first['pid']}-" in d] == []
    assert not [n for n in os.listdir(os.path.join(str(tmp_path), "local", "frames", "p0"))
                if n.endswith(resident.RELEASE_SUFFIX)]


def test_an_owner_that_dies_between_its_two_renames_is_finished_by_the_requester(
        tmp_path, monkeypatch):
    # A worker killed while handing over (ExitOnce in a worker that kept another
    # partition's instance): it had renamed the directory to the requester's name but not
    # yet its marker. The requester finishes the move instead of waiting 2 s and
    # restoring from the local copy.
    from statebackend.task import runner

    r0 = other_worker(tmp_path, 0, "t0", ["a", "b"], how="crash")
    assert r0["source"] == "empty"
    (dead,) = work_dirs(tmp_path)
    d = os.path.join(str(tmp_path), "local", "frames", "p0")
    target = resident.resident_dir_name()
    os.rename(os.path.join(d, dead), os.path.join(d, target))  # the owner's first rename
    monkeypatch.setattr(runner, "resident_dir_name", lambda: target)
    out1, s1 = run_task(str(tmp_path), 1, "t1", frames(["a", "c"]), **ON)
    assert s1 == "working_dir" and counts(out1) == {"a": 2, "c": 1}
    assert not os.path.exists(os.path.join(d, dead + resident.MARKER_SUFFIX))


def test_many_batches_count_exactly_once_with_instances_kept_open(tmp_path):
    import random

    rng = random.Random(7)
    expected: Counter[str] = Counter()
    sources = Counter()
    for b in range(25):
        rows = [f"k{rng.randrange(40)}" for _ in range(rng.randrange(1, 30))]
        attempt = f"t{b}"
        if rng.random() < 0.2:  # a failed attempt first, after the state was opened
            def broken(rows=rows):
                yield from frames(rows[:3], 3)
                raise OSError("lost")
            with pytest.raises(OSError):
                run_task(str(tmp_path), b, f"t{b}-x", broken(), frame_rows=2, **ON)
        out, source = run_task(str(tmp_path), b, attempt, frames(rows), frame_rows=2, **ON)
        expected.update(rows)
        sources[source] += 1
        got = counts(out)
        assert got == {k: expected[k] for k in set(rows)}
    assert sources["resident"] > 0


@pytest.mark.spark
def test_spark_query_with_instances_kept_open_counts_exactly_once(spark, tmp_path):
    # Spark hands each partition's next task to whichever Python worker is idle: some tasks
    # find their instance in their worker ("resident"), the others have it handed over by
    # the worker that kept it ("working_dir").
    import processors as P
    from harness import check_batches, random_batches, run_stream, running_counts, write_batches

    from statebackend import RocksDBStateBackend, StateBackendOptions
    from statebackend.metrics_store import read_metrics

    data = random_batches(6, seed=31, rows=80, keys=25)
    write_batches(str(tmp_path / "in"), data)
    be = RocksDBStateBackend(str(tmp_path / "state"), StateBackendOptions(
        parallelism=2, local_dir=str(tmp_path / "local"), keep_instances_open=True))
    ours = run_stream(spark, str(tmp_path / "in"), "k STRING, x BIGINT, ts TIMESTAMP",
                      lambda df: be.map_in_pandas(df, "k", P.vector_count, "k STRING, v BIGINT",
                                                  state_schema="c BIGINT", operator_id="kept"),
                      str(tmp_path / "ck"))
    check_batches(ours, running_counts(data)[0])
    be.complete("kept")
    sources = Counter()
    for line in read_metrics(be.coordinator("kept").store, "kept"):
        sources.update(line.get("restore_sources") or {})
    logging.getLogger(__name__).warning("restore sources, instances kept open: %s", sources)
    assert sum(sources.values()) == 12 and sources["empty"] == 2
    # kept here, handed over by another worker, or (owner busy) the local copy
    assert set(sources) <= {"empty", "resident", "working_dir", "local_copy"}, sources


def test_local_directory_deleted_under_a_live_worker(tmp_path):
    # As on a machine whose local disk was wiped: the kept instance's directory is gone,
    # so it is not reused (RocksDB could not write its next file); the task restores from
    # durable storage and counts once.
    import shutil

    run_task(str(tmp_path), 0, "t0", frames(["a", "b"]), **ON)
    shutil.rmtree(tmp_path / "local")
    out, source = run_task(str(tmp_path), 1, "t1", frames(["a"]), **ON)
    assert source == "durable" and counts(out) == {"a": 2}
