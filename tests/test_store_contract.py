"""The storage contract's conformance suite (``tiered_history.testing``) on our three backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tiered_history.store.base import Store
from tiered_history.store.memory import MemoryStore
from tiered_history.store.sql import SQLStore
from tiered_history.testing import StoreConformance

from .conftest import database_url


class TestStoreContract(StoreConformance):
    @pytest.fixture(params=["memory", "sqlite", "postgresql"])
    def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
        with database_url(request.param, tmp_path) as url:
            store: Store = MemoryStore() if url == "memory://" else SQLStore(url)
            store.initialize()
            try:
                yield store
            finally:
                store.close()
