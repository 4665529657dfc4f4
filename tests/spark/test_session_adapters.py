"""What differs between session kinds is read in spark/session.py: checked here against
what a classic session's JVM says (the Connect side runs in tests/connect)."""

from __future__ import annotations

import pytest

from statebackend.errors import OptionsError, StateBackendError
from statebackend.spark import session as S

pytestmark = pytest.mark.spark

DELAYS = ["10 seconds", "1 second", "0 seconds", "90 seconds", "1 minute", "2 minutes 30 seconds",
          "1 hour", "3 hours 5 minutes 7 seconds", "1 day", "2 days 1 hour", "1 week",
          "1 month", "2 months 3 days", "1 year", "500 milliseconds", "1500 milliseconds",
          "1.5 seconds", "interval 10 seconds", "10 SECONDS", "7 microseconds",
          "2500 microseconds"]


@pytest.mark.parametrize("delay", DELAYS)
def test_delay_read_from_the_client_plan_equals_the_jvm_s(spark, delay):
    # Connect gives the delay as the user's text; the JVM's plan holds Spark's parse of it
    df = spark.readStream.format("rate").load().withWatermark("timestamp", delay)
    assert S._classic_watermark(df) == ("timestamp", S.parse_delay_ms(delay))


@pytest.mark.parametrize("bad", ["", "ten seconds", "10 parsecs", "10", "1.5 days",
                                 "10 seconds and more"])
def test_an_unreadable_delay_is_an_options_error(bad):
    with pytest.raises(OptionsError, match="watermark delay"):
        S.parse_delay_ms(bad)


def test_grouping_columns_of_a_classic_session(spark):
    df = spark.createDataFrame([("a", 1, 2)], "k STRING, `a.b` INT, x INT")
    assert S.grouping_columns(df.groupBy("k", "`a.b`")) == (df, ["k", "a.b"])
    assert S.grouping_columns((df, ["k"])) == (df, ["k"])
    with pytest.raises(StateBackendError, match="add it as a column first"):
        S.grouping_columns(df.groupBy(df.x + 1))
    with pytest.raises(TypeError, match="GroupedData"):
        S.grouping_columns(df)
    assert not S.is_connect(spark) and not S.is_connect(df)
    assert S.session_conf(spark)["spark.sql.shuffle.partitions"] == "2"
    assert S.master_of(spark).startswith("local")


class _ConnectSession:
    """Stands in for a Connect session of a given server version (no server needed)."""

    __module__ = "pyspark.sql.connect.session"

    def __init__(self, version: str) -> None:
        self.version = version


@pytest.mark.parametrize("version", ["3.5.1", "3.4.0"])
def test_a_connect_server_too_old_is_refused_with_what_to_do(version):
    with pytest.raises(StateBackendError, match=f"runs Spark {version}.*4.0 or newer server"):
        S.check_session(_ConnectSession(version))


@pytest.mark.parametrize("version", ["4.0.0", "4.3.0", "5.0.0-preview1"])
def test_a_connect_server_of_spark_4_is_accepted(version, spark):
    S.check_session(_ConnectSession(version))
    S.check_session(spark)  # classic: nothing to check
