"""Reading and publishing checkpoint manifests through a :class:`DurableStore`.

The models live in :mod:`statebackend.model.manifest` (pure); this module is their IO.
Paths are relative to the *operator root* (``<store root>/<operator_id>``); pass
``operator_id`` when the store is rooted at the backend root instead.
"""

from __future__ import annotations

from ..errors import CheckpointNotFoundError, CorruptStateError
from ..model.manifest import (
    MANIFEST_NAME,
    CompletedCheckpoint,
    PartitionManifest,
    check_component,
    check_relative,
    checkpoint_dir,
    completed_record_path,
)
from .base import DurableStore


def operator_store(store: DurableStore, operator_id: str | None) -> DurableStore:
    """The store rooted at one operator's root (``store`` itself when ``operator_id`` is None)."""
    if operator_id is None:
        return store
    return store.child(check_component(operator_id))


def read_completed_record(store: DurableStore, checkpoint_id: int) -> CompletedCheckpoint | None:
    """The completed-checkpoint record ``checkpoint_id`` in an operator's store, or None
    when it has none (not completed yet, or dropped by retention)."""
    rel = completed_record_path(checkpoint_id)
    try:
        data = store.get_bytes(rel)
    except FileNotFoundError:
        return None
    return CompletedCheckpoint.from_json(data, where=rel)


def read_manifest(store: DurableStore, path: str, *, operator_id: str | None = None
                  ) -> PartitionManifest:
    """Read and validate the partition manifest at ``path``.

    Parameters
    ----------
    store : DurableStore
        Rooted at the operator root, or at the backend root with ``operator_id`` given.
    path : str
        Manifest path relative to the operator root (``chk-3/p0/<attempt>/_MANIFEST.json``).
    operator_id : str, optional
        Operator directory under the store root.

    Returns
    -------
    PartitionManifest

    Raises
    ------
    CheckpointNotFoundError
        No manifest at ``path``.
    CorruptStateError
        The manifest is malformed, or describes another checkpoint than its path says.
    UnsafePathError
        ``path`` or a file path inside the manifest escapes the root.
    """
    check_relative(path)
    ostore = operator_store(store, operator_id)
    try:
        raw = ostore.get_bytes(path)
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(f"no manifest at {path} under {ostore.root}") from exc
    return _parse(raw, path, operator_id)


def read_manifests(store: DurableStore, paths: list[str], *, operator_id: str | None = None
                   ) -> list[PartitionManifest]:
    """:func:`read_manifest` of each path, read in parallel (one small GET each; the time
    of reading many is the store's latency); results in input order, same errors."""
    for path in paths:
        check_relative(path)
    ostore = operator_store(store, operator_id)
    out = []
    for path, raw in zip(paths, ostore.get_bytes_many(paths)):
        if raw is None:
            raise CheckpointNotFoundError(f"no manifest at {path} under {ostore.root}")
        out.append(_parse(raw, path, operator_id))
    return out


def read_recorded_manifests(store: DurableStore, record: CompletedCheckpoint,
                            partitions: list[int] | None = None, *,
                            operator_id: str | None = None) -> dict[int, PartitionManifest]:
    """The manifests a completed-checkpoint record names (all, or those of
    ``partitions``), read in parallel, each checked against the record: the digest it
    recorded, and the checkpoint, partition, operator and key groups the manifest
    describes (:meth:`CompletedCheckpoint.check_manifest`).

    Raises
    ------
    CorruptStateError
        A manifest is missing, malformed or not the one the record chose, naming its path.
    IncompatibleStateError
        The record has no such partition (it was written with another parallelism).
    """
    from ..errors import IncompatibleStateError

    ostore = operator_store(store, operator_id)
    parts = sorted(record.manifests) if partitions is None else list(partitions)
    for p in parts:
        if p not in record.manifests:
            raise IncompatibleStateError(
                f"checkpoint {record.checkpoint_id} has no partition {p} (it was written "
                f"with parallelism {record.parallelism})")
    paths = [record.manifests[p] for p in parts]
    out = {}
    for p, path, raw in zip(parts, paths, ostore.get_bytes_many(paths)):
        if raw is None:
            raise CorruptStateError(
                f"{path}: the manifest of partition {p} that {record.path} names is missing; "
                f"restore from another retained checkpoint", checkpoint_id=record.checkpoint_id,
                partition=p, path=path)
        manifest = _parse(raw, path, operator_id)
        record.check_manifest(p, manifest, raw, path)
        out[p] = manifest
    return out


def _parse(raw: bytes, path: str, operator_id: str | None) -> PartitionManifest:
    manifest = PartitionManifest.from_json(raw, where=path)
    if manifest.path != path:
        # A manifest copied or written to another place must not be trusted for it.
        raise CorruptStateError(
            f"{path}: manifest describes checkpoint {manifest.checkpoint_id} partition "
            f"{manifest.partition} attempt {manifest.attempt!r}, which belongs at "
            f"{manifest.path}", checkpoint_id=manifest.checkpoint_id,
            partition=manifest.partition, path=path)
    if operator_id is not None and manifest.operator_id != operator_id:
        raise CorruptStateError(f"{path}: manifest of operator {manifest.operator_id!r} found "
                                f"under operator {operator_id!r}", path=path,
                                checkpoint_id=manifest.checkpoint_id,
                                partition=manifest.partition)
    return manifest


def publish_manifest(store: DurableStore, manifest: PartitionManifest) -> str:
    """Publish ``manifest`` atomically at its own path; returns that path.

    Call only after every file the manifest references is durable (invariant 3).
    """
    store.put_bytes_atomic(manifest.path, manifest.to_json().encode())
    return manifest.path


def list_published_manifests(store: DurableStore, checkpoint_id: int, partition: int, *,
                             operator_id: str | None = None) -> list[PartitionManifest]:
    """Every published attempt of one (checkpoint, partition), sorted by attempt name.

    Lists only ``chk-<n>/p<partition>/`` (a bounded listing). Pick one with
    :func:`statebackend.model.manifest.choose_manifest`.
    """
    ostore = operator_store(store, operator_id)
    base = f"{checkpoint_dir(checkpoint_id)}/p{partition}"
    out = []
    for rel in ostore.list_dir(base):
        parts = rel.split("/")
        if len(parts) == 4 and parts[3] == MANIFEST_NAME:
            out.append(read_manifest(ostore, rel))
    return sorted(out, key=lambda m: m.attempt)
