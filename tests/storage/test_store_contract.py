"""The storage contract suite on every filesystem: local, memory and S3 (moto server)."""

from __future__ import annotations

from typing import Any

import pytest

from statebackend.storage import DurableStore, open_store
from statebackend.storage.testing import StoreContract


class TestFsspecStoreContract(StoreContract):
    @pytest.fixture
    def store(self, store_url: tuple[str, dict[str, Any]]) -> DurableStore:
        url, options = store_url
        s = open_store(url, storage_options=options, backoff_s=0.0)
        yield s
        s.close()
