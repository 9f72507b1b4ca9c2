"""The PostgreSQL store's I/O loop: psycopg's async connections, on an event loop of their own.

An async connection pool belongs to the event loop it was opened on, and the store is used
from any loop (a worker's, an MCP server's, a test's ``asyncio.run``) and from code with
none (the CLI's reads). So its pool lives on a loop of its own, on a daemon thread:

- an **async** caller awaits the query there (:meth:`IOLoop.wait`) without blocking its own
  loop, whose other runs go on meanwhile;
- a **sync** caller waits for it (:meth:`IOLoop.call`). On a thread whose event loop is
  running, that wait blocks every task of that loop: each is counted as a **stall**
  (:attr:`IOLoop.stalls`), the figure the store measure publishes and its sabotage test
  breaks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from loomrt.driving import on_running_loop
from loomrt.errors import StoreError

__all__ = ["IOLoop", "on_running_loop", "rows_of", "changed", "Conn", "DB_NOW"]

T = TypeVar("T")
Conn = Any
"""A psycopg ``AsyncConnection`` (autocommit)."""
DB_NOW = "extract(epoch from clock_timestamp())"
"""The database's clock, epoch seconds: claims and leases expire by it on every machine."""


async def rows_of(conn: Conn, sql: str, args: Iterable[Any]) -> list[tuple[Any, ...]]:
    """Run one query on ``conn``: its rows."""
    cur = await conn.execute(sql, list(args))
    return list(await cur.fetchall())


async def changed(conn: Conn, sql: str, args: Iterable[Any]) -> int:
    """Run one statement on ``conn``: the rows it changed."""
    cur = await conn.execute(sql, list(args))
    return int(cur.rowcount)


class IOLoop:
    """An event loop on a daemon thread, for one store's connections."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self.stalls = 0
        """Sync calls made from a thread whose own event loop was running (each blocked it)."""
        self.calls = 0
        """Calls made to the loop, sync and async: each is a hop between threads and at least
        one round trip to the server."""

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the I/O loop and wait for its result (a sync caller)."""
        self._here(coro)
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("the store's I/O loop cannot wait on itself")
        self.calls += 1
        if on_running_loop():
            self.stalls += 1
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def wait(
        self,
        coro: Coroutine[Any, Any, T],
        *,
        write: bool = False,
        undo: Callable[[T], Coroutine[Any, Any, Any]] | None = None,
    ) -> T:
        """Await ``coro`` on the I/O loop from the caller's loop, which goes on meanwhile.

        A ``write`` in flight is never cut in half by the caller's cancellation: the caller
        waits for it to complete (committed or failed), then the cancellation is raised (a run's
        view catches up from the record at its next write). ``undo`` takes back what a
        cancelled caller will not use (a connection taken from the pool)."""
        self._here(coro)
        self.calls += 1
        done = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))
        if not write:
            return await done
        cancelled = False
        while not done.done():
            try:
                await asyncio.shield(done)
            except asyncio.CancelledError:
                if done.cancelled():
                    raise
                cancelled = True
            except BaseException:  # noqa: BLE001 - the write's own failure: raised below
                break
        if cancelled:
            if undo is not None and done.exception() is None:
                asyncio.run_coroutine_threadsafe(undo(done.result()), self.loop)
            raise asyncio.CancelledError
        return done.result()

    def _here(self, coro: Coroutine[Any, Any, Any]) -> None:
        """A forked child has the store but not its thread, a closed store has neither: one
        clear error, never a hang."""
        if self.loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise StoreError("this PostgreSQL store is closed: open it again")
        if os.getpid() != self._pid:
            coro.close()
            raise StoreError(
                "this PostgreSQL store was opened in another process (this one was forked from it): "
                "open the store again in this process"
            )

    def close(self, coro: Coroutine[Any, Any, Any] | None = None) -> None:
        """Run ``coro`` (closing the pool) if given, then stop the loop and its thread (in a
        forked child, which has no such thread, only forget them)."""
        if self.loop.is_closed() or os.getpid() != self._pid:
            if coro is not None:
                coro.close()
            return
        if coro is not None:
            try:
                asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)
            except (concurrent.futures.TimeoutError, Exception):  # noqa: BLE001 - closing goes on
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self.loop.close()
