"""Restart strategies: when a failed streaming query is started again, and when to give up.

The four strategies follow Flink's: :class:`NoRestart`, :class:`FixedDelay`,
:class:`ExponentialDelay` and :class:`FailureRate`. Each is a small state machine fed
with the times of failures and restarts; it never reads a clock or sleeps itself, so its
timing is a pure function of the times it is given (tests drive it with
:class:`ManualClock`). :func:`statebackend.supervisor.supervise` owns the real clock.

A decision says whether to restart, after how long, and why, in words meant for a log::

    strategy = strategy_from_options(options)
    decision = strategy.on_failure(clock.now())
    if decision.restart:
        clock.sleep(decision.delay_s)
        strategy.on_restart(clock.now())
"""

from __future__ import annotations

import abc
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .options import StateBackendOptions

__all__ = [
    "Clock",
    "ExponentialDelay",
    "FailureRate",
    "FixedDelay",
    "ManualClock",
    "MonotonicClock",
    "NoRestart",
    "RestartDecision",
    "RestartStrategy",
    "strategy_from_options",
]


class Clock(Protocol):
    """What the supervisor needs of time: a monotonic reading in seconds, and a pause."""

    def now(self) -> float:
        """Seconds on a monotonic scale (only differences matter)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Pause for ``seconds``."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and ``time.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it instantly.

    Parameters
    ----------
    start : float, default 0.0
        The initial reading.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.t = float(start)
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (time the query spent running)."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance({seconds})")
        self.t += seconds


@dataclass(frozen=True)
class RestartDecision:
    """What a strategy decided about one failure.

    Attributes
    ----------
    restart : bool
        True: start the query again after ``delay_s``; False: give up.
    delay_s : float
        Seconds to wait before the restart (0 when giving up).
    reason : str
        Why, for the log: the strategy, the counts and bounds that decided.
    merged : bool
        The failure arrived while a restart was already scheduled and was counted as
        part of the same failure (no new attempt, same restart time).
    """

    restart: bool
    delay_s: float
    reason: str
    merged: bool = False


class RestartStrategy(abc.ABC):
    """Decides, failure by failure, whether and when a query is started again.

    Call :meth:`on_failure` with the time of each failure and :meth:`on_restart` with
    the time the query was actually started again.
    """

    name: str = "?"

    @abc.abstractmethod
    def on_failure(self, now: float) -> RestartDecision:
        """Record a failure at ``now`` and decide what to do."""

    def on_restart(self, now: float) -> None:  # noqa: B027 - optional hook
        """Record that the query was started again at ``now``."""

    def describe(self) -> str:
        """The strategy and its settings, for logs."""
        return self.name


class NoRestart(RestartStrategy):
    """Never restart: the first failure is final."""

    name = "none"

    def on_failure(self, now: float) -> RestartDecision:
        return RestartDecision(False, 0.0, "restart strategy 'none' never restarts")


class FixedDelay(RestartStrategy):
    """Restart up to ``attempts`` times, each ``delay_s`` after the failure.

    Parameters
    ----------
    attempts : int
        Restarts allowed in total (>= 0).
    delay_s : float
        Pause before each restart (>= 0).
    """

    name = "fixed-delay"

    def __init__(self, attempts: int, delay_s: float) -> None:
        if attempts < 0 or delay_s < 0:
            raise ValueError(f"fixed-delay needs attempts >= 0 and delay >= 0, got "
                             f"{attempts} and {delay_s}")
        self.attempts = attempts
        self.delay_s = float(delay_s)
        self.restarts = 0

    def on_failure(self, now: float) -> RestartDecision:
        if self.restarts >= self.attempts:
            return RestartDecision(False, 0.0, f"fixed-delay: all {self.attempts} restart "
                                               f"attempts used")
        self.restarts += 1
        return RestartDecision(True, self.delay_s, f"fixed-delay: restart "
                                                   f"{self.restarts}/{self.attempts} in "
                                                   f"{self.delay_s:g}s")

    def describe(self) -> str:
        return f"fixed-delay(attempts={self.attempts}, delay={self.delay_s:g}s)"


class FailureRate(RestartStrategy):
    """Restart after ``delay_s`` unless more than ``max_failures`` failures fell within
    the last ``interval_s`` seconds (the current one included).

    Parameters
    ----------
    max_failures : int
        Failures tolerated per interval (>= 1).
    interval_s : float
        Length of the sliding window (> 0).
    delay_s : float
        Pause before each restart (>= 0).
    """

    name = "failure-rate"

    def __init__(self, max_failures: int, interval_s: float, delay_s: float) -> None:
        if max_failures < 1 or interval_s <= 0 or delay_s < 0:
            raise ValueError(f"failure-rate needs max_failures >= 1, interval > 0 and delay "
                             f">= 0, got {max_failures}, {interval_s} and {delay_s}")
        self.max_failures = max_failures
        self.interval_s = float(interval_s)
        self.delay_s = float(delay_s)
        self._times: deque[float] = deque()

    def on_failure(self, now: float) -> RestartDecision:
        self._times.append(now)
        # A failure exactly interval_s ago is outside the window: windows are half-open.
        while self._times and now - self._times[0] >= self.interval_s:
            self._times.popleft()
        n = len(self._times)
        if n > self.max_failures:
            return RestartDecision(False, 0.0, f"failure-rate: {n} failures within "
                                               f"{self.interval_s:g}s, at most "
                                               f"{self.max_failures} allowed")
        return RestartDecision(True, self.delay_s, f"failure-rate: {n}/{self.max_failures} "
                                                   f"failures within {self.interval_s:g}s; "
                                                   f"restart in {self.delay_s:g}s")

    def describe(self) -> str:
        return (f"failure-rate(max_failures={self.max_failures}, "
                f"interval={self.interval_s:g}s, delay={self.delay_s:g}s)")


class ExponentialDelay(RestartStrategy):
    """Restart with a backoff that grows by ``multiplier`` per restart, up to
    ``max_backoff_s``, with random jitter, reset after a long enough healthy run.

    Parameters
    ----------
    initial_backoff_s : float
        Backoff of the first restart (> 0).
    max_backoff_s : float
        Upper bound of the backoff before jitter (>= initial).
    multiplier : float
        Growth per restart (>= 1).
    jitter : float
        Jitter factor in [0, 1]: the delay is drawn uniformly from
        ``[b * (1 - jitter), b * (1 + jitter)]`` for backoff ``b``, so restarts of many
        queries failing together spread out.
    reset_threshold_s : float
        A failure that arrives at least this long after the last restart (the query ran
        healthy that long) resets the backoff and the attempt count (> 0).
    attempts : int
        Restarts allowed before the backoff is reset; beyond that the strategy gives up.
    rng : random.Random, optional
        Source of the jitter (seed it for reproducible tests).

    Notes
    -----
    A failure that arrives while a restart is already scheduled (before the time given
    to :meth:`on_restart` or the scheduled time, whichever the caller reports) is merged
    into the pending one: it uses no attempt, does not grow the backoff, and the
    decision keeps the remaining time of the pending restart.
    """

    name = "exponential-delay"

    def __init__(self, initial_backoff_s: float, max_backoff_s: float, multiplier: float,
                 jitter: float, reset_threshold_s: float, attempts: int = 2**31 - 1,
                 rng: random.Random | None = None) -> None:
        if not (0 < initial_backoff_s <= max_backoff_s and multiplier >= 1
                and 0 <= jitter <= 1 and reset_threshold_s > 0 and attempts >= 0):
            raise ValueError(
                f"exponential-delay needs 0 < initial_backoff <= max_backoff, multiplier >= 1,"
                f" 0 <= jitter <= 1, reset_threshold > 0 and attempts >= 0, got "
                f"{initial_backoff_s}, {max_backoff_s}, {multiplier}, {jitter}, "
                f"{reset_threshold_s}, {attempts}")
        self.initial_backoff_s = float(initial_backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.multiplier = float(multiplier)
        self.jitter = float(jitter)
        self.reset_threshold_s = float(reset_threshold_s)
        self.attempts = attempts
        self._rng = rng or random.Random()
        self._backoff = self.initial_backoff_s
        self.restarts = 0  # since the last reset
        self._last_restart: float | None = None
        self._scheduled_at: float | None = None  # a restart decided and not yet done

    @property
    def current_backoff_s(self) -> float:
        """Backoff (before jitter) the next restart would get."""
        return self._backoff

    def on_failure(self, now: float) -> RestartDecision:
        if self._scheduled_at is not None and now < self._scheduled_at:
            remaining = self._scheduled_at - now
            return RestartDecision(True, remaining, f"exponential-delay: failure during the "
                                                    f"pending restart, merged; restart in "
                                                    f"{remaining:.3g}s", merged=True)
        reset = ""
        if self._last_restart is not None and now - self._last_restart >= self.reset_threshold_s:
            reset = (f"ran {now - self._last_restart:.3g}s >= reset threshold "
                     f"{self.reset_threshold_s:g}s, backoff reset; ")
            self._backoff = self.initial_backoff_s
            self.restarts = 0
        if self.restarts >= self.attempts:
            return RestartDecision(False, 0.0, f"exponential-delay: {reset}all "
                                               f"{self.attempts} attempts before a backoff "
                                               f"reset used")
        backoff = self._backoff
        spread = backoff * self.jitter
        delay = max(0.0, backoff + self._rng.uniform(-spread, spread)) if spread else backoff
        self.restarts += 1
        self._backoff = min(self.max_backoff_s, backoff * self.multiplier)
        self._scheduled_at = now + delay
        return RestartDecision(True, delay, f"exponential-delay: {reset}restart "
                                            f"{self.restarts} in {delay:.3g}s (backoff "
                                            f"{backoff:.3g}s, jitter +-{self.jitter:g})")

    def on_restart(self, now: float) -> None:
        self._last_restart = now
        self._scheduled_at = None

    def describe(self) -> str:
        return (f"exponential-delay(initial={self.initial_backoff_s:g}s, "
                f"max={self.max_backoff_s:g}s, multiplier={self.multiplier:g}, "
                f"jitter={self.jitter:g}, reset={self.reset_threshold_s:g}s, "
                f"attempts={self.attempts})")


def strategy_from_options(options: StateBackendOptions, *,
                          rng: random.Random | None = None) -> RestartStrategy:
    """The restart strategy ``options`` configure (``restart_strategy`` and its fields).

    Parameters
    ----------
    options : StateBackendOptions
        Reads ``restart_strategy`` and the ``restart_*`` fields of that strategy.
    rng : random.Random, optional
        Jitter source for exponential-delay.

    Returns
    -------
    RestartStrategy
        A fresh strategy (strategies hold the history of one supervised query).
    """
    kind = options.restart_strategy
    if kind == "none":
        return NoRestart()
    if kind == "fixed-delay":
        return FixedDelay(options.restart_fixed_delay_attempts, options.restart_fixed_delay)
    if kind == "failure-rate":
        return FailureRate(options.restart_failure_rate_max_failures,
                           options.restart_failure_rate_interval,
                           options.restart_failure_rate_delay)
    if kind == "exponential-delay":
        return ExponentialDelay(options.restart_exponential_initial_backoff,
                                options.restart_exponential_max_backoff,
                                options.restart_exponential_multiplier,
                                options.restart_exponential_jitter,
                                options.restart_exponential_reset_threshold,
                                options.restart_exponential_attempts, rng=rng)
    raise AssertionError(f"unknown restart strategy {kind!r}")  # options validated it
