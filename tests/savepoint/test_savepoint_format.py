"""The pure savepoint format: blocks, block table, trailer, checksums."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statebackend.errors import CorruptKeyGroupError, CorruptStateError, OptionsError
from statebackend.model.manifest import StateDescriptor
from statebackend.savepoint.format import (
    GLOBAL_KEY_GROUP,
    MAGIC,
    TRAILER_SIZE,
    BlockInfo,
    FileMeta,
    SavepointFile,
    SavepointManifest,
    compress,
    decode_block,
    decode_footer,
    decode_trailer,
    encode_block,
    encode_footer,
    verify_block,
)

entries_st = st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=200)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(entries_st)
def test_block_round_trip(entries):
    raw, n = encode_block(entries)
    assert n == len(entries)
    assert decode_block(raw) == entries


@pytest.mark.parametrize("compression", ["snappy", "none"])
def test_verify_block_accepts_good_and_names_key_group_when_bad(compression):
    kg = 7
    entries = [(kg.to_bytes(2, "big") + b"key%d" % i, b"v" * i) for i in range(50)]
    raw, n = encode_block(entries)
    stored = compress(raw, compression)
    info = BlockInfo(0, kg, 8, len(stored), len(raw), n, zlib.crc32(stored))
    assert verify_block(info, stored, compression, cf_name="c", path="f") == entries
    flipped = bytearray(stored)
    flipped[len(flipped) // 2] ^= 0x40
    with pytest.raises(CorruptKeyGroupError) as e:
        verify_block(info, bytes(flipped), compression, cf_name="c", path="dir/f.sbsp")
    assert e.value.key_group == kg and e.value.path == "dir/f.sbsp"
    assert "key group 7" in str(e.value) and "dir/f.sbsp" in str(e.value)
    with pytest.raises(CorruptKeyGroupError, match="bytes read"):
        verify_block(info, stored[:-1], compression, cf_name="c", path="f")


def test_verify_block_refuses_a_key_of_another_key_group():
    entries = [(b"\x00\x03abc", b"v")]
    raw, n = encode_block(entries)
    info = BlockInfo(0, 4, 8, len(raw), len(raw), n, zlib.crc32(raw))
    with pytest.raises(CorruptKeyGroupError, match="not in the key group"):
        verify_block(info, raw, "none", cf_name="c", path="f")


def test_snappy_compresses_repetitive_blocks():
    raw, _ = encode_block([(b"\x00\x01key%06d" % i, b"value" * 6) for i in range(1000)])
    assert len(compress(raw, "snappy")) < len(raw) // 3


def test_unknown_compression_is_an_options_error():
    with pytest.raises(OptionsError):
        compress(b"x", "zstd")


def test_footer_round_trip_and_lookup():
    meta = FileMeta(128, 10, 20, "snappy", ("_meta", "count"),
                    (StateDescriptor("count", "value", "c BIGINT", None, 5),))
    blocks = [BlockInfo(1, kg, 8 + 10 * i, 10, 30, 2, 99) for i, kg in enumerate(range(10, 21))]
    blocks.append(BlockInfo(0, GLOBAL_KEY_GROUP, 200, 5, 5, 1, 1))
    off = 300
    footer = encode_footer(meta, blocks, off)
    body, trailer = footer[:-TRAILER_SIZE], footer[-TRAILER_SIZE:]
    moff, mlen, nblocks, crc = decode_trailer(trailer, "f")
    assert (moff, nblocks) == (off, len(blocks))
    meta2, rows = decode_footer(body, mlen, nblocks, crc, "f")
    assert meta2 == meta
    assert sorted(rows, key=lambda b: b.offset) == sorted(blocks, key=lambda b: b.offset)
    f = SavepointFile("f", meta2, rows)
    assert [b.key_group for b in f.blocks_of(12)] == [12]
    assert [b.key_group for b in f.blocks_in(15, 17)] == [15, 16, 17]
    assert [b.cf for b in f.blocks_of(GLOBAL_KEY_GROUP)] == [0]
    assert f.blocks_of(99) == []
    with pytest.raises(CorruptStateError, match="checksum"):
        decode_footer(body[:5] + b"X" + body[6:], mlen, nblocks, crc, "f")


def test_trailer_refuses_other_files_and_versions():
    good = encode_footer(FileMeta(8, 0, 7, "none", ()), [], 8)[-TRAILER_SIZE:]
    with pytest.raises(CorruptStateError, match="magic"):
        decode_trailer(good[:-8] + b"NOTMAGIC", "f")
    with pytest.raises(CorruptStateError, match="truncated"):
        decode_trailer(good[1:], "f")
    assert len(MAGIC) == 8


def test_savepoint_manifest_round_trip_and_overlap():
    m = SavepointManifest("sp", "op", 4, 2, 8, "snappy",
                          {"part-00000-00003.sbsp": {"key_group_start": 0, "key_group_end": 3,
                                                     "size": 1, "checksum": "c"},
                           "part-00004-00007.sbsp": {"key_group_start": 4, "key_group_end": 7,
                                                     "size": 1, "checksum": "c"}})
    again = SavepointManifest.from_json(m.to_json(), "x")
    assert again == m
    assert list(m.files_for(3, 4)) == ["part-00000-00003.sbsp", "part-00004-00007.sbsp"]
    assert list(m.files_for(5, 6)) == ["part-00004-00007.sbsp"]
    with pytest.raises(CorruptStateError):
        SavepointManifest.from_json(b"{not json", "x")
