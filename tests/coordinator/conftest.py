"""Fixtures of the coordinator tests: fresh durable stores on every filesystem kind.

``store_url`` (local, memory, S3 on a moto server) comes from ``tests/conftest.py``;
``new_store`` opens a fresh, empty root under it on each call, so a Hypothesis example
never sees another example's files.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from statebackend.storage import open_store
from statebackend.storage.base import DurableStore


@pytest.fixture
def new_store(store_url: tuple[str, dict[str, Any]]) -> Iterator[Callable[[], DurableStore]]:
    """A factory of fresh, empty stores on one filesystem kind."""
    url, options = store_url
    opened: list[DurableStore] = []

    def make() -> DurableStore:
        # No retries: the tests inject their own faults and want them seen at once.
        store = open_store(f"{url.rstrip('/')}/{uuid.uuid4().hex[:10]}", retries=0,
                           storage_options=options)
        opened.append(store)
        return store

    yield make
    for s in opened:
        s.close()


@pytest.fixture
def store(new_store: Callable[[], DurableStore]) -> DurableStore:
    """One fresh store."""
    return new_store()
