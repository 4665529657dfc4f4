"""What differs between a classic Spark session and a Spark Connect session, in one place.

A classic session lives in the same process as a JVM (py4j: ``df._jdf``,
``spark.sparkContext``); a Spark Connect session is a client of a server, with other
classes for its sessions, DataFrames, columns and grouped data, and no JVM in the
process. Everything else of our driver side uses the public DataFrame API, which both
kinds share; what cannot be read that way (the grouping columns of a ``GroupedData``, the
watermark of a plan, the session's configuration and master) is read here, from the
JVM's plan on a classic session and from the client's own plan on a Connect session.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..errors import OptionsError, StateBackendError

__all__ = ["check_session", "grouping_columns", "is_connect", "master_of", "parse_delay_ms", "session_conf",
           "session_key", "session_of", "set_log_level", "wait_for_listener_bus",
           "watermark_of"]


def is_connect(obj: Any) -> bool:
    """Whether ``obj`` (a session, DataFrame, Column or GroupedData) is Spark Connect's."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


def session_of(df: Any) -> Any:
    return df.sparkSession


def _is_grouped(obj: Any) -> bool:
    try:
        from pyspark.sql import GroupedData
    except ImportError:  # pragma: no cover - pyspark-client without the classic API
        GroupedData = ()  # noqa: N806
    if isinstance(obj, GroupedData):
        return True
    if is_connect(obj):
        try:
            from pyspark.sql.connect.group import GroupedData as ConnectGroupedData
        except ImportError as exc:
            raise StateBackendError(_MISSING_CONNECT.format(exc=exc)) from exc
        return isinstance(obj, ConnectGroupedData)
    return False


_MISSING_CONNECT = ("a Spark Connect session needs pyspark's connect extra ({exc}): "
                    "pip install 'pyspark[connect]' (or 'statebackend[connect]')")
# the oldest Spark server our operators run on through Connect: Python stateful operators,
# client-side streaming listeners and observed metrics as Spark 4 gives them
MIN_CONNECT_SERVER = (4, 0)


def check_session(spark: Any) -> None:
    """Refuse, with what to install or upgrade, a session our operators cannot run on."""
    if not is_connect(spark):
        return
    version = str(spark.version)
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    if parts < MIN_CONNECT_SERVER:
        need = ".".join(map(str, MIN_CONNECT_SERVER))
        raise StateBackendError(
            f"the Spark Connect server runs Spark {version}; statebackend's operators on "
            f"Spark Connect need a Spark {need} or newer server (client-side streaming "
            f"listeners and Python stateful operators as Spark 4 runs them). Upgrade the "
            f"server, or use a classic session (SparkSession.builder.master(...)).")


def grouping_columns(grouped: Any) -> tuple[Any, list[str]]:
    """The DataFrame and grouping column names behind ``df.groupBy(...)``, of either kind
    of session.

    Accepts a ``GroupedData`` (plain column names or column references) or an explicit
    ``(df, [column, ...])`` pair.
    """
    if isinstance(grouped, tuple):
        df, cols = grouped
        return df, [c if isinstance(c, str) else str(c) for c in cols]
    if not _is_grouped(grouped):
        raise TypeError(f"expected df.groupBy(...) (GroupedData) or (df, [columns]), "
                        f"got {type(grouped).__module__}.{type(grouped).__name__}")
    df = grouped._df
    names = (_connect_grouping_names(grouped) if is_connect(grouped)
             else _classic_grouping_names(grouped))
    missing = [n for n in names if n not in df.columns]
    if missing:
        raise StateBackendError(f"grouping columns {missing} are not columns of the DataFrame "
                                f"{df.columns}")
    return df, names


def _not_a_column(text: str) -> StateBackendError:
    return StateBackendError(
        f"grouping by the expression {text} is not supported: add it as a column first, "
        f"e.g. df.withColumn('k', <expr>).groupBy('k')")


def _classic_grouping_names(grouped: Any) -> list[str]:
    names: list[str] = []
    exprs = grouped._jgd.groupingExprs()
    for i in range(exprs.size()):
        expr = exprs.apply(i)
        if expr.getClass().getSimpleName() not in ("UnresolvedAttribute", "AttributeReference"):
            raise _not_a_column(expr.sql())
        names.append(_unquote(expr.name()))
    return names


def _unquote(name: str) -> str:
    # a quoted identifier (`a.b`) names one column whose name holds the dot
    if len(name) > 1 and name.startswith("`") and name.endswith("`"):
        return name[1:-1].replace("``", "`")
    return name


def _connect_grouping_names(grouped: Any) -> list[str]:
    from pyspark.sql.connect.expressions import ColumnReference

    if getattr(grouped, "_group_type", "groupby") != "groupby":
        raise StateBackendError(f"{grouped._group_type}(...) cannot group a stateful operator: "
                                f"use df.groupBy(columns)")
    names = []
    for col in grouped._grouping_cols:
        expr = getattr(col, "_expr", None)
        if not isinstance(expr, ColumnReference):
            raise _not_a_column(str(col))
        names.append(_unquote(expr._unparsed_identifier))
    return names


# --- event time -------------------------------------------------------------------------

def watermark_of(df: Any) -> tuple[str, int] | None:
    """(event-time column, delay in ms) of the ``withWatermark`` upstream of ``df``, if any:
    from the JVM's logical plan on a classic session, from the client's plan on Connect."""
    return _connect_watermark(df) if is_connect(df) else _classic_watermark(df)


def _classic_watermark(df: Any) -> tuple[str, int] | None:
    for node in _classic_nodes(df):
        if node.getClass().getSimpleName() == "EventTimeWatermark":
            from py4j.java_gateway import get_field

            delay = node.delay()
            # Spark counts a month as 31 days when it turns a watermark delay into ms
            days = get_field(delay, "months") * 31 + get_field(delay, "days")
            delay_ms = days * 86_400_000 + get_field(delay, "microseconds") // 1000
            return node.eventTime().name(), int(delay_ms)
    return None


def _plan_children(node: Any) -> list[Any]:
    from pyspark.sql.connect.plan import LogicalPlan

    out = []
    for value in vars(node).values():
        if isinstance(value, LogicalPlan):
            out.append(value)
        elif isinstance(value, list | tuple):
            out.extend(v for v in value if isinstance(v, LogicalPlan))
    return out


def _connect_watermark(df: Any) -> tuple[str, int] | None:
    from pyspark.sql.connect.plan import WithWatermark

    for node in _connect_nodes(df):
        if isinstance(node, WithWatermark):
            return node._event_time, parse_delay_ms(node._delay_threshold)
    return None


# Spark's stateful logical operators, by their node's class name on each session kind;
# each maps to the name :func:`stateful_upstream` reports ("Aggregate" for aggregations)
_CLASSIC_STATEFUL = {
    "Aggregate": "Aggregate", "Deduplicate": "Deduplicate",
    "DeduplicateWithinWatermark": "Deduplicate",
    "FlatMapGroupsWithState": "FlatMapGroupsWithState",
    "FlatMapGroupsInPandasWithState": "FlatMapGroupsWithState",
    "TransformWithState": "TransformWithState",
    "TransformWithStateInPandas": "TransformWithState",
    "TransformWithStateInPySpark": "TransformWithState"}
_CONNECT_STATEFUL = {
    "Aggregate": "Aggregate", "Deduplicate": "Deduplicate",
    "ApplyInPandasWithState": "FlatMapGroupsWithState",
    "TransformWithStateInPandas": "TransformWithState",
    "TransformWithStateInPySpark": "TransformWithState"}


def stateful_upstream(df: Any) -> str | None:
    """The first stateful operator (``"Aggregate"``, ``"Deduplicate"``,
    ``"FlatMapGroupsWithState"``, ``"TransformWithState"``) found upstream of ``df``, an
    aggregation before any other; None when there is none. Read from the JVM's logical
    plan on a classic session, from the client's plan on Connect."""
    if is_connect(df):
        names = {_CONNECT_STATEFUL.get(type(n).__name__) for n in _connect_nodes(df)}
    else:
        names = {_CLASSIC_STATEFUL.get(n.getClass().getSimpleName())
                 for n in _classic_nodes(df)}
    names.discard(None)
    if "Aggregate" in names:
        return "Aggregate"
    return min(names) if names else None  # type: ignore[type-var]


def _classic_nodes(df: Any) -> Iterator[Any]:
    stack = [df._jdf.queryExecution().logical()]
    while stack:
        node = stack.pop()
        yield node
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))


def _connect_nodes(df: Any) -> Iterator[Any]:
    stack, seen = [df._plan], set()
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            yield node
            stack.extend(_plan_children(node))


_UNIT_US = {"microsecond": 1, "millisecond": 1_000, "second": 1_000_000,
            "minute": 60_000_000, "hour": 3_600_000_000}
_UNIT_DAYS = {"day": 1, "week": 7}
_UNIT_MONTHS = {"month": 1, "year": 12}
_PART = re.compile(r"([+-]?\d+(?:\.\d+)?)\s*([a-z]+?)s?\b")


def parse_delay_ms(text: str) -> int:
    """A watermark delay (``"10 seconds"``, ``"1 hour 30 minutes"``, ``"interval 2 days"``)
    in ms, as Spark turns it into a CalendarInterval and then into ms: a month is 31
    days, fractions of a millisecond are dropped."""
    s = str(text).strip().lower()
    if s.startswith("interval"):
        s = s[len("interval"):].strip()
    months = days = micros = 0
    pos = 0
    for m in _PART.finditer(s):
        if s[pos:m.start()].strip():
            break
        value, unit = m.group(1), m.group(2)
        if unit in _UNIT_US:
            micros += int(round(float(value) * _UNIT_US[unit]))
        elif "." in value:
            break
        elif unit in _UNIT_DAYS:
            days += int(value) * _UNIT_DAYS[unit]
        elif unit in _UNIT_MONTHS:
            months += int(value) * _UNIT_MONTHS[unit]
        else:
            break
        pos = m.end()
    else:
        if pos and not s[pos:].strip():
            return (months * 31 + days) * 86_400_000 + micros // 1000
    raise OptionsError("delayThreshold", text,
                       f"cannot read the watermark delay {text!r}: expected an interval "
                       f"such as '10 seconds' or '1 hour 30 minutes'")


# --- configuration ----------------------------------------------------------------------

def session_conf(spark: Any) -> dict[str, str]:
    """Every setting of the session: the application's Spark conf (where our
    ``spark.statebackend.*`` options are set at launch) and the session's SQL conf."""
    if is_connect(spark):
        conf = dict(spark.conf.getAll)
    else:
        conf = dict(spark.sparkContext.getConf().getAll())
    conf["spark.sql.shuffle.partitions"] = str(spark.conf.get("spark.sql.shuffle.partitions"))
    return {str(k): str(v) for k, v in conf.items()}


def master_of(spark: Any) -> str | None:
    """The session's master (``local[2]``, ``spark://...``), None where it does not say."""
    try:
        if is_connect(spark):
            value = spark.conf.get("spark.master", None)
        else:
            value = spark.sparkContext.master
    except Exception:  # noqa: BLE001 - a server that hides it: not known
        return None
    return None if value is None else str(value)


# --- the session's identity, log and listener bus ---------------------------------------

def session_key(spark: Any) -> Any:
    """A key that is the same for every session object of one Spark session, and differs
    between sessions (classic: the JVM session's UUID, so a ``newSession()`` of the same
    application, which has its own ``streams`` and listeners, has its own key; Connect:
    its server session)."""
    if is_connect(spark):
        return ("connect", str(spark.session_id))
    return ("classic", str(spark._jsparkSession.sessionUUID()))


def set_log_level(spark: Any, level: str) -> None:
    """Spark's log level, where the client can set it (a Connect client cannot: the
    server's log is the server's)."""
    if not is_connect(spark):
        spark.sparkContext.setLogLevel(level)


def wait_for_listener_bus(spark: Any, timeout_s: float) -> None:
    """Wait until Spark's listener bus has delivered the events it took (classic: the
    JVM's bus; Connect: events reach the client on its own stream, nothing to wait for)."""
    if not is_connect(spark):
        bus = spark.sparkContext._jsc.sc().listenerBus()
        bus.waitUntilEmpty(int(timeout_s * 1000))


def active_or_local_session(master: str, app_name: str) -> Any:
    """pyspark's active session (a command run inside a Spark program), else a classic
    session on ``master`` whose Python workers run this interpreter."""
    import os
    import sys

    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is not None:
        return spark
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return SparkSession.builder.master(master).appName(app_name).getOrCreate()
