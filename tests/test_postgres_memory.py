"""Durable memory on PostgreSQL: search in the database, scopes enforced by row-level
security, claims that skip locked spans (the queue and memory on both backends are
``tests/test_harvest.py``, whose store fixture runs each test on SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from loomrt.bench.harvest_load import bank_load
from loomrt.harvest.db import harvest_db, release
from loomrt.harvest.memory import memory_of
from loomrt.harvest.pg_memory import PgMemoryStore
from loomrt.harvest.queue import Queue
from loomrt.record import pg_migrations
from loomrt.recall.embedders import HashEmbedder

TEXTS = [
    "Rosa prefers tabs over spaces in the billing service.",
    "The staging database lives at 10.0.0.7:5432 behind the VPN.",
    "Error ERR-4471 means the payment gateway timed out.",
    "Alice moved to Lisbon in March and works remotely.",
    "The backup runs nightly from /srv/backups/orchid-301/snapshot.tar.",
    "Bob is allergic to peanuts; order the curry without them.",
    "The quarterly review is on the second Tuesday of each quarter.",
    "Deploys are frozen from December 20 until January 3.",
]
QUERIES = ["tabs or spaces?", "where is the staging database", "ERR-4471", "who moved to Lisbon",
           "snapshot.tar backup path", "peanut allergy", "when is the quarterly review", "deploy freeze dates"]


@pytest.fixture
def db(postgres_url: str) -> Any:
    harvest = harvest_db(postgres_url)
    yield harvest
    release(postgres_url)


def test_search_in_the_database_ranks_as_the_sqlite_search_does(db: Any, tmp_path: Path) -> None:
    embedder = HashEmbedder(dim=384)  # an indexed dimension: the dense side goes through HNSW
    pg = memory_of(db, embedder)
    assert isinstance(pg, PgMemoryStore) and pg.pgvector
    lite = memory_of(harvest_db(tmp_path / "record.sqlite"), embedder)
    for memory in (pg, lite):
        memory.import_facts([("user:alice", t) for t in TEXTS])
    for query, text in zip(QUERIES, TEXTS, strict=True):
        on_pg = [h.text for h in pg.search(query, 3, ["user:alice"])]
        on_lite = [h.text for h in lite.search(query, 3, ["user:alice"])]
        assert on_pg[0] == text, (query, on_pg)
        assert on_pg[0] == on_lite[0]
    release(tmp_path / "record.sqlite")


def test_the_dense_search_uses_the_hnsw_index_and_the_exact_fallback_agrees(db: Any) -> None:
    memory = memory_of(db, HashEmbedder(dim=384))
    memory.import_facts([("user:alice", t) for t in TEXTS])
    vec = "[" + ",".join(["0.05"] * 384) + "]"
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT fact_id FROM memory_facts WHERE scope = ANY(%s) AND status = 'live' "
            "AND vector_dims(embedding) = 384 ORDER BY embedding::vector(384) <=> %s::vector(384) LIMIT 5",
            (["user:alice"], vec)).fetchall())
    assert "memory_facts_hnsw_384" in plan
    indexed = [h.id for h in memory.search("staging database VPN", 4, ["user:alice"])]
    memory.pgvector = False  # as on a server without pgvector: exact search over the stored bytes
    exact = [h.id for h in memory.search("staging database VPN", 4, ["user:alice"])]
    assert indexed == exact


def test_row_level_security_keeps_a_scoped_read_inside_its_scopes(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS memory_login")
        conn.execute(f"CREATE ROLE memory_login LOGIN IN ROLE {pg_migrations.APP_ROLE}")
    as_app = postgres_url.replace("postgresql://postgres:@", "postgresql://memory_login@")
    db = harvest_db(as_app)
    memory = memory_of(db, HashEmbedder(dim=384))
    memory.import_facts([("user:alice", t) for t in TEXTS[:4]] + [("user:bob", t) for t in TEXTS[4:]])
    with db.scoped(["user:alice"]):  # no WHERE on scope: the database filters
        assert {s for (s,) in db.rows("SELECT scope FROM memory_facts")} == {"user:alice"}
        with pytest.raises(Exception, match="row-level security"), db.write() as conn:
            conn.execute("INSERT INTO memory_facts (fact_id, scope, class, subject, statement, created_at, sources) "
                         "VALUES ('mx', 'user:bob', 'fact', '', 'planted', 0, '[]')")
    assert {h.scope for h in memory.search("Lisbon peanuts backup", 8, ["user:bob"])} == {"user:bob"}
    with psycopg.connect(as_app, autocommit=True) as conn:  # a connection that names no scope sees nothing
        assert conn.execute("SELECT count(*) FROM memory_facts").fetchone() == (0,)
    release(as_app)


def test_two_claims_of_the_same_spans_one_wins_and_neither_waits(db: Any) -> None:
    bank_load(db.url, 6, scopes=("user:alice",))
    queue = Queue(db)
    spans = queue.pending("user:alice", after=0)
    held = threading.Event()
    release_it = threading.Event()
    results: dict[str, Any] = {}

    def slow_claim() -> None:  # holds the spans' row locks inside an open claim
        with db.write() as conn:
            conn.execute(f"SELECT id FROM harvest_spans WHERE id IN ({','.join('?' * len(spans))}) FOR UPDATE",
                         [s["id"] for s in spans])
            held.set()
            release_it.wait(10)

    t = threading.Thread(target=slow_claim)
    t.start()
    held.wait(10)
    results["second"] = queue.claim("user:alice", spans)  # skips the locked rows at once
    release_it.set()
    t.join()
    assert results["second"] is None
    assert queue.claim("user:alice", spans) is not None  # once free, a claim takes them
    assert queue.claim("user:alice", spans) is None  # and no one takes them twice
