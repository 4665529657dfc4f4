"""Progress of long operator commands: items and bytes done, rate and time left, one
line redrawn on a terminal.

The functions that do the work (``verify_checkpoints``, ``read_rows``, ``create_savepoint``,
``migrate_savepoint``, ``run_gc``, ``restore_report``) take an optional ``progress``
callback of the :class:`ProgressFn` shape and call it as they go; only the caller decides
whether anything is shown::

    with Progress("verify", unit="files") as bar:      # draws only if stderr is a terminal
        verify_checkpoints(store, op, progress=bar)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Protocol, TextIO

__all__ = ["Progress", "ProgressFn", "format_bytes", "format_duration"]


class ProgressFn(Protocol):
    """``progress(done, total, nbytes, total_bytes, unit=...)``: ``done`` of ``total``
    items (None: unknown), ``nbytes`` of ``total_bytes`` bytes (0 / None when not
    counted), ``unit`` names the items (a new unit starts a new stage)."""

    def __call__(self, done: int, total: int | None = None, nbytes: int = 0,
                 total_bytes: int | None = None, *, unit: str | None = None) -> None: ...


def format_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_duration(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``3700`` -> ``1h01m``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """A :class:`ProgressFn` that redraws one line on ``stream`` (default stderr):
    ``verify: 12/40 files, 1.2 MiB/4.8 MiB, 3.1 MiB/s, 1s left``.

    Parameters
    ----------
    label : str
        What is running (``"verify"``).
    unit : str
        What the items are, until a call names another (``"files"``).
    enabled : bool, optional
        Default: only when ``stream`` is a terminal. Disabled, calls cost nothing.
    stream : file, optional
        Default ``sys.stderr`` (standard output stays for the command's result).
    clock : callable
        Seconds, monotonic (tests pass a fake).
    min_interval : float
        Redraw at most this often (seconds); the last item of a stage always draws.
    """

    def __init__(self, label: str, unit: str = "files", *, enabled: bool | None = None,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 min_interval: float = 0.1) -> None:
        self.stream = stream or sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.label, self.unit, self.enabled = label, unit, enabled
        self.clock, self.min_interval = clock, min_interval
        self._t0 = clock()
        self._last_draw = float("-inf")
        self._width = 0
        self._skipped: str | None = None  # a line not drawn yet (drawn by close())

    def __call__(self, done: int, total: int | None = None, nbytes: int = 0,
                 total_bytes: int | None = None, *, unit: str | None = None) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if unit is not None and unit != self.unit:
            self.unit, self._t0 = unit, now  # a new stage: its own rate and time left
        text = self.line(done, total, nbytes, total_bytes, now - self._t0)
        finished = total is not None and done >= total
        if not finished and now - self._last_draw < self.min_interval:
            self._skipped = text
            return
        self._last_draw = now
        self._draw(text)

    def line(self, done: int, total: int | None, nbytes: int, total_bytes: int | None,
             elapsed: float) -> str:
        """The text of one redraw (without the carriage return)."""
        parts = [f"{done}/{total} {self.unit}" if total is not None else f"{done} {self.unit}"]
        if nbytes or total_bytes:
            parts.append(format_bytes(nbytes) if total_bytes is None
                         else f"{format_bytes(nbytes)}/{format_bytes(total_bytes)}")
        if elapsed > 0 and (done or nbytes):
            parts.append(f"{format_bytes(nbytes / elapsed)}/s" if nbytes
                         else f"{done / elapsed:.1f}/s")
            # time left from bytes when both totals are known, else from items
            if total_bytes and nbytes:
                left = elapsed * (total_bytes - nbytes) / nbytes
            elif total and done:
                left = elapsed * (total - done) / done
            else:
                left = None
            if left is not None:
                parts.append(f"{format_duration(left)} left")
        return f"{self.label}: " + ", ".join(parts)

    def _draw(self, text: str) -> None:
        pad = max(0, self._width - len(text))  # wipe the rest of a longer previous line
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)
        self._skipped = None

    def close(self) -> None:
        """Draw the latest state if it was skipped, and end the line."""
        if self._skipped is not None:
            self._draw(self._skipped)
        if self.enabled and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
