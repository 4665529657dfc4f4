"""What a streaming task yields for Spark's progress (frames_with_metrics), without Spark:
the user's rows unchanged with the hidden column null, then exactly one metrics row, in
one frame built over the column arrays; equal, column by column and dtype by dtype, to the
user's frame with the row appended by pandas itself. Request counts (two per metrics row)
convert without dataclasses.asdict."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from statebackend.storage.accounting import RequestCounts
from statebackend.task.metrics_rows import METRICS_COL, frames_with_metrics

VALUES = {"partitions": 1, "input_rows": 3, "sync_ms": 1.5}
TEXT = json.dumps(VALUES, separators=(",", ":"))


def user_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "k": ["a", "b", None], "v": np.array([1, 2, 3], dtype=np.int64),
        "f": [1.5, np.nan, 2.0], "t": pd.to_datetime(["2024-01-01", None, "2024-01-03"]),
        "tz": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03"]).tz_localize("UTC"),
        "i": pd.array([1, None, 3], dtype="Int64"), "c": pd.Categorical(["x", "y", "x"]),
        "s": pd.array(["p", None, "q"], dtype="string"), "o": [{"a": 1}, None, [1, 2]],
        "b": [True, False, True]}, index=[10, 11, 12])


def test_one_frame_holds_the_user_rows_then_the_metrics_row():
    frame = user_frame()
    before = frame.copy()
    out = frames_with_metrics(frame, {c: None for c in frame.columns}, VALUES)
    assert len(out) == 1
    expected = pd.concat([frame, frame.iloc[:1]], ignore_index=True)
    expected[METRICS_COL] = [None] * len(frame) + [TEXT]
    pd.testing.assert_frame_equal(out[0], expected)  # values, dtypes, names, RangeIndex
    pd.testing.assert_frame_equal(frame, before)  # the user's frame is not changed
    # the result is an ordinary frame: pandas operations on it work
    assert out[0][METRICS_COL].isna().sum() == len(frame)
    assert out[0].iloc[-1][METRICS_COL] == TEXT and len(out[0].copy()) == 4


def test_no_output_rows_gives_the_metrics_row_alone():
    for frame in (None, user_frame().iloc[:0]):
        out = frames_with_metrics(frame, {"k": "", "v": None}, VALUES)
        assert len(out) == 1
        assert list(out[0].columns) == ["k", "v", METRICS_COL]
        assert out[0].iloc[0].tolist() == ["", None, TEXT]


@pytest.mark.parametrize("frame", [
    pd.DataFrame([[1, 2]], columns=["k", "k"]),  # duplicate names
    pd.DataFrame({"k": [1], METRICS_COL: [None]}),  # the hidden column already there
], ids=["duplicate-names", "hidden-column-present"])
def test_frames_pandas_cannot_hold_in_one_go_as_two(frame):
    out = frames_with_metrics(frame, {"k": None}, VALUES)
    assert len(out) == 2
    assert out[0][METRICS_COL].isna().all() and len(out[0]) == 1
    assert out[1][METRICS_COL].tolist() == [TEXT]


def test_request_counts_round_trip_through_dicts():
    c = RequestCounts(put=1, parts=2, get=3, head=4, list=5, delete=6, bytes_up=7, bytes_down=8)
    d = c.to_dict()
    assert d == {"put": 1, "parts": 2, "get": 3, "head": 4, "list": 5, "delete": 6,
                 "bytes_up": 7, "bytes_down": 8}
    assert RequestCounts.from_dict(d) == c
    assert RequestCounts.from_dict({"get": "2"}) == RequestCounts(get=2)
    assert RequestCounts.from_dict(None) == RequestCounts()


def manifest(**metrics):
    from statebackend.model.manifest import FileEntry, PartitionManifest

    files = (FileEntry("000001.sst", "chk-2/p0/a/000001.sst", 100, "crc32:00000000", True,
                       True),
             FileEntry("000002.sst", "chk-1/p0/a/000002.sst", 50, "crc32:00000000", True,
                       False))
    return PartitionManifest("op", 0, 2, "a", 0, 127, 128, files, metrics=metrics)


@pytest.mark.parametrize("metrics", [
    {"rows": 5, "restore": {"source": "durable", "duration_s": 0.5, "bytes_downloaded": 9},
     "rocksdb": {"state_entries": 3, "l0_files": 2}, "sync_duration_s": 0.25,
     "bytes_uploaded": 100, "files_uploaded": 1, "files_reused": 1,
     "restore_requests": {"get": 3}, "checkpoint_requests": {"put": 2, "bytes_up": 100}},
    {"rows": 5},  # older manifests: uploads counted from the files
], ids=["recorded", "from-files"])
def test_the_task_metrics_row_skips_request_counts_and_nothing_else(metrics):
    from statebackend.metrics import partition_progress, partition_stats

    m = manifest(**metrics)
    full, lean = partition_stats(m, None), partition_stats(m, None, requests=False)
    assert lean.requests == {} and (full.requests != {}) == ("restore_requests" in metrics)
    assert partition_progress(lean) == partition_progress(full)
    assert (lean.bytes_uploaded, lean.files_uploaded, lean.files_reused, lean.full_size) == \
        (100, 1, 1, 150)
