"""Harvest's durable memory (issue 16): facts found again by their vectors, paraphrases and
restatements merged, changed values superseded, forget and erase, scopes checked on every
read, Recall reading memory in a later run, and the ``loomrt memory`` commands."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harvest_kit import TALK, chat, harvest_agent, harvest_record

from loomrt.harvest import Consolidator, NewFact, ScopedMemory, ScopeError
from loomrt.harvest.backends import memory_of
from loomrt.harvest.db import harvest_db
from loomrt.harvest.scripted import echo_extractor
from loomrt.record.sqlite import SQLiteStore


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    yield from harvest_record(request, tmp_path)


def _fact(statement: str, subject: str, *, cls: str = "fact", key: str, scope: str = "user:alice") -> NewFact:
    return NewFact(
        statement=statement, cls=cls, subject=subject, scope=scope, key=key, sources=[{"run_id": "r", "seqs": [1]}]
    )


def test_a_long_fact_is_found_again_from_its_stored_vector(store: SQLiteStore) -> None:
    """A fact long enough for recall's passages is indexed by its one stored vector (a store
    opened later rebuilds its index from the rows; the search must not ask for passages)."""
    from loomrt.recall.dense import passages_of

    long = (
        "Alice wants the party in the garden behind the old library, the one with the pond and two benches. "
        "Her grandmother planted the apple trees there, and the gate that always sticks is still the same one. "
        "It should be held next summer, on the first Saturday of July, with lanterns along the paths."
    )
    assert len(passages_of(f"fact: {long}")) > 1
    db = harvest_db(store)
    memory_of(db, embedder="hash").write([_fact(long, "Alice", key="b0:long")])
    found = memory_of(db, embedder="hash").search("where does Alice want the party", 3, ["user:alice"])
    assert [h.text for h in found] == [long]


@pytest.mark.slow
def test_paraphrases_consolidate_into_few_rows(store: SQLiteStore) -> None:
    from loomrt.recall.embedders import MiniLMEmbedder

    memory = memory_of(harvest_db(store), embedder=MiniLMEmbedder())
    wordings = [
        (
            "Joaquim",
            [
                "Joaquim keeps bees on the roof of his flat.",
                "Joaquim is a rooftop beekeeper at his flat.",
                "On the roof of his flat, Joaquim keeps bees.",
            ],
        ),
        (
            "Ines",
            ["Ines drinks her coffee black.", "Ines takes her coffee black, without milk.", "Ines likes black coffee."],
        ),
        (
            "Bertrand",
            [
                "Bertrand is training for a triathlon.",
                "Bertrand trains for a triathlon.",
                "Bertrand is preparing to compete in a triathlon.",
            ],
        ),
        (
            "Yuki",
            [
                "Yuki teaches piano to children.",
                "Yuki is a piano teacher for kids.",
                "Yuki gives piano lessons to children.",
            ],
        ),
        ("Oskar", ["Oskar grew up in Gdansk.", "Oskar spent his childhood in Gdansk.", "Oskar was raised in Gdansk."]),
    ]
    for batch in range(3):
        memory.write([_fact(ws[batch], who, key=f"b{batch}:{who}") for who, ws in wordings])
    rows = memory.facts()
    assert len(rows) <= 6, [f.statement for f in rows]


def test_a_changed_value_supersedes_and_is_kept_marked(store: SQLiteStore) -> None:
    memory = memory_of(harvest_db(store), embedder="hash")
    memory.write([_fact("Keiko's deploy window is 14:00 to 16:00.", "Keiko", key="a")])
    memory.write([_fact("Keiko's deploy window is 17:00 to 19:00.", "Keiko", key="b")])
    live = memory.facts()
    assert [f.statement for f in live] == ["Keiko's deploy window is 17:00 to 19:00."]
    (old,) = [f for f in memory.facts(include_hidden=True) if f.status == "superseded"]
    assert old.superseded_by == live[0].fact_id and old.changed_at is not None
    assert [h["action"] for h in memory.history(old.fact_id)] == ["created", "superseded"]
    assert all(h.id != old.fact_id for h in memory.search("Keiko deploy window", 5, ["user:alice"]))


def test_another_fact_with_other_values_supersedes_nothing(store: SQLiteStore) -> None:
    memory = memory_of(harvest_db(store), embedder="hash")
    memory.write([_fact("Alice is 25 years old and lives in Porto.", "Alice", key="a")])
    counts = memory.write([_fact("Alice moved to Porto in 2020 with her partner.", "Alice", key="b")])
    assert counts["new"] == 1 and len(memory.facts()) == 2


def test_a_restatement_merges_into_the_stored_fact(store: SQLiteStore) -> None:
    memory = memory_of(harvest_db(store), embedder="hash")
    memory.write([_fact("Priya prefers tea to coffee in the morning.", "Priya", key="a")])
    counts = memory.write([_fact("Priya prefers tea to coffee in the morning.", "Priya", key="b")])
    assert counts["merged"] == 1 and len(memory.facts()) == 1
    (fact,) = memory.facts()
    assert len(fact.sources) == 2 and [h["action"] for h in memory.history(fact.fact_id)] == ["created", "merged"]
    other_subject = memory.write([_fact("Ravi prefers tea to coffee in the morning.", "Ravi", key="c")])
    assert other_subject["new"] == 1  # the subject words differ: never merged


def test_forget_hides_and_erase_wipes(store: SQLiteStore) -> None:
    memory = memory_of(harvest_db(store), embedder="hash")
    memory.write(
        [_fact("Omar is allergic to peanuts.", "Omar", key="a"), _fact("Ana plays the cello.", "Ana", key="b")]
    )
    omar, ana = sorted(memory.facts(), key=lambda f: f.subject, reverse=True)
    memory.forget(omar.fact_id)
    assert memory.get(omar.fact_id).statement == "Omar is allergic to peanuts."  # hidden, not erased
    assert omar.fact_id not in [h.id for h in memory.search("Omar peanuts allergy", 5, ["user:alice"])]
    memory.forget(ana.fact_id, erase=True)
    assert memory.get(ana.fact_id).statement == "" and memory.get(ana.fact_id).status == "erased"
    assert [h["action"] for h in memory.history(ana.fact_id)][-1] == "erased"


def test_scopes_are_checked_on_every_read(store: SQLiteStore) -> None:
    memory = memory_of(harvest_db(store), embedder="hash")
    memory.write(
        [
            _fact("Bob's locker code is in the blue book.", "Bob", key="a", scope="user:bob"),
            _fact("The shop closes at 18:00 on Sundays.", "shop", key="b", scope="project:shop"),
        ]
    )
    mine = ScopedMemory(memory, ["project:shop"], ["project"])
    assert [h.scope for h in mine.search("locker code shop", 5)] == ["project:shop"]
    assert [h.scope for h in mine.search("shop closes", 5, ["project"])] == ["project:shop"]
    with pytest.raises(ScopeError, match="may not read memory scope 'user:bob'"):
        mine.search("locker code", 5, ["user:bob"])


def test_recall_reads_durable_memory_with_provenance_in_a_later_run(store: SQLiteStore) -> None:
    _, first = chat(store, harvest_agent(), TALK)
    report = Consolidator(store, provider=echo_extractor(), embedder="hash", settle_s=0).run_once()
    assert report.facts["new"] >= 1
    _, other_user = chat(store, harvest_agent(), ["hello"], user="bob")
    rt, later = chat(store, harvest_agent(), ["hello again"], finish=False)
    run = rt.open(later)
    answer = run.toolset.tools["Recall"].fn(query="Rosa billing service tabs")
    memory_hits = [r for r in answer["results"] if r["source"] == "memory"]
    assert memory_hits and all(r["scope"] == "user:alice" for r in memory_hits)
    source = memory_hits[0]["provenance"]["sources"][0]
    assert source["run_id"] == first and source["seqs"]
    bob = rt.open(other_user).toolset.tools["Recall"].fn(query="Rosa billing service tabs")
    assert not [r for r in bob["results"] if r["source"] == "memory"]  # alice's memory is not bob's


def test_memory_cli_search_list_show_forget(store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from loomrt.cli import app

    monkeypatch.setenv("LOOMRT_DB_URL", getattr(store, "url", f"sqlite:{store.path}"))
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "hash")
    _, run_id = chat(store, harvest_agent(), TALK)
    cli = CliRunner()
    status = json.loads(cli.invoke(app, ["consolidate", "--status", "--json"]).output)
    assert status["scopes"][0]["pending"] >= 1
    monkeypatch.setattr("loomrt.harvest.consolidator._default_provider", lambda model: echo_extractor())
    done = cli.invoke(app, ["consolidate", "--once", "--settle-s", "0", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output.splitlines()[-1])["facts"]["new"] >= 1
    listed = json.loads(cli.invoke(app, ["memory", "list", "--json"]).output)
    fact_id = listed[0]["fact_id"]
    shown = json.loads(cli.invoke(app, ["memory", "show", fact_id, "--json"]).output)
    assert shown["origins"] and shown["origins"][0]["run_id"] == run_id
    assert shown["origins"][0]["text"].startswith(shown["statement"].split()[0])
    hits = json.loads(cli.invoke(app, ["memory", "search", "Rosa billing", "--json"]).output)
    assert hits and hits[0]["scope"] == "user:alice"
    forgotten = json.loads(cli.invoke(app, ["memory", "forget", fact_id, "--json"]).output)
    assert forgotten["status"] == "forgotten"
    bad = cli.invoke(app, ["memory", "search", "x", "--scope", "nobody"])
    assert bad.exit_code != 0 and "KIND:IDENTITY" in bad.output


def test_passages_near_a_new_value_do_not_crowd_the_old_fact_out_of_placement(store: SQLiteStore) -> None:
    from loomrt.harvest.passages import PASSAGE, passage_key

    memory = memory_of(harvest_db(store), embedder="hash")
    memory.write([_fact("Keiko's deploy window is 14:00 to 16:00.", "Keiko", key="a")])
    said = [f"Keiko's deploy window is 17:00 to 19:00, note {i}." for i in range(12)]
    memory.write(
        [],
        passages=[
            NewFact(
                statement=text,
                cls=PASSAGE,
                subject="Keiko",
                scope="user:alice",
                key=passage_key("user:alice", text),
                sources=[{"run_id": "r", "seqs": [i]}],
                lines=[{"run_id": "r", "seq": i, "role": "user", "text": text}],
            )
            for i, text in enumerate(said)
        ],
    )
    counts = memory.write([_fact("Keiko's deploy window is 17:00 to 19:00.", "Keiko", key="b")])
    assert counts["superseded"] == 1 and counts["new"] == 0
    assert [f.statement for f in memory.facts()] == ["Keiko's deploy window is 17:00 to 19:00."]
    assert len(memory.facts(tiers=("passages",))) == 12
