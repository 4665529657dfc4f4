"""Unit tests of the task side that need no SparkSession: grouping and output assembly."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from statebackend.keycodec import decode_grouping_key
from statebackend.keygroups import key_groups
from statebackend.spark.plan import KeySpec
from statebackend.spark.runner import concat_frames
from statebackend.spark.task import group_by_key


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "é", ""]), st.integers(-3, 3)),
                min_size=0, max_size=40))
def test_group_by_key_gives_every_row_once_under_its_key(rows):
    pdf = pd.DataFrame(rows, columns=["k", "n"]) if rows else pd.DataFrame(
        {"k": pd.Series([], dtype=object), "n": pd.Series([], dtype="int64")})
    pdf["x"] = np.arange(len(pdf))
    spec = KeySpec(("k", "n"), ("string", "bigint"))
    kg = key_groups([pdf["k"], pdf["n"].to_numpy()], list(spec.types), 128) if len(pdf) else []
    g = group_by_key(pdf, spec, kg)
    # without Spark's key groups the task computes the same ones per key
    computed = group_by_key(pdf, spec, None, 128)
    assert computed.key_bytes == g.key_bytes and computed.key_groups.tolist() == g.key_groups.tolist()
    assert list(g.frame.columns) == ["k", "n", "x"]
    seen = []
    assert len(set(g.keys)) == len(g.keys)
    for i in range(len(g)):
        rows_i = g.rows(i)
        assert len(rows_i) > 0
        assert set(zip(rows_i["k"], rows_i["n"])) == {g.keys[i]}
        assert decode_grouping_key(g.key_bytes[i], list(spec.types))[1] == g.keys[i]
        seen.extend(rows_i["x"].tolist())
    assert sorted(seen) == list(range(len(pdf)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-5, 5), min_size=1, max_size=4), min_size=1, max_size=12),
       st.booleans())
def test_concat_frames_equals_pandas_concat(sizes, mixed):
    # the runner drops empty outputs before assembling, so frames here are non-empty
    frames = []
    for i, vals in enumerate(sizes):
        v = [float(x) for x in vals] if (mixed and i % 2) else vals
        frames.append(pd.DataFrame({"k": [f"k{x}" for x in vals], "v": v}))
    expected = pd.concat(frames, ignore_index=True)
    pd.testing.assert_frame_equal(concat_frames(frames), expected)
