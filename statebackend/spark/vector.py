"""Batch-at-a-time keyed state for ``map_in_pandas``: whole columns of keys per call.

The user's function gets the partition's input as an iterator of pandas DataFrames and a
:class:`KeyedColumnState`; it reads and writes state for whole key columns at once (one
multi-get, one write batch), which avoids any per-row Python work in our code.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

from ..keycodec import encode_grouping_keys
from ..keygroups import key_groups
from ..state.backend import KeyedStateBackend

STATE_NAME = "columnState"


class KeyedColumnState:
    """Vectorised access to one value state keyed by the operator's key columns.

    Parameters
    ----------
    backend : KeyedStateBackend
        The partition's state.
    key_columns, key_types : sequence of str
        Grouping columns and their Spark type names.
    value_schema : StructType or DDL string
        Schema of the stored value; ``get`` returns a DataFrame with these columns.
    max_parallelism : int
        Number of key groups (keys are prefixed with theirs).
    """

    def __init__(self, backend: KeyedStateBackend, key_columns: Sequence[str],
                 key_types: Sequence[str], value_schema, max_parallelism: int) -> None:
        self._backend = backend
        self._key_columns = list(key_columns)
        self._key_types = list(key_types)
        self._max_parallelism = max_parallelism
        self._state = backend.value_state(STATE_NAME, value_schema)
        self._fields = list(self._state.codec.schema.names)

    @property
    def value_columns(self) -> list[str]:
        return list(self._fields)

    def _encode(self, keys: pd.DataFrame | pd.Series | Sequence) -> list[bytes]:
        if isinstance(keys, pd.Series):
            keys = keys.to_frame()
        if isinstance(keys, pd.DataFrame):
            cols = [keys[c].to_numpy() if c in keys.columns else keys.iloc[:, i].to_numpy()
                    for i, c in enumerate(self._key_columns)]
        else:
            cols = [np.asarray(keys, dtype=object)]
        kgs = key_groups(cols, self._key_types, self._max_parallelism)
        return encode_grouping_keys([list(c) for c in cols], self._key_types, kgs)

    def get(self, keys) -> pd.DataFrame:
        """Stored values for ``keys`` (a Series, a DataFrame of key columns, or a list),
        one row per key in the same order; missing keys give nulls (NaN/None)."""
        values = self._state.get_many(self._encode(keys))
        rows = [v if v is not None else (None,) * len(self._fields) for v in values]
        return pd.DataFrame.from_records(rows, columns=self._fields)

    def exists(self, keys) -> np.ndarray:
        return np.array([v is not None for v in self._state.get_many(self._encode(keys))])

    def put(self, keys, values: pd.DataFrame | Sequence[tuple]) -> None:
        """Store one value per key (``values`` rows align with ``keys``)."""
        if isinstance(values, pd.DataFrame):
            frame = values[self._fields] if all(f in values.columns for f in self._fields) else values
            tuples = list(frame.itertuples(index=False, name=None))
        elif isinstance(values, pd.Series):
            tuples = [(v,) for v in values.tolist()]
        else:
            tuples = [tuple(v) if isinstance(v, (tuple, list)) else (v,) for v in values]
        self._state.put_many(self._encode(keys), tuples)

    def delete(self, keys) -> None:
        self._state.delete_many(self._encode(keys))


def run_vector_function(func, backend: KeyedStateBackend, frames: Iterator[pd.DataFrame],
                        state: KeyedColumnState) -> list[pd.DataFrame]:
    out = []
    result = func(frames, state)
    for item in result if result is not None else ():
        if not isinstance(item, pd.DataFrame):
            raise TypeError(f"the map_in_pandas function must yield pandas DataFrames, got "
                            f"{type(item).__name__}")
        if len(item):
            out.append(item)
    return out
