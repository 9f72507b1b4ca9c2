"""`loomrt db serve` as an operator tries it, and `loomrt db migrate` by a database owner
who is not a superuser (issue 46): the bundled server started as a subprocess, a database
owned by a role without CREATEROLE, the error that says what a superuser must run,
pgvector added by a later migrate once a superuser has created the extension, a scripted
run against the printed URL, and a clean stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from mcp_kit import free_port, server_env
from typer.testing import CliRunner

from loomrt.cli.app import app
from loomrt.harvest.backends import memory_of
from loomrt.harvest.db import harvest_db, release
from loomrt.recall.embedders import HashEmbedder
from loomrt.record.postgres import PostgresStore
from loomrt.runtime import Runtime
from loomrt.spec_load import load_agents
from loomrt.testing import ScriptedProvider

pytestmark = pytest.mark.slow


def _serve(data: Path, port: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loomrt", "db", "serve", "--data", str(data), "--port", str(port)],
        env=server_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the URL, once the server accepts connections
    if not line.startswith("LOOMRT_DB_URL="):
        proc.wait(timeout=30)
        raise AssertionError(f"no URL: {line!r}; {proc.stderr.read() if proc.stderr else ''}")
    return proc, line.strip().partition("=")[2]


def _sql(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _migrate(url: str) -> Any:
    return CliRunner().invoke(app, ["db", "migrate", "--db-url", url])


def test_serve_migrate_as_an_owner_without_createrole_then_pgvector_then_a_run(tmp_path: Path) -> None:
    port = free_port()
    proc, url = _serve(tmp_path / "pgdata", port)
    try:
        assert url == f"postgresql://postgres@127.0.0.1:{port}/loomrt"
        superuser = url.rsplit("/", 1)[0]
        _sql(f"{superuser}/postgres", "CREATE ROLE shop_owner LOGIN", "CREATE DATABASE shop OWNER shop_owner")
        owner = f"postgresql://shop_owner@127.0.0.1:{port}/shop"

        refused = _migrate(owner)  # a fresh server: no loomrt_app yet, and the owner may not create it
        assert refused.exit_code == 1 and "Traceback" not in refused.output
        assert "CREATE ROLE loomrt_app NOLOGIN" in refused.output and "shop_owner" in refused.output

        _sql(f"{superuser}/postgres", "CREATE ROLE loomrt_app NOLOGIN")
        quiet = _migrate(owner)  # the rest, without pgvector (not the owner's to create), said so
        assert quiet.exit_code == 0 and "CREATE EXTENSION vector" in quiet.output
        embedder = HashEmbedder(dim=384)
        before = memory_of(harvest_db(owner), embedder)
        assert not before.pgvector  # type: ignore[attr-defined]
        before.import_facts(
            [("user:alice", "The boiler was serviced in March."), ("user:alice", "Rent is due on the 3rd.")]
        )
        release(owner)

        _sql(f"{superuser}/shop", "CREATE EXTENSION vector")  # the superuser's fix
        fixed = _migrate(owner)
        assert fixed.exit_code == 0 and "harvest_vectors" in fixed.output and "2 vectors copied" in fixed.output
        again = _migrate(owner).output
        assert "harvest_vectors" not in again and "pgvector is not" not in again  # once, and no note since
        after = memory_of(harvest_db(owner), embedder)
        assert after.pgvector  # type: ignore[attr-defined]
        found = after.search("boiler serviced", 1, ["user:alice"])
        assert found and "boiler" in found[0].text
        with psycopg.connect(f"{superuser}/shop") as conn:
            assert conn.execute("SELECT count(embedding) FROM memory_facts").fetchone() == (2,)
        release(owner)

        # multi-machine mode on one computer: the printed URL, migrated, plays a scripted run
        assert _migrate(url).exit_code == 0
        (tmp_path / "s.yaml").write_text("turns: []\n")
        (tmp_path / "agents.yaml").write_text("agents:\n  a: {model: scripted/s.yaml}\n")
        rt = Runtime(PostgresStore(url), providers=lambda spec, model: ScriptedProvider(["served"]))
        result = rt.run_sync("a", "hello", agents=load_agents(tmp_path / "agents.yaml"))
        assert (result.status, result.output) == ("done", "served")
        rt.store.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert "PostgreSQL stopped" in (proc.stderr.read() if proc.stderr else "")
    deadline = time.monotonic() + 10
    while os.path.exists(tmp_path / "pgdata" / "postmaster.pid") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (tmp_path / "pgdata" / "postmaster.pid").exists()  # the server itself stopped


def test_serve_refuses_a_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = CliRunner().invoke(app, ["db", "serve", "--data", str(tmp_path / "d"), "--port", str(port)])
    assert result.exit_code == 1 and f"port {port}" in result.output and "--port" in result.output
