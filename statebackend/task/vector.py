"""Batch-at-a-time keyed state for ``map_in_pandas``: whole columns of keys per call.

The user's function gets the partition's input as an iterator of pandas DataFrames and a
:class:`KeyedColumnState`; it reads and writes state for whole key columns at once (one
multi-get, one write batch), which avoids any per-row Python work in our code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from ..errors import SchemaError, SchemaEvolutionError, StateBackendError
from ..keys.columns import fixed_columns
from ..keys.grouping_key import encode_keys_with_groups
from ..keys.ranges import KeyGroupRange, check_max_parallelism
from ..state.backend import KeyedStateBackend
from ..state.value import ValueState
from .context import DEFAULT_FRAME_ROWS, kg_range_of

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
    key_group_range : KeyGroupRange, optional
        The key groups this partition owns: a key outside them is refused with a
        :class:`~statebackend.errors.StateBackendError` (its state belongs to another
        partition). The task passes its own; None accepts every key group.
    value_blocks : int, optional
        N (1..65535): the values are packed into N blocks per key group
        (:class:`~statebackend.state.value.BlockState`), so a batch costs one RocksDB call
        per block instead of one per key; each write rewrites the blocks it touches. None
        (the default): the layout the stored state has, one RocksDB entry per key for new
        state. Fixed for the life of the state: another N, or N for state stored one entry
        per key, is refused (``SchemaError``).
    """

    def __init__(self, backend: KeyedStateBackend, key_columns: Sequence[str],
                 key_types: Sequence[str], value_schema, max_parallelism: int,
                 key_group_range: KeyGroupRange | None = None,
                 value_blocks: int | None = None) -> None:
        self._backend = backend
        self._key_columns = list(key_columns)
        self._key_types = list(key_types)
        check_max_parallelism(max_parallelism)
        self._max_parallelism = max_parallelism
        self._range = key_group_range
        if value_blocks is None:  # keep the layout the state was written with
            stored = {d.name: d for d in backend.descriptors()}.get(STATE_NAME)
            if stored is not None and stored.kind == "blocks":
                value_blocks = stored.blocks
        # encoded values of whole columns of grouping keys, in and out
        self._read: Callable[[list[bytes]], list[bytes | None]]
        self._write: Callable[[list[bytes], list[bytes]], None]
        self._remove: Callable[[list[bytes]], None]
        try:
            if value_blocks is None:
                st: ValueState = backend.value_state(STATE_NAME, value_schema)
                self._read, self._write, self._remove = (st.get_many_raw, st.put_many_raw,
                                                         st.delete_many)
            else:
                st = blocks = backend.block_state(STATE_NAME, value_schema, value_blocks)
                self._read, self._write, self._remove = (blocks.get_entries, blocks.put_entries,
                                                         blocks.delete_entries)
            self._state = st
        except SchemaEvolutionError as exc:
            if exc.field:  # a field's change: the message says what to do
                raise
            raise SchemaEvolutionError(
                exc.state, exc.field, exc.change,
                "map_in_pandas: the stored state was written with another value_blocks "
                "setting; keep the one it was written with") from exc
        except SchemaError as exc:
            raise SchemaError(f"{exc} (map_in_pandas: the stored state was written with "
                              f"another state_schema or value_blocks setting; keep the "
                              f"one it was written with)") from exc
        self._fields = list(self._state.codec.schema.names)
        # Whole-column codec when every value field is numeric/boolean (else None).
        self._fixed = fixed_columns(self._state.codec.schema, self._state.codec.tag)

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
        # The columns stay numpy arrays, so numeric keys never become Python scalars.
        kgs, encoded = encode_keys_with_groups(cols, self._key_types, self._max_parallelism)
        r = self._range
        if r is not None and len(kgs):
            lo, hi = int(kgs.min()), int(kgs.max())
            if lo < r.start or hi > r.end:
                bad = kgs[(kgs < r.start) | (kgs > r.end)]
                raise StateBackendError(
                    f"keys of key groups {sorted(set(bad.tolist()))[:5]} asked of a partition "
                    f"that owns key groups {r.start}..{r.end}: their state lives in another "
                    f"partition (pass keys from this partition's input; was the DataFrame "
                    f"repartitioned between the operator and its input?)")
        return encoded

    def _get_raw(self, keys) -> list[bytes | None]:
        return self._read(self._encode(keys))

    def _put_raw(self, keys, payloads: list[bytes]) -> None:
        self._write(self._encode(keys), payloads)  # both check the lengths before writing

    def get(self, keys) -> pd.DataFrame:
        """Stored values for ``keys`` (a Series, a DataFrame of key columns, or a list),
        one row per key in the same order; missing keys give nulls (NaN/None)."""
        raws = self._get_raw(keys)
        if self._fixed is not None:
            columns = self._fixed.decode(raws)
            if columns is not None:
                return self._frame(columns, len(raws))
        decode = self._state.codec.decode
        empty = (None,) * len(self._fields)
        rows = [empty if r is None else decode(r) for r in raws]
        return pd.DataFrame.from_records(rows, columns=self._fields)

    def _frame(self, columns: list[tuple[np.ndarray, np.ndarray]], n: int) -> pd.DataFrame:
        """The DataFrame ``from_records`` would build from the decoded tuples (same dtypes:
        int64/float64/bool without nulls, float64 NaN for numbers with some nulls, object
        None for booleans with nulls and for all-null or empty columns)."""
        data: dict[str, np.ndarray] = {}
        for name, (vals, null) in zip(self._fields, columns):
            kind = vals.dtype.kind
            if n == 0 or null.all():
                col = np.full(n, None, dtype=object)
            elif not null.any():
                col = vals.astype(bool if kind == "b" else np.int64 if kind in "iu" else np.float64)
            elif kind == "b":
                col = vals.astype(object)
                col[null] = None
            else:
                col = vals.astype(np.float64)
                col[null] = np.nan
            data[name] = col
        return pd.DataFrame(data, columns=self._fields)

    def exists(self, keys) -> np.ndarray:
        return np.array([v is not None for v in self._get_raw(keys)], dtype=bool)

    def put(self, keys, values: pd.DataFrame | Sequence[tuple]) -> None:
        """Store one value per key (``values`` rows align with ``keys``)."""
        if isinstance(values, pd.DataFrame):
            frame = values[self._fields] if all(f in values.columns for f in self._fields) else values
            if self._fixed is not None and frame.shape[1] == len(self._fields):
                payloads = self._fixed.encode([frame.iloc[:, i].to_numpy()
                                               for i in range(frame.shape[1])])
                if payloads is not None:
                    self._put_raw(keys, payloads)
                    return
            tuples = list(frame.itertuples(index=False, name=None))
        elif isinstance(values, pd.Series):
            if self._fixed is not None and len(self._fields) == 1:
                payloads = self._fixed.encode([values.to_numpy()])
                if payloads is not None:
                    self._put_raw(keys, payloads)
                    return
            tuples = [(v,) for v in values.tolist()]
        else:
            tuples = [tuple(v) if isinstance(v, (tuple, list)) else (v,) for v in values]
        encode = self._state.codec.encode
        self._put_raw(keys, [encode(t) for t in tuples])

    def delete(self, keys) -> None:
        self._remove(self._encode(keys))


def vector_config(config, frame_rows: int | None = DEFAULT_FRAME_ROWS):
    """``config`` as ``map_in_pandas`` runs it: no per-key grouping, input in frames of
    ``frame_rows`` rows (see :class:`~.context.TaskInput`; None: one frame)."""
    return replace(config, per_key=False, frame_rows=frame_rows)


def vector_process(func, config, state_schema, value_blocks: int | None = None):
    """What ``map_in_pandas`` hands the task runner: ``func(frames, state)`` over the
    partition's input in frames (``config`` from :func:`vector_config`), with a
    :class:`KeyedColumnState` confined to its key groups."""
    if config.per_key:
        raise ValueError("map_in_pandas reads frames: build its config with vector_config()")

    def process(backend, groups, ctx, decode):
        state = KeyedColumnState(backend, config.key.columns, config.key.types, state_schema,
                                 config.max_parallelism, kg_range_of(config, ctx.partition),
                                 value_blocks)
        return run_vector_function(func, backend, groups, state)

    return process


def column_state_declaration(config, state_schema, value_blocks: int | None = None):
    """``backend -> None``: declares the state a ``map_in_pandas`` task declares (the
    driver's schema check runs it)."""
    def declare(backend: KeyedStateBackend) -> None:
        KeyedColumnState(backend, config.key.columns, config.key.types, state_schema,
                         config.max_parallelism, None, value_blocks)
    return declare


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
