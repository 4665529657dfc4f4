"""A restore fetches the changelogs after its base a few at a time while it replays them in
order (each request pays its latency once, not one after another), within a bound of files
and bytes, and a missing one still fails the restore with a typed error naming it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_changelog import Model, apply, dump, options

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint import restore as restore_mod
from statebackend.checkpoint.materialize import wait_for_materializations
from statebackend.checkpoint.restore import open_checkpoint
from statebackend.errors import CorruptStateError
from statebackend.model.manifest import PartitionManifest
from statebackend.storage import open_store
from statebackend.storage.manifests import operator_store

OP = "op"


class Counting:
    """Counts the changelog reads of ``store`` under way at once (its own ``get_bytes``,
    which its parallel ``get_bytes_many`` calls, is replaced); with ``meet`` set, each read
    waits (up to 10 s) until that many are under way together."""

    def __init__(self, store: Any, meet: int = 0) -> None:
        self.store = store
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.barrier = threading.Barrier(meet, timeout=10) if meet else None
        self.read = store.get_bytes
        store.get_bytes = self.get_bytes

    def get_bytes(self, path: str) -> bytes:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            if self.barrier is not None:
                self.barrier.wait()
            return self.read(path)
        finally:
            with self.lock:
                self.now -= 1


def _chain(tmp_path: Path, batches: int) -> tuple[Any, PartitionManifest, Model]:
    """A base and ``batches`` changelogs of ~20 KiB after it; the store, manifest, model."""
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = options(materialize_interval=1000, materialize_changelog_ratio=100.0)
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local"))
    inst, _ = cp.restore(None)
    model: Model = {}
    m = None
    for n in range(batches + 1):
        apply(inst, model, [("batch", "default", [(b"k%03d-%d" % (i, n), os.urandom(1024))
                                                  for i in range(20)])])
        m, _ = cp.checkpoint(inst, n, "a0", (0, 127))
        cp.resume(m, inst)
        if n == 0:  # the base: materialized (in the background) before the chain grows,
            wait_for_materializations()  # however slow the machine
    inst.close()
    assert m is not None and len(m.changelog_files) == batches
    return operator_store(store, OP), m, model


def test_changelogs_are_fetched_together_and_replayed_in_order(tmp_path: Path) -> None:
    store, m, model = _chain(tmp_path, 8)
    # four reads must be under way at once, or each waits out its barrier and fails
    counting = Counting(store, meet=restore_mod.READ_AHEAD_FILES)
    inst = open_checkpoint(store, m, str(tmp_path / "restored"))
    try:
        assert dump(inst) == model
    finally:
        inst.close()
    assert counting.most == restore_mod.READ_AHEAD_FILES


def test_read_ahead_stays_within_its_bytes(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    store, m, model = _chain(tmp_path, 6)
    size = max(f.size for f in m.changelog_files)
    monkeypatch.setattr(restore_mod, "READ_AHEAD_BYTES", 2 * size)
    counting = Counting(store)
    inst = open_checkpoint(store, m, str(tmp_path / "restored"))
    try:
        assert dump(inst) == model
    finally:
        inst.close()
    assert 1 <= counting.most <= 2


def test_a_missing_changelog_in_the_window_fails_the_restore(tmp_path: Path) -> None:
    store, m, _model = _chain(tmp_path, 6)
    gone = m.changelog_files[3]
    store.delete([gone.path])
    with pytest.raises(CorruptStateError, match=gone.path) as info:
        open_checkpoint(store, m, str(tmp_path / "restored")).close()
    assert info.value.path == gone.path


def test_the_next_reads_overlap_the_replay(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The first changelog's replay waits until a read of the second window has started:
    reads happen on a thread of their own while the consumer replays, or this fails."""
    store, m, model = _chain(tmp_path, 8)
    later = {f.path for f in m.changelog_files[restore_mod.READ_AHEAD_FILES:]}
    read_later = threading.Event()
    read = store.get_bytes

    def get_bytes(path: str) -> bytes:
        if path in later:
            read_later.set()
        return read(path)

    store.get_bytes = get_bytes
    replay, waited = restore_mod.replay, []

    def slow_replay(instance: Any, data: bytes, where: str = "") -> int:
        if not waited:
            waited.append(read_later.wait(10))
        return replay(instance, data, where=where)

    monkeypatch.setattr(restore_mod, "replay", slow_replay)
    inst = open_checkpoint(store, m, str(tmp_path / "restored"))
    try:
        assert dump(inst) == model
    finally:
        inst.close()
    assert waited == [True]


def test_reading_ahead_keeps_order_raises_where_it_failed_and_stops_when_closed() -> None:
    def items():
        yield from range(5)
        raise CorruptStateError("the sixth is damaged")

    ahead = restore_mod._Ahead(items(), 2)
    got = []
    with pytest.raises(CorruptStateError, match="sixth"):
        for x in ahead:
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    # never consumed (the units' download failed first): close stops its thread
    endless = restore_mod._Ahead(iter(int, 1), 2)
    endless.close()
    endless._thread.join(5)
    assert not endless._thread.is_alive()
    assert list(endless) == []


def test_a_consumer_waiting_in_another_thread_ends_when_closed() -> None:
    # the merging thread waits for the next piece from the reading thread; a restore that
    # fails (its units' download, say) closes both: the merging thread must end too
    # (else it waits forever, holding up to a merge of pieces in memory)
    def slow():
        yield 1
        threading.Event().wait(30)  # a read that never comes back in time
        yield 2

    ahead = restore_mod._Ahead(slow(), 2)
    assert next(ahead) == 1
    got: list = []
    consumer = threading.Thread(target=lambda: got.extend(ahead), daemon=True)
    consumer.start()
    time.sleep(0.1)  # the consumer now waits for the second item
    ahead.close()
    consumer.join(5)
    assert not consumer.is_alive() and got == []
