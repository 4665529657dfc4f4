"""Reading RocksDB's MANIFEST for the SST files it needs (statebackend.rocksdb.version_edits),
against what RocksDB itself reports as live."""

from __future__ import annotations

import os

import pytest
from rocksdict import Options, Rdict

from statebackend.rocksdb.version_edits import live_sst_numbers, sst_name


def _manifest_bytes(path: str) -> bytes:
    with open(os.path.join(path, "CURRENT")) as fh:
        name = fh.read().strip()
    with open(os.path.join(path, name), "rb") as fh:
        return fh.read()


def _live(db: Rdict) -> set[str]:
    return {f["name"].lstrip("/") for f in db.live_files()}


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "db")


def test_flushes_across_many_log_blocks_and_column_families(db_path):
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_disable_auto_compactions(True)  # every flush stays a file: a long MANIFEST
    db = Rdict(db_path, opts)
    other = db.create_column_family("other", opts)
    for i in range(400):
        db[f"k{i:05d}".encode()] = b"v" * 10
        other[f"o{i:05d}".encode()] = b"w"
        db.flush()
        if i % 2:
            other.flush()
    # compaction deletes files and adds one: DeletedFile and NewFile edits
    db.compact_range(None, None)
    live = _live(db)
    data = _manifest_bytes(db_path)
    db.close()
    assert len(data) > 32768, "the MANIFEST spans several 32 KiB log blocks"
    assert {sst_name(n) for n in live_sst_numbers(data)} == live
    assert len(live) > 200


def test_a_reopened_database_writes_a_fresh_snapshot_record(db_path):
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(db_path, opts)
    for i in range(5):
        db[f"k{i}".encode()] = b"v"
        db.flush()
    db.close()
    db = Rdict(db_path, opts)  # reopening starts a new MANIFEST with the whole version
    live = _live(db)
    db.close()
    assert {sst_name(n) for n in live_sst_numbers(_manifest_bytes(db_path))} == live


@pytest.mark.parametrize("data", [
    b"\x00\x00\x00\x00\x10\x00\x01abc",               # record longer than the file
    b"\x00\x00\x00\x00\x02\x00\x01\x07\x80",            # NewFile with a truncated varint
    b"\x00\x00\x00\x00\x02\x00\x01\xe7\x07",            # tag 999: unknown, not ignorable
    b"\x00\x00\x00\x00\x01\x00\x0cx",                   # record type 12: unknown
])
def test_what_it_does_not_understand_is_an_error_not_a_guess(data):
    with pytest.raises(ValueError):
        live_sst_numbers(data)
