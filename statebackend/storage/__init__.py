"""Durable storage: the only package that does remote IO (through fsspec)."""

from __future__ import annotations

from .base import DurableStore, StoreFileNotFoundError, Transfer
from .checksum import bytes_crc32, file_crc32
from .fsspec_store import FsspecStore, open_store
from .manifests import list_published_manifests, operator_store, publish_manifest, read_manifest

__all__ = [
    "DurableStore",
    "FsspecStore",
    "StoreFileNotFoundError",
    "Transfer",
    "bytes_crc32",
    "file_crc32",
    "list_published_manifests",
    "open_store",
    "operator_store",
    "publish_manifest",
    "read_manifest",
]
