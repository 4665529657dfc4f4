"""Transfers run on a thread pool: all of them at once, failing fast
(:func:`run_all`), or handed back in order as each arrives (:func:`each_in_order`).

Either way, nothing a call started is still running when it returns or raises: a
failure (or a consumer that stops early) cancels what has not begun and waits for what
has, so no thread still writes a file the caller is about to clean up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

from .base import Transfer

Job = tuple[Callable[..., Transfer], tuple[Any, ...], dict[str, Any]]


def run_all(pool: ThreadPoolExecutor, jobs: list[Job]) -> list[Transfer]:
    """Every job's result, in input order; the first failure raised as soon as it
    happens (the others cancelled or waited for)."""
    if not jobs:
        return []
    if len(jobs) == 1:
        fn, args, kwargs = jobs[0]
        return [fn(*args, **kwargs)]
    futures: list[Future[Transfer]] = [pool.submit(fn, *a, **kw) for fn, a, kw in jobs]
    done, pending = wait(futures, return_when=FIRST_EXCEPTION)
    failed = [f for f in done if f.exception() is not None]
    if failed:
        _stop(futures)
        raise failed[0].exception()  # type: ignore[misc]
    return [f.result() for f in futures]


def each_in_order(pool: ThreadPoolExecutor, jobs: list[Job]) -> Iterator[Transfer]:
    """Every job's result, in input order, each as soon as it and those before it are
    done; all jobs are queued on ``pool`` at once, so the pool never waits for the
    consumer (a restore puts one group of files in place while the next arrives)."""
    futures: list[Future[Transfer]] = [pool.submit(fn, *a, **kw) for fn, a, kw in jobs]
    try:
        for f in futures:
            yield f.result()
    finally:
        _stop(futures)


def _stop(futures: list[Future[Transfer]]) -> None:
    """Cancel what has not begun; wait for what has (nothing may still be writing once
    the caller hears of a failure)."""
    for f in futures:
        f.cancel()
    wait(futures)
