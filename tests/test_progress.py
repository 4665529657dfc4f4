"""The progress line: what it says, when it draws, and that it stays silent off a terminal."""

from __future__ import annotations

import io

from statebackend.progress import Progress, format_bytes, format_duration


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def drawn(buf: io.StringIO) -> list[str]:
    return [x.rstrip() for x in buf.getvalue().split("\r") if x.strip()]


def test_the_line_says_items_bytes_rate_and_time_left() -> None:
    clock, buf = FakeClock(), io.StringIO()
    bar = Progress("verify", "files", enabled=True, stream=buf, clock=clock)
    clock.t += 2
    bar(1, 4, 2048, 8192)
    assert drawn(buf) == ["verify: 1/4 files, 2.0 KiB/8.0 KiB, 1.0 KiB/s, 6s left"]
    clock.t += 6
    bar(4, 4, 8192, 8192)
    bar.close()
    assert drawn(buf)[-1] == "verify: 4/4 files, 8.0 KiB/8.0 KiB, 1.0 KiB/s, 0s left"
    assert buf.getvalue().endswith("\n")


def test_unknown_totals_and_a_new_stage() -> None:
    clock, buf = FakeClock(), io.StringIO()
    bar = Progress("gc", "files read", enabled=True, stream=buf, clock=clock)
    clock.t += 1
    bar(3)
    assert drawn(buf) == ["gc: 3 files read, 3.0/s"]
    clock.t += 10
    bar(2, None, 4096, unit="files deleted")  # a new stage: its own clock, so no rate yet
    assert drawn(buf)[-1] == "gc: 2 files deleted, 4.0 KiB"


def test_redraws_are_throttled_and_close_draws_the_last_state() -> None:
    clock, buf = FakeClock(), io.StringIO()
    bar = Progress("read", "partitions", enabled=True, stream=buf, clock=clock,
                   min_interval=1.0)
    clock.t += 0.5
    bar(1, 10)
    clock.t += 0.1
    bar(2, 10)  # too soon: not drawn yet
    assert len(drawn(buf)) == 1
    bar.close()
    assert drawn(buf)[-1].startswith("read: 2/10 partitions")


def test_silent_when_disabled_or_not_a_terminal() -> None:
    buf = io.StringIO()  # isatty() is False
    with Progress("verify", stream=buf) as bar:
        bar(1, 2, 10, 20)
        bar(2, 2, 20, 20)
    assert buf.getvalue() == ""


def test_formats() -> None:
    assert format_bytes(512) == "512 B" and format_bytes(1536) == "1.5 KiB"
    assert format_duration(59.6) == "1m00s" and format_duration(75) == "1m15s"
    assert format_duration(3700) == "1h01m"
