"""State schemas: a small, pure model of the Spark types a state value may hold.

A schema is a list of named, typed fields, declared either as a pyspark ``StructType``
(read by duck typing, so this module never imports pyspark) or as a DDL string such as
``"count BIGINT, `last seen` TIMESTAMP NOT NULL"``. Parsing DDL here, rather than through a
SparkSession, is what lets a Python worker declare state without a JVM.

Supported types: string, binary, boolean, tinyint, smallint, int, bigint, float, double,
date, timestamp, timestamp_ntz, decimal(p, s), and the complex types nested to any depth:
``array<T>``, ``map<K, V>`` and ``struct<name: T, ...>`` (Spark's own state schemas accept
the same).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import SchemaError

__all__ = ["DataType", "Field", "Schema", "parse_ddl", "to_schema"]

#: Canonical type names, with the DDL aliases Spark accepts for them.
_ALIASES = {
    "string": "string", "varchar": "string", "char": "string", "text": "string",
    "binary": "binary",
    "boolean": "boolean", "bool": "boolean",
    "tinyint": "tinyint", "byte": "tinyint",
    "smallint": "smallint", "short": "smallint",
    "int": "int", "integer": "int",
    "bigint": "bigint", "long": "bigint",
    "float": "float", "real": "float",
    "double": "double",
    "date": "date",
    "timestamp": "timestamp", "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
    "decimal": "decimal", "dec": "decimal", "numeric": "decimal",
    "array": "array",
    "map": "map",
    "struct": "struct",
}

COMPLEX = frozenset({"array", "map", "struct"})
PRIMITIVES = frozenset(_ALIASES.values()) - COMPLEX


@dataclass(frozen=True)
class DataType:
    """One Spark data type.

    Attributes
    ----------
    name : str
        Canonical lower-case name (``bigint``, ``decimal``, ``array``...).
    precision, scale : int
        For ``decimal`` only.
    element : DataType, optional
        For ``array`` only: the element type (any type).
    contains_null : bool
        For ``array`` only: whether elements may be None.
    key, value : DataType, optional
        For ``map`` only: the key and value types.
    value_contains_null : bool
        For ``map`` only: whether values may be None (keys never are).
    fields : tuple of Field, optional
        For ``struct`` only: its fields, in order.
    """

    name: str
    precision: int = 0
    scale: int = 0
    element: DataType | None = None
    contains_null: bool = True
    key: DataType | None = None
    value: DataType | None = None
    value_contains_null: bool = True
    fields: tuple[Field, ...] | None = None

    def ddl(self) -> str:
        if self.name == "decimal":
            return f"DECIMAL({self.precision},{self.scale})"
        if self.name == "array":
            assert self.element is not None
            return f"ARRAY<{self.element.ddl()}>"
        if self.name == "map":
            assert self.key is not None and self.value is not None
            return f"MAP<{self.key.ddl()}, {self.value.ddl()}>"
        if self.name == "struct":
            assert self.fields is not None
            return "STRUCT<" + ", ".join(f.ddl(colon=True) for f in self.fields) + ">"
        return self.name.upper()


@dataclass(frozen=True)
class Field:
    """A named field of a schema.

    ``default`` is the SQL literal of the field's DDL ``DEFAULT`` clause (or of a
    StructField's ``EXISTS_DEFAULT`` metadata), canonical text; values stored before the
    field was added read as it (see :mod:`.evolution`).
    """

    name: str
    type: DataType
    nullable: bool = True
    default: str | None = None

    def ddl(self, colon: bool = False) -> str:
        """``name TYPE [NOT NULL] [DEFAULT literal]``; ``name: TYPE`` inside a struct type
        (``colon``)."""
        name = self.name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name) else \
            "`" + self.name.replace("`", "``") + "`"
        sep = ": " if colon else " "
        return (f"{name}{sep}{self.type.ddl()}" + ("" if self.nullable else " NOT NULL")
                + ("" if self.default is None else f" DEFAULT {self.default}"))

    def default_value(self) -> Any:
        """The Python value of :attr:`default` (None without one)."""
        return None if self.default is None else literal_value(self.default, self.type)


@dataclass(frozen=True)
class Schema:
    """An ordered tuple of fields; values of this schema are tuples in field order."""

    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        if not self.fields:
            raise SchemaError("a state schema needs at least one field")
        names = [f.name for f in self.fields]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise SchemaError(f"duplicate field name(s) {sorted(dup)} in schema")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def ddl(self) -> str:
        """Canonical DDL: equal schemas give equal strings (used to detect redeclarations)."""
        return ", ".join(f.ddl() for f in self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __str__(self) -> str:
        return self.ddl()


# --- DDL parsing ----------------------------------------------------------------------

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<quoted>`(?:``|[^`])*`)
    | (?P<string>'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")
    | (?P<number>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<punct>[<>(),:])
    )""", re.VERBOSE)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        stripped = text.rstrip()
        while pos < len(stripped):
            m = _TOKEN.match(stripped, pos)
            if not m or m.end() == pos:
                raise SchemaError(f"cannot parse schema {text!r}: unexpected character at "
                                  f"position {pos}: {stripped[pos:pos + 10]!r}")
            kind = m.lastgroup
            assert kind is not None
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def next(self, what: str) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise SchemaError(f"cannot parse schema {self.text!r}: expected {what}, found the end")
        self.i += 1
        return tok

    def expect(self, value: str) -> None:
        kind, v = self.next(repr(value))
        if v.lower() != value:
            raise SchemaError(f"cannot parse schema {self.text!r}: expected {value!r}, found {v!r}")

    def accept(self, value: str) -> bool:
        tok = self.peek()
        if tok is not None and tok[1].lower() == value:
            self.i += 1
            return True
        return False

    def fields(self, closing: str | None) -> list[Field]:
        out = [self.field()]
        while self.accept(","):
            out.append(self.field())
        if closing is not None:
            self.expect(closing)
        return out

    def field(self) -> Field:
        kind, v = self.next("a field name")
        if kind == "quoted":
            name = v[1:-1].replace("``", "`")
        elif kind == "ident":
            name = v
        else:
            raise SchemaError(f"cannot parse schema {self.text!r}: expected a field name, found {v!r}")
        self.accept(":")
        dtype = self.type()
        nullable = True
        if self.accept("not"):
            self.expect("null")
            nullable = False
        default = None
        if self.accept("default"):
            kind, v = self.next("a default value")
            default = _canonical_literal(kind, v, dtype, self.text)
        if self.accept("comment"):
            kind, _ = self.next("a comment string")
            if kind != "string":
                raise SchemaError(f"cannot parse schema {self.text!r}: COMMENT needs a quoted string")
        return Field(name, dtype, nullable, default)

    def type(self) -> DataType:
        kind, v = self.next("a type")
        canon = _ALIASES.get(v.lower()) if kind == "ident" else None
        if canon is None:
            raise SchemaError(f"unsupported type {v!r} in schema {self.text!r}: supported are "
                              f"{', '.join(sorted(PRIMITIVES))}, array<T>, map<K, V> and "
                              f"struct<name: T, ...>")
        if canon == "array":
            self.expect("<")
            element = self.type()
            self.expect(">")
            return DataType("array", element=element)
        if canon == "map":
            self.expect("<")
            key = self.type()
            self.expect(",")
            value = self.type()
            self.expect(">")
            return DataType("map", key=key, value=value)
        if canon == "struct":
            self.expect("<")
            if self.accept(">"):
                raise SchemaError(f"cannot parse schema {self.text!r}: a struct needs a field")
            fields = tuple(self.fields(">"))
            Schema(fields)  # the same checks as a top-level field list (duplicates)
            return DataType("struct", fields=fields)
        if canon == "decimal":
            precision, scale = 10, 0
            if self.accept("("):
                precision = int(self.next("a precision")[1])
                if self.accept(","):
                    scale = int(self.next("a scale")[1])
                self.expect(")")
            if not (1 <= precision <= 38 and 0 <= scale <= precision):
                raise SchemaError(f"invalid DECIMAL({precision},{scale}) in schema {self.text!r}")
            return DataType("decimal", precision, scale)
        if canon == "string" and self.accept("("):  # char(n) / varchar(n): stored as string
            self.next("a length")
            self.expect(")")
        return DataType(canon)


_NUMERIC = frozenset({"tinyint", "smallint", "int", "bigint", "float", "double", "decimal"})


def _canonical_literal(kind: str, v: str, t: DataType, text: str) -> str | None:
    """The canonical text of a DEFAULT literal for type ``t`` (checked by converting it)."""
    if kind == "ident" and v.lower() == "null":
        return None
    if kind == "string":
        body = v[1:-1].replace("\\'", "'").replace('\\"', '"')
        lit = "'" + body.replace("'", "\\'") + "'"
    elif kind in ("number", "ident"):
        lit = v.lower()
    else:
        raise SchemaError(f"cannot parse schema {text!r}: DEFAULT needs a literal, got {v!r}")
    literal_value(lit, t)
    return lit


def literal_value(lit: str, t: DataType) -> Any:
    """The Python value of a canonical DEFAULT literal for type ``t``.

    Raises
    ------
    SchemaError
        When the literal is not one of the type (numbers for numeric types, true/false for
        boolean, a quoted string for string and binary).
    """
    import decimal

    try:
        if lit.startswith("'"):
            if t.name not in ("string", "binary"):
                raise ValueError
            body = lit[1:-1].replace("\\'", "'")
            return body if t.name == "string" else body.encode("utf-8")
        if t.name == "boolean" and lit in ("true", "false"):
            return lit == "true"
        if t.name in ("tinyint", "smallint", "int", "bigint"):
            return int(lit)
        if t.name in ("float", "double"):
            return float(lit)
        if t.name == "decimal":
            return decimal.Decimal(lit)
        raise ValueError
    except ValueError:
        raise SchemaError(f"DEFAULT {lit} is not a value of type {t.ddl()}; defaults are "
                          f"numbers, true/false or quoted strings of the field's type") from None


def parse_type(text: str) -> DataType:
    """Parse one type, e.g. ``"array<int>"`` or ``"decimal(10,2)"``."""
    p = _Parser(text)
    t = p.type()
    if p.peek() is not None:
        raise SchemaError(f"cannot parse type {text!r}: trailing {p.peek()[1]!r}")  # type: ignore[index]
    return t


def parse_ddl(text: str) -> Schema:
    """Parse a DDL field list such as ``"count BIGINT, last STRING"``.

    ``struct<a:int,b:string>`` (a StructType's simple string) is accepted too.

    Raises
    ------
    SchemaError
        On a syntax error or an unsupported type.
    """
    p = _Parser(text)
    if not p.tokens:
        raise SchemaError("an empty schema string declares no field: expected e.g. 'count BIGINT'")
    first = p.peek()
    if (first is not None and first[1].lower() == "struct" and len(p.tokens) > 1
            and p.tokens[1][1] == "<"):
        p.i = 2
        fields = p.fields(">")
    else:
        fields = p.fields(None)
    if p.peek() is not None:
        raise SchemaError(f"cannot parse schema {text!r}: unexpected {p.peek()[1]!r}")  # type: ignore[index]
    return Schema(tuple(fields))


def _from_spark_type(dt: Any, where: str) -> DataType:
    """A pyspark DataType, read by duck typing; complex types recursively, so the
    nullability of elements, map values and struct fields is kept."""
    if hasattr(dt, "elementType"):
        return DataType("array", element=_from_spark_type(dt.elementType, where),
                        contains_null=bool(getattr(dt, "containsNull", True)))
    if hasattr(dt, "keyType") and hasattr(dt, "valueType"):
        return DataType("map", key=_from_spark_type(dt.keyType, where),
                        value=_from_spark_type(dt.valueType, where),
                        value_contains_null=bool(getattr(dt, "valueContainsNull", True)))
    if hasattr(dt, "fields") and hasattr(dt, "fieldNames"):
        return DataType("struct", fields=_fields_of(dt, f"{where} struct"))
    try:
        return parse_type(dt.simpleString())
    except SchemaError as exc:
        raise SchemaError(f"{where}: {exc}") from None


def _spark_field(f: Any, where: str) -> Field:
    dtype = _from_spark_type(f.dataType, f"{where} field {f.name!r}")
    meta = getattr(f, "metadata", None) or {}
    text = meta.get("EXISTS_DEFAULT") or meta.get("CURRENT_DEFAULT")
    default = None
    if isinstance(text, str) and text.strip():
        p = _Parser(text)
        kind, v = p.next("a default value")
        default = _canonical_literal(kind, v, dtype, text)
    return Field(f.name, dtype, bool(f.nullable), default)


def _fields_of(struct: Any, where: str) -> tuple[Field, ...]:
    fields = tuple(_spark_field(f, where) for f in struct.fields)
    Schema(fields)
    return fields


def to_schema(schema: Any) -> Schema:
    """A :class:`Schema` from a DDL string, a pyspark ``StructType`` or a :class:`Schema`.

    Raises
    ------
    SchemaError
        When the schema cannot be read or uses an unsupported type.
    """
    if isinstance(schema, Schema):
        return schema
    if isinstance(schema, str):
        return parse_ddl(schema)
    if getattr(schema, "fields", None) is not None:  # a pyspark StructType, duck typed
        return Schema(_fields_of(schema, "schema"))
    raise SchemaError(f"expected a DDL string or a StructType as schema, got {type(schema).__name__}")
