"""Whole columns of all-fixed-width rows (numpy): the batch path of the value codec, giving
the same bytes as :class:`statebackend.keys.values.RowCodec` row by row."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model.schema import Schema
from .kernels import split_fixed

__all__ = ["FixedColumns", "fixed_columns"]


#: numpy codes of the fixed-width types a column can be packed from without conversion.
_NUMPY_FIXED = {"boolean": "?", "tinyint": "<i1", "smallint": "<i2", "int": "<i4",
                "bigint": "<i8", "float": "<f4", "double": "<f8"}
_NUMPY_BITMAP = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}


class FixedColumns:
    """Whole-column encode/decode for a schema whose fields are all numeric or boolean.

    Such rows are exactly ``struct.pack("<" + bitmap + fields)``, so a numpy structured
    dtype with the same packed layout encodes and decodes a whole column at once, giving
    the same bytes as :attr:`RowCodec.encode` row by row. Both methods return None when
    the input is not one they can handle *exactly* (then the caller uses the row codec,
    which also gives the precise errors).

    Parameters
    ----------
    schema : Schema
        A schema for which :func:`fixed_columns` returned this object.
    """

    def __init__(self, schema: Schema, tag: int | None = None) -> None:
        fields = schema.fields
        nb = (len(fields) + 7) // 8
        self.schema = schema
        self.tag = tag
        self.names = list(schema.names)
        self.types = [f.type.name for f in fields]
        self.nullable = [f.nullable for f in fields]
        self.dtype = np.dtype(([("__tag", "<u2")] if tag is not None else []) + [
            ("__bits", _NUMPY_BITMAP[nb])] + [
            (f"f{i}", _NUMPY_FIXED[t]) for i, t in enumerate(self.types)])
        self.size = self.dtype.itemsize

    def encode(self, columns: list[Any]) -> list[bytes] | None:
        """Encoded rows of ``columns`` (one numpy array per field, no nulls), or None."""
        n = len(columns[0]) if columns else 0
        rec = np.zeros(n, dtype=self.dtype)
        for i, (col, t) in enumerate(zip(columns, self.types)):
            arr = np.asarray(col)
            if arr.ndim != 1 or len(arr) != n:
                return None
            kind = arr.dtype.kind
            if t == "boolean":
                if kind != "b":
                    return None
            elif t in ("float", "double"):
                # struct packs ints and bools as floats too, but refuses overflow to inf.
                if kind not in "iufb":
                    return None
                if t == "float" and kind == "f":
                    with np.errstate(over="ignore", invalid="ignore"):
                        narrowed = arr.astype(np.float32)
                    if (np.isinf(narrowed) & ~np.isinf(arr)).any():
                        return None
            else:
                if kind not in "iu":
                    return None
                info = np.iinfo(_NUMPY_FIXED[t])
                if n and (int(arr.min()) < info.min or int(arr.max()) > info.max):
                    return None
            rec[f"f{i}"] = arr
        if self.tag is not None:
            rec["__tag"] = self.tag
        return split_fixed(rec.tobytes(), self.size)

    def decode(self, payloads: list[bytes | None]) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """``(values, null mask)`` per field of the rows (None payload: all fields null).

        Returns None when a payload does not have this schema's fixed size.
        """
        n = len(payloads)
        # C-level passes (a payload is never empty: it holds at least the null bitmap).
        live = list(filter(None, payloads))
        if len(live) == n:
            present = np.ones(n, dtype=bool)
        else:
            present = np.fromiter(map(bool, payloads), dtype=bool, count=n)
            if int(present.sum()) != len(live):  # an empty payload: not this codec's
                return None
        s = self.size
        if live and set(map(len, live)) != {s}:
            return None
        buf = b"".join(live)
        rec = np.frombuffer(buf, dtype=self.dtype)
        if self.tag is not None and len(rec) and not (rec["__tag"] == self.tag).all():
            return None  # rows of another schema version: the row path reads them
        bits = rec["__bits"].astype(np.uint64)
        out = []
        for i in range(len(self.types)):
            vals = np.zeros(n, dtype=self.dtype[f"f{i}"].newbyteorder("="))
            vals[present] = rec[f"f{i}"]
            null = ~present
            if self.nullable[i]:
                null[present] |= (bits >> np.uint64(i)) & np.uint64(1) == 1
            out.append((vals, null))
        return out


def fixed_columns(schema: Schema, tag: int | None = None) -> FixedColumns | None:
    """The whole-column codec of ``schema`` (rows tagged with ``tag``, as
    :class:`RowCodec`), or None unless all its fields are numeric or boolean (and there
    are at most 64 of them)."""
    nb = (len(schema.fields) + 7) // 8
    if not schema.fields or nb not in _NUMPY_BITMAP or any(
            f.type.name not in _NUMPY_FIXED for f in schema.fields):
        return None
    return FixedColumns(schema, tag)
