"""Facts that carry their words (issue 48 item 1): a fact keeps the lines it came from,
verbatim, with their speakers and the dates they were said; a memory hit shows the shortest
line that supports its fact; a fact with an exact value its words do not hold is rejected,
and counted."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harvest_kit import harvest_agent, harvest_record, padded

from loomrt.bench.harvest_bench import _bench_bank
from loomrt.harvest import Consolidator, PassReport
from loomrt.harvest.db import MIGRATIONS, harvest_db
from loomrt.harvest.evidence import best_line, unsupported
from loomrt.harvest.scripted import conversation_lines, echo_extractor, inventing_extractor
from loomrt.harvest.wiring import memory_store
from loomrt.messages import EvictedSpan, Message
from loomrt.providers.base import ModelRequest
from loomrt.record.migrations import migrate
from loomrt.record.sqlite import SQLiteStore
from loomrt.testing import FunctionProvider

MONDAY = dt.datetime(2023, 5, 8, 14, tzinfo=dt.UTC).timestamp()
"""Monday 8 May 2023: the day the lines below were said."""


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    yield from harvest_record(request, tmp_path)


def _bank(store: SQLiteStore, said: list[tuple[str | None, str]], *, ts: float = MONDAY, span: int = 1) -> None:
    """Bank one span of user lines ``(speaker, words)``, said at ``ts``."""
    bank = _bench_bank(harvest_db(store), "r-words", "user:ana")
    messages = tuple(
        Message(role="user", name=who, content=text, seq=10 * span + i, ts=ts) for i, (who, text) in enumerate(said)
    )
    assert (
        bank.bank(EvictedSpan(run_id="r-words", agent="bench", mode="recap", distillation_seq=span, messages=messages))[
            "outcome"
        ]
        == "banked"
    )


def _extractor(facts: Callable[[list[tuple[int, str, str]]], list[tuple[str, list[int]]]]) -> FunctionProvider:
    """An extractor that writes ``facts(lines)``: (statement, cited line numbers) about Ana."""

    def answer(request: ModelRequest) -> str:
        out = [
            {"statement": text, "class": "fact", "subject": "Ana", "source_seqs": cited}
            for text, cited in facts(conversation_lines(request))
        ]
        return json.dumps({"facts": out})

    return FunctionProvider(answer, name="scripted/words")


def _drain(store: SQLiteStore, provider: FunctionProvider) -> PassReport:
    return Consolidator(store, provider=provider, embedder="hash", settle_s=0).run_once()


def test_a_fact_keeps_its_lines_with_speakers_and_the_dates_they_were_said(store: SQLiteStore) -> None:
    """Through a chat whose inputs carry ``said_at`` (an imported history): the fact keeps
    the words of its line, its seq and the time it was *said* (not recorded), and the model
    that extracted it; a later run's Recall shows the line beside the fact."""
    from harvest_kit import chat

    said_at = MONDAY
    names = ["Ana", "Bea", "Cleo", "Dora", "Edda", "Fern"]
    lines = [
        padded(f"{name} adopted a greyhound from the shelter on Maple Street, gate {i}0.")
        for i, name in enumerate(names)
    ]
    replies = [f"noted {i}. " + "ok " * 30 for i in range(8)]
    rt, run_id = chat(store, harvest_agent(), [], finish=False, replies=replies)
    run = rt.open(run_id)

    async def play() -> None:
        for text in lines:
            await rt.send(run, text, said_at=said_at)
        await rt.afinish(run)

    asyncio.run(play())
    report = _drain(store, echo_extractor())
    assert report.facts["new"] >= 1 and not report.dropped.get("unverified")
    memory = memory_store(store, "hash")
    facts = memory.facts(["user:alice"])
    fact = next(f for f in facts if f.subject == "Bea")  # (the first input is pinned: never evicted)
    assert fact.model == "scripted/echo-extractor" and fact.author == "run"
    (line,) = fact.lines
    assert line["text"] == lines[1] and line["role"] == "user" and line["ts"] == said_at
    assert line["run_id"] == run_id and line["seq"] == fact.sources[0]["seqs"][0]
    (hit,) = [h for h in memory.search("Bea greyhound gate 10", 1, ["user:alice"])]
    assert hit.provenance["said"] == {
        "text": lines[1],
        "speaker": "user",
        "date": "2023-05-08",
        "run_id": run_id,
        "seq": line["seq"],
    }
    later, _ = chat(store, harvest_agent(), ["hello"], finish=False)
    answer = later.open(_).toolset.tools["Recall"].fn(query="Bea greyhound gate 10", source="memory")
    assert answer["results"][0]["provenance"]["said"]["text"] == lines[1]
    # dated and voiced as the words were said (recall injection shows both), not when the fact was stored
    assert hit.ts == said_at and answer["results"][0]["ts"] == "2023-05-08T14:00:00Z"
    assert answer["results"][0]["speaker"] == "user"


def test_a_hit_shows_the_shortest_line_that_supports_its_fact(store: SQLiteStore) -> None:
    _bank(
        store,
        [
            ("Ana", "I moved to Lisbon in 2019 after years in Porto, and the weather and the food there are a dream."),
            ("Ana", "Lisbon is great."),
            ("Ana", "Yes, moved to Lisbon in 2019."),
        ],
    )
    _drain(store, _extractor(lambda lines: [("Ana moved to Lisbon in 2019.", [1, 2, 3])]))
    memory = memory_store(store, "hash")
    (hit,) = memory.search("where does Ana live", 1, ["user:ana"], tiers=("facts",))  # (not its passages)
    assert len(memory.get(hit.id or "").lines) == 3
    assert hit.provenance["said"]["text"] == "Yes, moved to Lisbon in 2019."  # not the shorter one without 2019
    assert hit.provenance["said"]["speaker"] == "Ana"


def test_an_extractor_that_invents_a_value_shows_in_the_rejected_count(store: SQLiteStore) -> None:
    """Sabotage: the same lines, one extractor true to them, one that changes a number.
    The figure the bench reports (``dropped.unverified``) is 0 for the first and counts
    every invented fact of the second, which stores none of them."""
    said = [("Ana", "My flight to Oslo leaves from gate B12 at 17:45 on 14 June."), ("Ana", "I paid 420 euros.")]
    true = _extractor(lambda lines: [("Ana's flight to Oslo leaves from gate B12 at 17:45 on 14 June.", [1])])
    _bank(store, said)
    good = _drain(store, true)
    assert good.facts["new"] == 1 and good.dropped.get("unverified", 0) == 0
    _bank(store, said, span=2)
    invent = _extractor(
        lambda lines: [
            ("Ana's flight to Oslo leaves from gate B13 at 17:45 on 14 June.", [lines[0][0]]),  # B12 → B13
            ("Ana paid 450 euros for the flight.", [lines[1][0]]),  # 420 → 450
            ("Ana flies to Oslo in 2024.", [lines[0][0]]),  # a year nobody said
        ]
    )
    bad = _drain(store, invent)
    assert bad.dropped["unverified"] == 3 and not bad.facts.get("new")
    assert len(memory_store(store, "hash").facts(["user:ana"])) == 1


def test_a_date_resolved_from_the_session_date_is_kept_and_a_wrong_one_rejected(store: SQLiteStore) -> None:
    _bank(store, [("Ana", "I adopted a dog yesterday, and we hike together last Tuesday.")])
    report = _drain(
        store,
        _extractor(
            lambda lines: [
                ("Ana adopted a dog on 7 May 2023.", [1]),  # "yesterday" on 8 May 2023
                ("Ana hiked with her dog on 2023-05-02.", [1]),  # "last Tuesday", as an ISO date
                ("Ana adopted a dog yesterday, on a Sunday.", [1]),  # resolved by the consolidator
                ("Ana adopted a dog on 6 May 2023.", [1]),  # a day off: invented
            ]
        ),
    )
    assert report.dropped["unverified"] == 1 and report.facts["new"] + report.facts["merged"] == 3
    statements = {f.statement for f in memory_store(store, "hash").facts(["user:ana"], include_hidden=True)}
    assert not any("6 May" in s for s in statements)


def test_merges_add_their_lines_and_erasing_wipes_them(store: SQLiteStore) -> None:
    _bank(store, [("Ana", "Ana's favourite tea is genmaicha.")])
    _bank(store, [("Ana", "Still genmaicha, my favourite tea.")], span=2)
    _drain(store, _extractor(lambda lines: [("Ana's favourite tea is genmaicha.", [n for n, _, _ in lines])]))
    memory = memory_store(store, "hash")
    (fact,) = memory.facts(["user:ana"])
    assert [line["text"] for line in fact.lines] == [
        "Ana's favourite tea is genmaicha.",
        "Still genmaicha, my favourite tea.",
    ]
    erased = memory.forget(fact.fact_id, erase=True)
    assert erased.lines == [] and "genmaicha" not in json.dumps(erased.to_dict())


def test_a_memory_file_from_before_the_words_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, MIGRATIONS[:3])
    conn.execute(
        "INSERT INTO memory_facts (fact_id, scope, class, subject, statement, created_at, sources) "
        "VALUES ('m1', 'user:ana', 'fact', 'Ana', 'Ana likes tea.', 1.0, '[]')"
    )
    conn.close()
    fact = memory_store(path, "hash").get("m1")
    assert fact.lines == [] and fact.author == "run" and fact.model is None


def test_the_support_check_reads_values_as_fold_does() -> None:
    lines = [{"text": "the server listens on port 5432", "ts": MONDAY, "speaker": "Ana"}]
    assert unsupported("Ana's server listens on port 5433.", lines) == ["5433"]
    assert unsupported("Ana's server listens on port 5432 since 8 May 2023.", lines) == []
    assert best_line("port 5432", []) is None


def test_the_bench_reports_the_rejected_facts_of_an_extractor_that_invents() -> None:
    """Sabotage of ``bench harvest``'s rejected figure: on the mini LoCoMo set the echo
    extractor has none rejected, one that adds a year to every statement has them all."""
    import tempfile

    from loomrt.bench.harvest_bench import locomo_tiers
    from loomrt.cli.bench_harvest_cmd import _locomo_lines

    mini = Path(__file__).parent / "data" / "locomo-mini.json"

    def tiers(provider: FunctionProvider) -> dict[str, object]:
        with tempfile.TemporaryDirectory() as tmp:
            return asyncio.run(locomo_tiers(Path(tmp), mini, provider=provider, embedder="hash", raw=False))

    true, invent = tiers(echo_extractor()), tiers(inventing_extractor())
    assert true["rejected"] == 0 and true["facts"]
    assert invent["rejected"] >= true["facts"] and invent["facts"] == 0
    assert f"**{invent['rejected']} facts rejected**" in "\n".join(_locomo_lines(invent))
