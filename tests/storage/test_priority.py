"""Critical-path uploads first: a background materialization starts no file while a
checkpoint of the process uploads (statebackend/storage/priority.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint.materialize import upload_materialization
from statebackend.options import StateBackendOptions
from statebackend.storage import open_store
from statebackend.storage.priority import (
    critical_path,
    critical_uploads,
    yield_to_critical_path,
)


def test_yield_waits_for_every_critical_block_to_end() -> None:
    assert critical_uploads() == 0
    assert yield_to_critical_path() < 0.5  # nothing to wait for
    done = threading.Event()
    with critical_path():
        with critical_path():
            assert critical_uploads() == 2
            t = threading.Thread(target=lambda: (yield_to_critical_path(), done.set()))
            t.start()
        assert not done.wait(0.2)  # one block still runs
    assert done.wait(10)
    t.join()
    assert critical_uploads() == 0
    # bounded: a stuck checkpoint does not starve background work for ever
    with critical_path():
        waited = yield_to_critical_path(max_wait_s=0.05)
    assert 0.05 <= waited < 5


class Recording:
    """A store recording, for each upload, how many critical-path blocks were running."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.during: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def put_files(self, pairs: Any, **kw: Any) -> Any:
        pairs = list(pairs)
        self.during.extend(critical_uploads() for _ in pairs)
        return self.store.put_files(pairs, **kw)


def _snapshot(tmp_path: Path, files: int) -> Any:
    cp = PartitionCheckpointer(open_store(str(tmp_path / "unused")), "op", 0,
                               StateBackendOptions(checkpoint_mode="changelog"),
                               str(tmp_path / "local"))
    inst, _ = cp.restore(None)
    for i in range(files):  # one SST per flush
        inst.write({"default": {b"k%d-%d" % (i, j): os.urandom(64) for j in range(50)}})
        inst.flush()
    snap = cp.snapshot_sync(inst, 1, "a0")
    inst.close()
    return snap


def test_background_materialization_starts_no_file_during_a_checkpoint_upload(
        tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, 3)
    store = Recording(open_store(str(tmp_path / "durable")))
    result: dict[str, Any] = {}

    def background() -> None:
        result["m"] = upload_materialization(store, snap, (), key_group_range=(0, 127),
                                             max_parallelism=128)

    with critical_path():
        t = threading.Thread(target=background)
        t.start()
        time.sleep(0.3)
        assert store.during == []  # waiting: nothing uploaded while the checkpoint runs
    t.join(30)
    m = result["m"]
    sst = [f for f in snap.files if f.name.endswith(".sst")]
    assert len(sst) >= 3 and len(store.during) == len(snap.files)
    assert set(store.during) == {0}
    assert m.metrics["yielded_to_critical_path_s"] >= 0.2
    # in a batch's critical path (inline), all files go at once, in parallel
    store2 = Recording(open_store(str(tmp_path / "durable2")))
    with critical_path():
        upload_materialization(store2, snap, (), key_group_range=(0, 127), max_parallelism=128,
                               background=False)
    assert store2.during == [1] * len(snap.files)


def test_a_checkpoint_holds_the_critical_path_through_its_uploads(
        tmp_path: Path, monkeypatch: Any) -> None:
    from statebackend.checkpoint import materialize as materialize_mod
    from statebackend.checkpoint.materialize import wait_for_materializations
    from statebackend.storage.fsspec_store import FsspecStore

    during: list[tuple[bool, int]] = []  # (a background materialization's, blocks running)
    put_file = FsspecStore.put_file
    # the background uploads several files at once on the store's upload threads: a file
    # is the background's while its group uploads
    background_group = threading.Event()
    in_background = materialize_mod._upload_in_background

    def marked(*args: Any) -> Any:
        background_group.set()
        try:
            return in_background(*args)
        finally:
            background_group.clear()

    def recorded(self: Any, local_path: str, path: str) -> Any:
        during.append((background_group.is_set(), critical_uploads()))
        return put_file(self, local_path, path)

    monkeypatch.setattr(FsspecStore, "put_file", recorded)
    monkeypatch.setattr(materialize_mod, "_upload_in_background", marked)
    for mode in ("incremental", "changelog"):
        during.clear()
        cp = PartitionCheckpointer(open_store(str(tmp_path / mode / "durable")), "op", 0,
                                   StateBackendOptions(checkpoint_mode=mode,
                                                       materialize_inline_ratio=0),
                                   str(tmp_path / mode / "local"))
        inst, _ = cp.restore(None)
        inst.write({"default": {b"k%d" % i: b"v" for i in range(100)}})
        cp.checkpoint(inst, 1, "a0", (0, 127))
        inst.close()
        wait_for_materializations()
        # the checkpoint's own uploads ran marked; the materialization it started (changelog
        # mode's first batch) uploaded after it, unmarked
        assert {c for bg, c in during if not bg} == {1}, mode
        assert {c for bg, c in during if bg} == ({0} if mode == "changelog" else set())
        assert critical_uploads() == 0


def test_a_checkpoint_upload_does_not_queue_behind_a_background_group(
        tmp_path: Path, monkeypatch: Any) -> None:
    # A background group uploads on the store's background threads: its upload threads
    # stay free for the next batch's changelog.
    from statebackend.model.manifest import MATERIALIZED_PREFIX
    from statebackend.storage.fsspec_store import FsspecStore

    snap = _snapshot(tmp_path, 6)
    durable = open_store(str(tmp_path / "durable"))
    release, started = threading.Event(), threading.Event()
    put_file = FsspecStore.put_file

    def slow(self: Any, local_path: str, path: str) -> Any:
        if MATERIALIZED_PREFIX in path:  # a materialization's file: held until released
            started.set()
            assert release.wait(30)
        return put_file(self, local_path, path)

    monkeypatch.setattr(FsspecStore, "put_file", slow)
    result: dict[str, Any] = {}
    bg = threading.Thread(target=lambda: result.setdefault("m", upload_materialization(
        durable, snap, (), key_group_range=(0, 127), max_parallelism=128)))
    bg.start()
    try:
        assert started.wait(30)
        local = tmp_path / "changelog"
        local.write_bytes(b"x" * 1000)
        done = threading.Event()

        def checkpoint() -> None:
            with critical_path():
                durable.put_files([(str(local), f"chk/{i}") for i in range(8)])
            done.set()

        threading.Thread(target=checkpoint).start()
        # every background file of the group is still blocked, yet the checkpoint's
        # eight uploads (the store's four threads, twice) went through
        assert done.wait(10)
        assert not release.is_set() and "m" not in result
    finally:
        release.set()
        bg.join(30)
    assert result["m"].metrics["files_uploaded"] == len(snap.files)
