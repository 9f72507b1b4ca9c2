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
    """The block takes its connection with its first write (a block that writes nothing
    asks nothing of the server): with the server down, that write is the record's error."""
    from loomrt.events import RunInfo
    from loomrt.record.postgres import PostgresStore

    store = PostgresStore(restartable.url)
    store.create_run(RunInfo(run_id="r1", agent="a", def_hash="h", mode="append", model="m"))
    store._pool.timeout = 2  # how long a call waits for a connection (30 s in production)
    stop(restartable)

    async def begin() -> None:
        async with store.transaction():
            await store.write("r1", "notice", {"message": "in a block"})

    with pytest.raises(StoreError, match="cannot append to the record of run r1"):
        asyncio.run(begin())
    start(restartable)  # up again: the same store works
    asyncio.run(begin())
    assert [e.data["message"] for e in store.events("r1")] == ["in a block"]
    store.close()
