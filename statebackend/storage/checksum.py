"""Streamed CRC32 checksums in the ``crc32:<8 hex>`` form manifests record."""

from __future__ import annotations

import zlib
from typing import BinaryIO

CHUNK = 1 << 20  # 1 MiB: large enough that zlib releases the GIL and threads overlap


def format_crc32(value: int) -> str:
    return f"crc32:{value & 0xFFFFFFFF:08x}"


def crc32_stream(fh: BinaryIO) -> tuple[int, str]:
    """Size and checksum of everything left in ``fh``."""
    crc = 0
    size = 0
    while True:
        chunk = fh.read(CHUNK)
        if not chunk:
            break
        crc = zlib.crc32(chunk, crc)
        size += len(chunk)
    return size, format_crc32(crc)


def file_crc32(path: str) -> tuple[int, str]:
    """Size and checksum of a local file.

    Parameters
    ----------
    path : str
        Local file path.

    Returns
    -------
    tuple of (int, str)
        ``(size, "crc32:xxxxxxxx")``.
    """
    with open(path, "rb") as fh:
        return crc32_stream(fh)


def bytes_crc32(data: bytes) -> str:
    return format_crc32(zlib.crc32(data))
