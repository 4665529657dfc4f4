"""Restart strategies: timing under an injected clock (nothing sleeps), jitter bounds, the
reset threshold, merged failures, and construction from options and Spark conf."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statebackend.errors import OptionsError
from statebackend.options import StateBackendOptions as S
from statebackend.options import parse_duration
from statebackend.restart import (
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    ManualClock,
    NoRestart,
    strategy_from_options,
)


def expo(**kw) -> ExponentialDelay:
    args = dict(initial_backoff_s=1.0, max_backoff_s=8.0, multiplier=2.0, jitter=0.0,
                reset_threshold_s=100.0, rng=random.Random(1))
    args.update(kw)
    return ExponentialDelay(**args)


def run(strategy, clock: ManualClock, failures: list[float]) -> list:
    """Fail after running ``run_s`` seconds, for each entry; restart as decided."""
    out = []
    for run_s in failures:
        clock.advance(run_s)
        d = strategy.on_failure(clock.now())
        out.append(d)
        if not d.restart:
            break
        clock.sleep(d.delay_s)
        strategy.on_restart(clock.now())
    return out


# --- none and fixed-delay ------------------------------------------------------------


def test_no_restart_gives_up_at_once() -> None:
    d = NoRestart().on_failure(0.0)
    assert not d.restart and "never" in d.reason


def test_fixed_delay_restarts_attempts_times_then_gives_up() -> None:
    clock = ManualClock()
    ds = run(FixedDelay(3, 2.5), clock, [1, 1, 1, 1, 1])
    assert [d.restart for d in ds] == [True, True, True, False]
    assert [d.delay_s for d in ds[:3]] == [2.5, 2.5, 2.5]
    assert clock.sleeps == [2.5, 2.5, 2.5]
    assert "3 restart attempts used" in ds[-1].reason
    assert clock.now() == 4 + 7.5


def test_fixed_delay_zero_attempts_never_restarts() -> None:
    assert not FixedDelay(0, 1).on_failure(0).restart


# --- failure-rate ----------------------------------------------------------------------


def test_failure_rate_gives_up_on_too_many_failures_within_the_interval() -> None:
    s = FailureRate(max_failures=2, interval_s=60, delay_s=1)
    assert s.on_failure(0).restart
    assert s.on_failure(30).restart
    d = s.on_failure(59.9)  # three within 60 s
    assert not d.restart and "3 failures within 60s" in d.reason


def test_failure_rate_window_slides() -> None:
    s = FailureRate(max_failures=2, interval_s=60, delay_s=5)
    decisions = [s.on_failure(t) for t in (0, 30, 60, 90, 120, 150)]
    # at t=60 the failure at 0 is exactly one interval old: outside the half-open window
    assert all(d.restart for d in decisions)
    assert all(d.delay_s == 5 for d in decisions)
    assert not s.on_failure(151).restart  # 120, 150, 151


def test_failure_rate_one_per_interval() -> None:
    s = FailureRate(max_failures=1, interval_s=10, delay_s=0)
    assert s.on_failure(0).restart
    assert not s.on_failure(9.99).restart


# --- exponential-delay ---------------------------------------------------------------


def test_exponential_delay_grows_by_multiplier_up_to_max() -> None:
    clock = ManualClock()
    ds = run(expo(), clock, [1] * 7)
    assert [d.delay_s for d in ds] == [1, 2, 4, 8, 8, 8, 8]
    assert all(d.restart for d in ds)
    assert "restart 5" in ds[4].reason


@settings(max_examples=60, deadline=None)
@given(jitter=st.floats(0, 1), seed=st.integers(0, 2**32), n=st.integers(1, 12))
def test_exponential_delay_jitter_stays_within_bounds(jitter: float, seed: int, n: int) -> None:
    s = expo(jitter=jitter, multiplier=1.5, max_backoff_s=20, rng=random.Random(seed))
    clock = ManualClock()
    backoff = 1.0
    for d in run(s, clock, [0.5] * n):
        assert backoff * (1 - jitter) - 1e-9 <= d.delay_s <= backoff * (1 + jitter) + 1e-9
        backoff = min(20, backoff * 1.5)


def test_exponential_delay_jitter_actually_spreads() -> None:
    s = expo(jitter=0.5, multiplier=1.0, rng=random.Random(7))
    delays = {round(d.delay_s, 6) for d in run(s, ManualClock(), [1] * 20)}
    assert len(delays) > 10
    assert min(delays) >= 0.5 and max(delays) <= 1.5


def test_exponential_delay_resets_after_a_long_healthy_run() -> None:
    clock = ManualClock()
    s = expo(reset_threshold_s=100)
    ds = run(s, clock, [1, 1, 1])
    assert [d.delay_s for d in ds] == [1, 2, 4]
    # ran 99.9 s since the last restart: below the threshold, backoff keeps growing
    ds = run(s, clock, [99.9])
    assert ds[0].delay_s == 8 and "reset" not in ds[0].reason
    # ran exactly the threshold: reset to the initial backoff
    ds = run(s, clock, [100])
    assert ds[0].delay_s == 1 and "backoff reset" in ds[0].reason
    assert s.restarts == 1
    assert run(s, clock, [1])[0].delay_s == 2


def test_exponential_delay_attempts_before_reset() -> None:
    clock = ManualClock()
    s = expo(attempts=2, reset_threshold_s=50)
    ds = run(s, clock, [1, 1, 1])
    assert [d.restart for d in ds] == [True, True, False]
    assert "all 2 attempts" in ds[-1].reason
    # a fresh strategy after a healthy run: the reset gives the attempts back
    s2 = expo(attempts=2, reset_threshold_s=50)
    ds = run(s2, ManualClock(), [1, 1, 60, 1])
    assert [d.restart for d in ds] == [True, True, True, True]


def test_failures_before_the_scheduled_restart_are_merged() -> None:
    s = expo(initial_backoff_s=4)
    first = s.on_failure(10.0)
    assert first.restart and first.delay_s == 4 and not first.merged
    # two more failures (other tasks of the same query) before the restart at t=14
    second = s.on_failure(11.0)
    third = s.on_failure(13.5)
    assert second.merged and third.merged
    assert second.delay_s == pytest.approx(3.0) and third.delay_s == pytest.approx(0.5)
    assert s.restarts == 1 and s.current_backoff_s == 8  # no extra attempt, no extra growth
    s.on_restart(14.0)
    after = s.on_failure(15.0)
    assert not after.merged and after.delay_s == 8 and s.restarts == 2


def test_a_failure_at_the_scheduled_time_is_not_merged() -> None:
    s = expo(initial_backoff_s=2)
    s.on_failure(0.0)
    d = s.on_failure(2.0)  # the restart was due: this is a new failure
    assert not d.merged and d.delay_s == 2 * 2


def test_strategy_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        expo(initial_backoff_s=10, max_backoff_s=1)
    with pytest.raises(ValueError):
        expo(jitter=1.5)
    with pytest.raises(ValueError):
        expo(multiplier=0.5)
    with pytest.raises(ValueError):
        FailureRate(0, 1, 1)
    with pytest.raises(ValueError):
        FixedDelay(-1, 1)
    with pytest.raises(ValueError):
        ManualClock().advance(-1)


# --- options and Spark conf ------------------------------------------------------------


def test_default_is_flinks_exponential_delay() -> None:
    s = strategy_from_options(S())
    assert isinstance(s, ExponentialDelay)
    assert (s.initial_backoff_s, s.max_backoff_s, s.multiplier, s.jitter,
            s.reset_threshold_s) == (1.0, 60.0, 1.5, 0.1, 3600.0)


def test_every_strategy_from_spark_conf() -> None:
    p = "spark.statebackend.restart-strategy."
    conf = {p + "type": "fixed-delay", p + "fixed-delay.attempts": "5",
            p + "fixed-delay.delay": "250ms"}
    s = strategy_from_options(S.from_spark_conf(conf))
    assert isinstance(s, FixedDelay) and (s.attempts, s.delay_s) == (5, 0.25)
    conf = {p + "type": "FAILURE-RATE", p + "failure-rate.max-failures-per-interval": "3",
            p + "failure-rate.failure-rate-interval": "5 min", p + "failure-rate.delay": "2s"}
    s = strategy_from_options(S.from_spark_conf(conf))
    assert isinstance(s, FailureRate) and (s.max_failures, s.interval_s, s.delay_s) == (3, 300, 2)
    conf = {p + "type": "exponential-delay", p + "exponential-delay.initial-backoff": "2s",
            p + "exponential-delay.max-backoff": "1h",
            p + "exponential-delay.backoff-multiplier": "3",
            p + "exponential-delay.jitter-factor": "0",
            p + "exponential-delay.reset-backoff-threshold": "1d",
            p + "exponential-delay.attempts-before-reset-backoff": "4"}
    s = strategy_from_options(S.from_spark_conf(conf))
    assert isinstance(s, ExponentialDelay)
    assert (s.initial_backoff_s, s.max_backoff_s, s.multiplier, s.jitter, s.reset_threshold_s,
            s.attempts) == (2, 3600, 3, 0, 86400, 4)
    assert isinstance(strategy_from_options(S.from_spark_conf({p + "type": "none"})), NoRestart)


def test_restart_options_are_validated() -> None:
    p = "spark.statebackend.restart-strategy."
    with pytest.raises(OptionsError, match="did you mean 'fixed-delay'"):
        S(restart_strategy="fixed-delya")
    with pytest.raises(OptionsError, match=p + "fixed-delay.delay"):
        S.from_spark_conf({p + "fixed-delay.delay": "soon"})
    with pytest.raises(OptionsError, match="restart_exponential_jitter"):
        S(restart_exponential_jitter=1.5)
    with pytest.raises(OptionsError, match="restart_exponential_max_backoff"):
        S(restart_exponential_initial_backoff=10, restart_exponential_max_backoff=5)
    with pytest.raises(OptionsError, match="Did you mean '" + p + "fixed-delay.attempts'"):
        S.from_spark_conf({p + "fixed-delay.attemps": "3"})
    with pytest.raises(OptionsError):
        S(restart_fixed_delay=-1)
    with pytest.raises(OptionsError):
        S(restart_fixed_delay=True)


@pytest.mark.parametrize("text,seconds", [("500ms", 0.5), ("10", 10.0), ("10s", 10.0),
                                          ("1.5 min", 90.0), ("2m", 120.0), ("1h", 3600.0),
                                          ("1d", 86400.0), (3, 3.0), (0.25, 0.25)])
def test_parse_duration(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "1 fortnight", "-1s", True, float("inf"), None])
def test_parse_duration_refuses(bad) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)
