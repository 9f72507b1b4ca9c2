"""A PostgreSQL record that cannot be reached says so as the record's error (StoreError),
which the run loop treats as an outage to wait out, never as a bug that fails the run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_worker_production import restartable, start, stop  # noqa: F401 (a fixture)

from loomrt.errors import StoreError

pytestmark = pytest.mark.slow  # a PostgreSQL server of its own, stopped and started


def test_a_transaction_begun_while_the_server_is_down_is_a_store_error(restartable: Any) -> None:  # noqa: F811
    from loomrt.record.postgres import PostgresStore

    store = PostgresStore(restartable.url)
    store._pool.timeout = 2  # how long a call waits for a connection (30 s in production)
    stop(restartable)

    async def begin() -> None:
        async with store.transaction():
            pass

    with pytest.raises(StoreError, match="cannot begin a transaction on the record"):
        asyncio.run(begin())
    start(restartable)  # up again: the same store works
    asyncio.run(begin())
    store.close()
