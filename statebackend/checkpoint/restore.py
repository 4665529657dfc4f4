"""Downloading a partition checkpoint from durable storage, with typed errors.

A missing or corrupt durable file raises :class:`CorruptStateError` naming the checkpoint,
partition and file; the target directory is then removed, so no caller ever sees an empty
or partial state.
"""

from __future__ import annotations

import os
import shutil

from ..errors import CorruptStateError, StorageError, UnsafePathError
from ..storage.base import DurableStore
from .manifest import PartitionManifest, check_component, check_relative


def validate_manifest(manifest: PartitionManifest, operator_id: str | None = None) -> None:
    """Refuse a manifest with a path outside the root, duplicate names, or another operator.

    Raises
    ------
    UnsafePathError
        A file name or durable path escapes its root.
    CorruptStateError
        Duplicate names, or the manifest belongs to another operator.
    """
    seen: set[str] = set()
    for f in manifest.files:
        try:
            check_component(f.name)
            check_relative(f.path)
        except UnsafePathError as exc:
            raise UnsafePathError(f"checkpoint {manifest.checkpoint_id} partition "
                                  f"{manifest.partition}: {exc}") from exc
        if f.name in seen:
            raise CorruptStateError(f"{manifest.path}: file {f.name} listed twice",
                                    checkpoint_id=manifest.checkpoint_id,
                                    partition=manifest.partition, path=f.path)
        seen.add(f.name)
    if operator_id is not None and manifest.operator_id != operator_id:
        raise CorruptStateError(f"{manifest.path}: manifest of operator "
                                f"{manifest.operator_id!r}, expected {operator_id!r}",
                                checkpoint_id=manifest.checkpoint_id,
                                partition=manifest.partition, path=manifest.path)


def download_checkpoint(store: DurableStore, manifest: PartitionManifest,
                        target_dir: str) -> tuple[int, int]:
    """Download every file of ``manifest`` into ``target_dir``, verifying size and CRC32.

    Parameters
    ----------
    store : DurableStore
        Rooted at the operator root.
    manifest : PartitionManifest
        What to download.
    target_dir : str
        An empty local directory; removed if the download fails.

    Returns
    -------
    tuple of (int, int)
        Bytes and files downloaded.

    Raises
    ------
    CorruptStateError
        A durable file is missing, truncated or fails its checksum.
    """
    validate_manifest(manifest)
    items = [(f.path, os.path.join(target_dir, f.name), f.size, f.checksum)
             for f in manifest.files]
    try:
        transfers = store.get_files(items)
    except (StorageError, FileNotFoundError) as exc:
        shutil.rmtree(target_dir, ignore_errors=True)
        bad = getattr(exc, "path", None) or _which_file(store, manifest)
        raise CorruptStateError(
            f"checkpoint {manifest.checkpoint_id} partition {manifest.partition} "
            f"(attempt {manifest.attempt}): durable file {bad or '?'} is missing or corrupt "
            f"({exc}); the committed state cannot be restored from {store.root}",
            checkpoint_id=manifest.checkpoint_id, partition=manifest.partition,
            path=bad) from exc
    return sum(t.size for t in transfers), len(transfers)


def _which_file(store: DurableStore, manifest: PartitionManifest) -> str | None:
    """The first file whose durable size is wrong or absent (to name it in the error)."""
    try:
        for f in manifest.files:
            if store.size(f.path) != f.size:
                return f.path
    except Exception:  # noqa: BLE001 - only improves the message
        return None
    # Sizes are right, so a checksum failed; report the largest file as the likely one.
    return None
