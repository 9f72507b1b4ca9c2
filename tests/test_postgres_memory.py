"""Durable memory on PostgreSQL: search in the database, scopes enforced by row-level
security, claims that skip locked spans (the queue and memory on both backends are
``tests/test_harvest.py`` and ``tests/test_harvest_memory.py``, whose store fixture runs each
test on SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from loomrt.bench.harvest_load import bank_load
from loomrt.harvest.backends import memory_of
from loomrt.harvest.db import harvest_db, release
from loomrt.harvest.pg_memory import PgMemoryStore
from loomrt.harvest.queue import Queue
from loomrt.recall.embedders import HashEmbedder
from loomrt.record import pg_migrations

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
QUERIES = [
    "tabs or spaces?",
    "where is the staging database",
    "ERR-4471",
    "who moved to Lisbon",
    "snapshot.tar backup path",
    "peanut allergy",
    "when is the quarterly review",
    "deploy freeze dates",
]


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
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT fact_id FROM memory_facts WHERE scope = ANY(%s) AND status = 'live' "
                "AND vector_dims(embedding) = 384 ORDER BY embedding::vector(384) <=> %s::vector(384) LIMIT 5",
                (["user:alice"], vec),
            ).fetchall()
        )
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
            conn.execute(
                "INSERT INTO memory_facts (fact_id, scope, class, subject, statement, created_at, sources) "
                "VALUES ('mx', 'user:bob', 'fact', '', 'planted', 0, '[]')"
            )
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
            conn.execute(
                f"SELECT id FROM harvest_spans WHERE id IN ({','.join('?' * len(spans))}) FOR UPDATE",
                [s["id"] for s in spans],
            )
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


def test_db_copy_moves_durable_memory_and_its_queue_and_search_works_there(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from typer.testing import CliRunner

    from loomrt.cli import app
    from loomrt.harvest.wiring import release as release_memory
    from loomrt.record.sqlite import SQLiteStore

    path = tmp_path / "record.sqlite"
    SQLiteStore(path).close()
    bank_load(path, 5, scopes=("user:alice",))
    lite = memory_of(harvest_db(path), HashEmbedder(dim=384))
    ids = lite.import_facts([("user:alice", t) for t in TEXTS])
    lite.forget(ids[0])
    release(path)
    args = ["db", "copy", "--from", f"sqlite:{path}", "--to", postgres_url, "--json"]
    copied = json.loads(CliRunner().invoke(app, args).stdout)
    assert copied["memory"]["memory_facts"] == len(TEXTS) and copied["memory"]["harvest_spans"] == 5
    assert json.loads(CliRunner().invoke(app, args).stdout)["memory"] == copied["memory"]  # again: nothing doubled
    pg = memory_of(harvest_db(postgres_url), HashEmbedder(dim=384))
    assert [h.id for h in pg.search("staging database VPN", 1, ["user:alice"])] == [ids[1]]
    assert ids[0] not in [h.id for h in pg.search("tabs spaces billing", 8, ["user:alice"])]  # forgotten stays so
    assert pg.get(ids[0]).status == "forgotten" and [h["action"] for h in pg.history(ids[0])] == [
        "created",
        "forgotten",
    ]
    assert Queue(harvest_db(postgres_url)).status()[0]["pending"] == 5
    release(postgres_url)
    release_memory(postgres_url)


def _sample(name: str) -> dict[str, Any]:
    turns = [{"dia_id": f"D1:{i + 1}", "speaker": "Ana" if i % 2 else "Bo", "text": t} for i, t in enumerate(TEXTS)]
    qa = [{"question": q, "evidence": [f"D1:{i + 1}"], "category": 4} for i, q in enumerate(QUERIES)]
    return {
        "sample_id": name,
        "conversation": {"session_1_date_time": "1:00 pm on 8 May, 2023", "session_1": turns},
        "qa": qa,
    }


def test_the_parity_measure_reports_both_backends_and_can_find_them_apart(db: Any, tmp_path: Path) -> None:
    from loomrt.bench.memory_search import latency_figures, parity_figures

    embedder = HashEmbedder(dim=384)
    places = {"sqlite": tmp_path / "a.sqlite", "postgres": db.url}
    same = parity_figures(lambda b: memory_of(harvest_db(places[b]), embedder), [_sample("c1")])
    assert same["sqlite"]["questions"] == same["postgres"]["questions"] == len(QUERIES)
    assert same["sqlite"]["r@5"] == same["postgres"]["r@5"] and same["within_0.02"]

    class Reversed:  # a search that ranks worst first: the measure must see it
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def import_facts(self, items: Any) -> list[str]:
            return list(self.inner.import_facts(items))

        def search(self, query: str, top_k: int, scopes: Any) -> list[Any]:
            return list(self.inner.search(query, 50, scopes))[::-1][:top_k]

    other = {"sqlite": tmp_path / "b.sqlite", "postgres": db.url}
    apart = parity_figures(
        lambda b: (
            memory_of(harvest_db(other[b]), embedder)
            if b == "sqlite"
            else Reversed(memory_of(harvest_db(other[b]), embedder))
        ),
        [_sample("c2")],
    )
    assert apart["r@5_gap"] > 0.02 and not apart["within_0.02"]
    figures = latency_figures(memory_of(db, embedder), facts=200, queries=20)
    assert figures["facts"] == 200 and 0 < figures["p50_ms"] <= figures["p95_ms"]
    for path in (places["sqlite"], other["sqlite"]):
        release(path)
