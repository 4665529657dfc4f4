"""Test helpers for the coordinator: a crash-injecting store and simulated checkpoint tasks.

A simulated task writes exactly what a real partition checkpoint writes (uploads under its
attempt directory, reuse of the base manifest's shared files, a manifest published last),
with tiny in-memory file contents, so the coordinator can be tested on every store kind
without RocksDB.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import replace

from statebackend.coordinator import key_group_range
from statebackend.model.manifest import FileEntry, PartitionManifest, attempt_dir
from statebackend.storage.base import DurableStore, Transfer

OP = "op1"


class SimulatedCrash(Exception):
    """The driver died here (raised by :class:`FaultStore`)."""


class FaultStore(DurableStore):
    """Passes everything to ``inner``; the mutating call number ``crash_after + 1`` crashes.

    Deletions are applied one path at a time, so a crash can cut a batch in half.
    """

    def __init__(self, inner: DurableStore, crash_after: int | None = None) -> None:
        self.inner = inner
        self.root = inner.root
        self.crash_after = crash_after
        self.ops = 0

    def _tick(self) -> None:
        if self.crash_after is not None and self.ops >= self.crash_after:
            raise SimulatedCrash(f"crash before mutating call {self.ops + 1}")
        self.ops += 1

    def put_file(self, local_path: str, path: str) -> Transfer:
        self._tick()
        return self.inner.put_file(local_path, path)

    def get_file(self, path: str, local_path: str, *, size: int | None = None,
                 checksum: str | None = None) -> Transfer:
        return self.inner.get_file(path, local_path, size=size, checksum=checksum)

    def put_bytes_atomic(self, path: str, data: bytes) -> None:
        self._tick()
        self.inner.put_bytes_atomic(path, data)

    def get_bytes(self, path: str) -> bytes:
        return self.inner.get_bytes(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def size(self, path: str) -> int | None:
        return self.inner.size(path)

    def delete(self, paths: Iterable[str]) -> None:
        for p in paths:
            self._tick()
            self.inner.delete([p])

    def list_dir(self, path: str) -> list[str]:
        return self.inner.list_dir(path)


class CountingStore(FaultStore):
    """Counts listings by directory, to prove no step lists the whole store."""

    def __init__(self, inner: DurableStore) -> None:
        super().__init__(inner)
        self.listed: list[str] = []

    def list_dir(self, path: str) -> list[str]:
        self.listed.append(path)
        return super().list_dir(path)


def crc(data: bytes) -> str:
    return f"crc32:{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def content(partition: int, name: str, size: int) -> bytes:
    """Deterministic content of one simulated SST (same for every attempt)."""
    seed = f"{partition}/{name}/".encode()
    return (seed * (size // len(seed) + 1))[:size]


def private_files(checkpoint_id: int, partition: int,
                  ssts: Mapping[str, bytes]) -> dict[str, bytes]:
    """The small per-checkpoint files (RocksDB's CURRENT and OPTIONS, say)."""
    return {"CURRENT": f"{checkpoint_id}:{partition}:{','.join(sorted(ssts))}".encode(),
            "OPTIONS": f"options of p{partition}".encode()}


def run_attempt(store: DurableStore, checkpoint_id: int, partition: int, attempt: str,
                ssts: Mapping[str, bytes], base: PartitionManifest | None, *,
                parallelism: int, max_parallelism: int, die_after: int | None = None,
                op: str = OP) -> PartitionManifest | None:
    """One task attempt: upload new files, reuse the base's, publish the manifest last.

    Returns the published manifest, or None when the attempt died after ``die_after``
    uploads, before publishing.
    """
    reusable = base.shared_files() if base is not None else {}
    files: list[FileEntry] = []
    uploads = 0
    everything = {**ssts, **private_files(checkpoint_id, partition, ssts)}
    for name in sorted(everything):
        data = everything[name]
        shared = name.endswith(".sst")
        if shared and name in reusable:
            files.append(replace(reusable[name], uploaded=False))
            continue
        if die_after is not None and uploads >= die_after:
            return None
        path = f"{attempt_dir(checkpoint_id, partition, attempt)}/{name}"
        store.put_bytes_atomic(f"{op}/{path}", data)
        uploads += 1
        files.append(FileEntry(name=name, path=path, size=len(data), checksum=crc(data),
                               shared=shared, uploaded=True))
    if die_after is not None and uploads >= die_after:
        return None
    start, end = key_group_range(partition, parallelism, max_parallelism)
    m = PartitionManifest(operator_id=op, partition=partition, checkpoint_id=checkpoint_id,
                          attempt=attempt, key_group_start=start, key_group_end=end,
                          max_parallelism=max_parallelism, files=tuple(files),
                          base_checkpoint_id=None if base is None else base.checkpoint_id)
    store.put_bytes_atomic(f"{op}/{m.path}", m.to_json().encode())
    return m


def all_files(store: DurableStore, op: str = OP) -> set[str]:
    """Every file of the operator (tests only: the coordinator never lists this much)."""
    prefix = f"{op}/"
    return {p[len(prefix):] for p in store.list_dir(op)}
