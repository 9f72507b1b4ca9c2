"""The passage tier (issue 48 item 2): each consolidated line is kept verbatim as a passage,
once per its words and scope, with provenance; memory search fuses passages with the facts,
so what extraction missed is still found in the original words; passages never take part in
placement, never hold private material, and the bench reports the tiers apart."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harvest_kit import harvest_record

from loomrt.bench.harvest_bench import _bench_bank, locomo_tiers
from loomrt.harvest import Consolidator
from loomrt.harvest.db import harvest_db
from loomrt.harvest.scripted import conversation_lines
from loomrt.harvest.wiring import memory_store
from loomrt.messages import EvictedSpan, Message
from loomrt.providers.base import ModelRequest
from loomrt.record.sqlite import SQLiteStore
from loomrt.testing import FunctionProvider

MINI = Path(__file__).parent / "data" / "locomo-mini.json"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    yield from harvest_record(request, tmp_path)


def _vague(request: ModelRequest) -> str:
    """An extractor that cites every line and states nothing in them."""
    ns = [n for n, _, _ in conversation_lines(request)]
    fact = {
        "statement": "Ana and Bo talked about their week.",
        "class": "fact",
        "subject": "Ana",
        "source_seqs": ns[:6],
    }
    return json.dumps({"facts": [fact]})


def _bank(
    store: SQLiteStore, said: list[tuple[str, str]], *, run: str = "r-p", span: int = 1, bank: Any = None
) -> None:
    messages = tuple(
        Message(role=role, name="Ana" if role == "user" else None, content=text, seq=10 * span + i, ts=1_683_554_400.0)
        for i, (role, text) in enumerate(said)
    )
    (bank or _bench_bank(harvest_db(store), run, "user:ana")).bank(
        EvictedSpan(run_id=run, agent="bench", mode="recap", distillation_seq=span, messages=messages)
    )


def _drain(store: SQLiteStore) -> Any:
    return Consolidator(
        store, provider=FunctionProvider(_vague, name="scripted/vague"), embedder="hash", settle_s=0
    ).run_once()


def test_each_line_is_kept_once_as_a_passage_with_its_provenance(store: SQLiteStore) -> None:
    _bank(
        store,
        [("user", "My locker code at the climbing gym is 4417."), ("assistant", "Noted: locker 4417."), ("user", "ok")],
    )
    _bank(store, [("user", "my locker code at the climbing gym is 4417")], run="r-q", span=2)  # said again
    report = _drain(store)
    assert report.passages == {"new": 2, "kept_once": 1}  # "ok" is too short to be a passage
    memory = memory_store(store, "hash")
    assert [f.cls for f in memory.facts(["user:ana"])] == ["fact"]  # the fact list leaves passages out
    passages = memory.facts(["user:ana"], tiers=("passages",))
    assert [p.statement for p in passages] == ["My locker code at the climbing gym is 4417.", "Noted: locker 4417."]
    locker = passages[0]
    assert [(line["run_id"], line["seq"]) for line in locker.lines] == [("r-p", 10), ("r-q", 20)]
    assert [s["run_id"] for s in locker.sources] == ["r-p", "r-q"] and locker.subject == "Ana"
    assert _drain(store).batches == 0  # nothing pending: a retried pass adds nothing


def test_memory_search_fuses_passages_with_facts_and_finds_what_extraction_missed(store: SQLiteStore) -> None:
    _bank(store, [("user", "My locker code at the climbing gym is 4417."), ("user", "I also started learning Welsh.")])
    _drain(store)
    memory = memory_store(store, "hash")
    facts_only = memory.search("locker code climbing gym", 3, ["user:ana"], tiers=("facts",))
    assert all("4417" not in h.text for h in facts_only)  # the vague fact states nothing
    fused = memory.search("locker code climbing gym", 3, ["user:ana"])
    assert fused[0].text == "My locker code at the climbing gym is 4417." and fused[0].provenance["class"] == "passage"
    assert fused[0].provenance["said"]["seq"] == 10
    assert {h.provenance["class"] for h in fused} == {"passage", "fact"}
    with pytest.raises(ValueError, match="unknown memory tier"):
        memory.search("x", 3, ["user:ana"], tiers=("cards",))


def test_a_fact_never_merges_into_or_supersedes_a_passage(store: SQLiteStore) -> None:
    from loomrt.harvest.memory import NewFact

    _bank(store, [("user", "Ana's deploy window is 14:00 to 16:00 UTC.")])
    _drain(store)
    memory = memory_store(store, "hash")
    counts = memory.write(
        [NewFact("Ana's deploy window is 17:00 to 19:00 UTC.", "correction", "Ana", "user:ana", "k1")]
    )
    assert counts["new"] == 1 and counts["superseded"] == 0
    assert len(memory.facts(["user:ana"], tiers=("passages",))) == 1


def test_private_material_is_never_a_passage(store: SQLiteStore) -> None:
    bank = _bench_bank(harvest_db(store), "r-p", "user:ana")
    bank._private = lambda: {11}  # the run's private seqs at eviction: the payroll line
    _bank(
        store,
        [("user", "My bank PIN hint is the dog's birthday."), ("user", "The payroll file says 91,000.")],
        bank=bank,
    )
    _drain(store)
    words = json.dumps(
        [f.to_dict() for f in memory_store(store, "hash").facts(include_hidden=True, tiers=("facts", "passages"))]
    )
    assert "payroll" not in words and "dog's birthday" in words


def _tiers(**kw: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(
            locomo_tiers(
                Path(tmp),
                MINI,
                provider=FunctionProvider(_vague, name="scripted/vague"),
                embedder="hash",
                **{"raw": False, **kw},
            )
        )


def test_the_bench_reports_the_tiers_apart() -> None:
    """With an extractor that states nothing, the facts tier states no answer and the passage
    tier does; fused, the answers are still found (``bench harvest`` reports all three)."""
    from loomrt.cli.bench_harvest_cmd import _locomo_lines

    out = _tiers()
    facts, tiers = out["memory"]["states"]["recall_at"], out["tiers"]
    assert facts["10"] == 0.0 and out["passages"] > 0
    assert tiers["passages"]["recall_at"]["10"] >= 0.5 and tiers["fused"]["recall_at"]["10"] >= 0.5
    assert "facts and passages fused" in "\n".join(_locomo_lines(out))
    curve = out["budgets"]  # accuracy against tokens: facts state nothing at any budget
    assert list(curve["facts"]["recall_at"]) == ["250", "500", "1000", "2000"]
    assert set(curve["facts"]["recall_at"].values()) == {0.0} and curve["fused"]["recall_at"]["2000"] >= 0.5
    assert list(curve["passages"]["recall_at"].values()) == sorted(curve["passages"]["recall_at"].values())
    assert "Accuracy against tokens" in "\n".join(_locomo_lines(out))


def test_the_raw_turns_have_a_curve_of_their_own_and_it_can_fall(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48's goal reads the fused memory tier against the raw turns at every budget, so
    the raw turns get the same accuracy-against-tokens curve (bench recall's index, best
    first, whole turns). Sabotage: a raw index that finds nothing states nothing at any
    budget, and the fused tier then stands at or above it everywhere."""
    from loomrt.cli.bench_harvest_cmd import _locomo_lines

    out = _tiers(raw=True)
    raw = out["budgets"]["raw"]["recall_at"]
    assert list(raw) == ["250", "500", "1000", "2000"] and raw["2000"] >= 0.5
    assert list(raw.values()) == sorted(raw.values())
    assert set(out["fused_at_or_above_raw"]) == set(raw)
    assert "; raw " in "\n".join(_locomo_lines(out))

    monkeypatch.setattr("loomrt.recall.run_recall.RunRecall.search", lambda self, *a, **kw: [])
    blind = _tiers(raw=True)
    assert set(blind["budgets"]["raw"]["recall_at"].values()) == {0.0}
    assert all(blind["fused_at_or_above_raw"].values())


def test_a_consolidator_that_keeps_no_passages_shows_in_the_passage_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sabotage of the passage and fused figures: with no passages kept, both fall to the
    facts tier's (here: nothing stated)."""
    monkeypatch.setattr("loomrt.harvest.consolidator.passages_of", lambda spans, scope, batch_id: [])
    out = _tiers()
    assert out["passages"] == 0
    assert out["tiers"]["passages"]["recall_at"]["10"] == 0.0 and out["tiers"]["fused"]["recall_at"]["10"] == 0.0
    assert set(out["budgets"]["passages"]["recall_at"].values()) == {0.0}


def test_erasing_a_fact_erases_the_passages_of_its_lines(store: SQLiteStore) -> None:
    _bank(store, [("user", "My locker code at the climbing gym is 4417."), ("user", "I also started learning Welsh.")])
    _bank(store, [("user", "my locker code at the climbing gym is 4417!")], run="r-q", span=2)  # same words, other run
    _drain(store)
    memory = memory_store(store, "hash")
    (fact,) = [f for f in memory.facts(["user:ana"]) if any(line["seq"] == 10 for line in f.lines)]
    assert any("4417" in h.text for h in memory.search("locker code climbing gym", 5, ["user:ana"]))
    memory.forget(fact.fact_id, erase=True)
    assert all("4417" not in h.text for h in memory.search("locker code climbing gym 4417", 10, ["user:ana"]))
    assert not _holds_the_code(store) and "Welsh" not in _everything(store)  # every cited line's words are gone
    erased = [f for f in memory.facts(include_hidden=True, tiers=("passages",)) if f.status == "erased"]
    assert len(erased) == 2 and all(memory.history(p.fact_id)[-1]["with"] == fact.fact_id for p in erased)
    _bank(store, [("user", "My locker code at the climbing gym is 4417.")], run="r-s", span=3)  # banked again
    _drain(store)
    assert all("4417" not in h.text for h in memory.search("locker code climbing gym 4417", 10, ["user:ana"]))


def _told_the_code(store: SQLiteStore) -> tuple[str, int]:
    """A run that banked the locker code (not consolidated yet): its id and the line's seq."""
    from harvest_kit import chat, harvest_agent, padded

    said = [padded(f"Weekend plan {i}.") for i in range(6)]
    said[1] = padded("My locker code at the climbing gym is 4417.")  # (the first input is in no banked span here)
    _, run_id = chat(store, harvest_agent(), said)
    (line,) = [e for e in store.events(run_id, kinds=["user_input"]) if "4417" in e.data["content"]]
    return run_id, line.seq


def _everything(store: SQLiteStore) -> str:
    memory = memory_store(store, "hash")
    rows = memory.facts(include_hidden=True, tiers=("facts", "passages"))
    return json.dumps([f.to_dict() for f in rows] + [memory.history(f.fact_id) for f in rows])


def _holds_the_code(store: SQLiteStore) -> bool:
    """Whether the locker code is anywhere in memory, as a word: not inside a timestamp's digits
    or a hex id (a CI run once found "4417" in the timestamp 1796683820.744177)."""
    return re.search(r"(?<![\w.])4417(?!\w)", _everything(store)) is not None


def test_a_message_marked_private_after_banking_never_reaches_memory(store: SQLiteStore) -> None:
    from loomrt.visibility import mark_private_in_record

    run_id, seq = _told_the_code(store)
    mark_private_in_record(store, run_id, seq)  # the operator's mark, after the span was banked
    report = _drain(store)
    assert report.batches >= 1 and report.passages["new"] >= 3
    assert not _holds_the_code(store) and "Weekend plan 3" in _everything(store)


def test_marking_a_message_private_erases_what_memory_holds_of_it(store: SQLiteStore) -> None:
    from loomrt.harvest.wiring import erase_private
    from loomrt.visibility import mark_private_in_record

    run_id, seq = _told_the_code(store)
    _drain(store)
    memory = memory_store(store, "hash")
    assert any("4417" in h.text for h in memory.search("locker code climbing gym", 5, ["user:alice"]))
    fact = next(f for f in memory.facts(["user:alice"]) if any(line["seq"] == seq for line in f.lines))
    mark_private_in_record(store, run_id, seq)
    erased = erase_private(store, run_id, [seq])  # what `loomrt runs private` calls
    assert erased["passages"] == 1 and erased["lines"] == 1
    assert not _holds_the_code(store) and "Weekend plan" in _everything(store)
    kept = memory.get(fact.fact_id)  # the fact cited other lines too: it keeps them, and its statement
    assert kept.status == "live" and seq not in [line["seq"] for line in kept.lines] and kept.lines
    assert memory.history(fact.fact_id)[-1]["action"] == "lines_erased"


def test_a_reply_repeat_and_a_kept_passage_are_told_apart_by_the_same_words() -> None:
    """One definition of "the same words" (lower case, no punctuation) serves both extraction's
    repeat check and the passages' key, so the two cannot drift apart."""
    from loomrt.harvest import extract, passages

    assert extract.said_words is passages.said_words
    items = [
        {"statement": "Ana's code is 4417!", "source_seqs": [1]},
        {"statement": "ana's code is 4417", "source_seqs": [2]},
    ]
    kept, dropped = extract.distinct(items)
    assert dropped == 1 and kept[0]["source_seqs"] == [1, 2]
    assert passages.passage_key("user:ana", "Ana's code is 4417!") == passages.passage_key(
        "user:ana", "ana's code is 4417"
    )


def test_runs_private_erases_the_message_from_memory(store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from loomrt.cli import app

    monkeypatch.setenv("LOOMRT_DB_URL", getattr(store, "url", f"sqlite:{store.path}"))
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "hash")
    run_id, seq = _told_the_code(store)
    _drain(store)
    assert _holds_the_code(store)
    marked = CliRunner().invoke(app, ["runs", "private", run_id, str(seq), "--json"])
    assert marked.exit_code == 0, marked.output
    assert json.loads(marked.output)["memory_erased"] == {"passages": 1, "facts": 0, "lines": 1}
    assert not _holds_the_code(store)


def test_memory_erase_private_sweeps_a_runs_private_messages_out(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mark not made through `runs private` (the runtime's, or the API's) erases nothing by
    itself; `loomrt memory erase-private RUN_ID` does."""
    from typer.testing import CliRunner

    from loomrt.cli import app
    from loomrt.visibility import mark_private_in_record

    monkeypatch.setenv("LOOMRT_DB_URL", getattr(store, "url", f"sqlite:{store.path}"))
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "hash")
    run_id, seq = _told_the_code(store)
    _drain(store)
    mark_private_in_record(store, run_id, seq)
    assert _holds_the_code(store)
    swept = CliRunner().invoke(app, ["memory", "erase-private", run_id, "--json"])
    assert swept.exit_code == 0, swept.output
    assert json.loads(swept.output)["memory_erased"] == {"passages": 1, "facts": 0, "lines": 1}
    assert not _holds_the_code(store)


_ASKED = [
    ("user", "Which breed did you finally pick for the new puppy?"),
    ("assistant", "I see."),  # too short to be a passage: the window skips it
    ("assistant", "A whippet, and we named her Bea."),
    ("user", "I also started learning Welsh on weekday mornings."),
    ("assistant", "Good luck with the lessons, they sound fun."),
]


def _through_window(store: SQLiteStore, query: str) -> list[Any]:
    """The passages found for ``query`` whose lexical score is not 0, so matched on words."""
    return [h for h in memory_store(store, "hash").search(query, 10, ["user:ana"], tiers=("passages",)) if h.bm25 > 0]


def test_a_reply_is_found_by_the_question_it_answers(store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A passage is matched with the line said before it (as a run's recall matches an evicted
    turn): the reply shares no word with the query and is still found on words. Sabotage: a
    consolidator that records no line before a passage finds the question alone."""
    _bank(store, _ASKED)
    _drain(store)
    found = [h.text for h in _through_window(store, "which breed of puppy")]
    assert (
        "A whippet, and we named her Bea." in found and "Which breed did you finally pick for the new puppy?" in found
    )
    (reply,) = [
        p for p in memory_store(store, "hash").facts(["user:ana"], tiers=("passages",)) if "whippet" in p.statement
    ]
    assert reply.lines[0]["before"].startswith("p") and "breed" not in json.dumps(reply.lines)  # an id, not the words

    import loomrt.harvest.consolidator as consolidator

    kept = consolidator.passages_of

    def no_before(spans: Any, scope: str, batch_id: str) -> Any:
        out = kept(spans, scope, batch_id)
        for p in out:
            p.lines[0].pop("before", None)
        return out

    monkeypatch.setattr(consolidator, "passages_of", no_before)
    _bank(store, [(role, f"{text} (again)") for role, text in _ASKED], run="r-q", span=2)
    _drain(store)
    again = [h.text for h in _through_window(store, "which breed of puppy") if "(again)" in h.text]
    assert again == ["Which breed did you finally pick for the new puppy? (again)"]


def test_erasing_a_line_takes_its_words_out_of_the_next_passages_window(store: SQLiteStore) -> None:
    """The reply's window held the question's words; erased, they match nothing any more (on
    PostgreSQL the reply's postings are written again without them)."""
    _bank(store, _ASKED)
    _drain(store)
    memory = memory_store(store, "hash")
    (question,) = [p for p in memory.facts(["user:ana"], tiers=("passages",)) if "breed" in p.statement]
    assert "A whippet, and we named her Bea." in [h.text for h in _through_window(store, "which breed of puppy")]
    memory.forget(question.fact_id, erase=True)  # (after a search: the index built then must not keep it)
    assert _through_window(store, "which breed of puppy") == []
    assert "A whippet, and we named her Bea." in [
        h.text for h in _through_window(store, "whippet")
    ]  # its own words stay
    if memory.db.dialect == "postgres":
        with memory.db.write() as conn:
            assert conn.execute("SELECT count(*) FROM memory_terms WHERE via = ?", (question.fact_id,)).fetchone() == (
                0,
            )


def test_the_tiers_read_a_memory_hit_as_the_reader_gets_it() -> None:
    """A raw turn is measured as ``[date] Speaker: words``, so a memory hit is too (the date
    and speaker its shortest line was said with): a question whose answer is the date a line
    was said is stated by the passage, and by its words alone it is not."""
    from loomrt.bench.harvest_bench import as_read
    from loomrt.bench.qa.grade import states_answer
    from loomrt.recall.memory import MemoryHit

    hit = MemoryHit(
        text="I went to a support group yesterday.",
        score=1.0,
        ts=1_683_554_400.0,
        provenance={"said": {"speaker": "Caroline", "text": "I went to a support group yesterday."}},
    )
    assert as_read(hit) == "[8 May 2023, 14:00] Caroline: I went to a support group yesterday."
    assert states_answer(as_read(hit), "8 May 2023", 2) and not states_answer(hit.text, "8 May 2023", 2)
    assert as_read(MemoryHit(text="Ana likes tea.", score=1.0)) == "Ana likes tea."


def test_a_copy_to_postgresql_and_an_upgraded_database_match_passages_with_their_windows(
    tmp_path: Path, postgres_url: str
) -> None:
    """`db copy` writes a passage's postings as the store does (speaker and window), and `db
    migrate` writes again those of passages stored before windows (once)."""
    import psycopg
    from typer.testing import CliRunner

    from loomrt.cli import app
    from loomrt.harvest.backends import memory_of
    from loomrt.harvest.pg_part import passage_windows
    from loomrt.harvest.wiring import release

    lite = SQLiteStore(tmp_path / "record.sqlite")
    _bank(lite, _ASKED)
    _drain(lite)
    release(lite)
    lite.close()
    copied = CliRunner().invoke(
        app, ["db", "copy", "--from", f"sqlite:{tmp_path / 'record.sqlite'}", "--to", postgres_url]
    )
    assert copied.exit_code == 0, copied.output
    pg = memory_of(harvest_db(postgres_url), "hash")

    def found() -> list[str]:
        return [h.text for h in pg.search("which breed of puppy", 10, ["user:ana"], tiers=("passages",)) if h.bm25 > 0]

    assert "A whippet, and we named her Bea." in found()
    (reply,) = [p for p in pg.facts(["user:ana"], tiers=("passages",)) if "whippet" in p.statement]
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as a database written before windows holds it
        conn.execute("DELETE FROM memory_terms WHERE fact_id = %s", (reply.fact_id,))
        conn.execute(
            "INSERT INTO memory_terms (scope, term, fact_id, tf, n_tokens) VALUES ('user:ana', 'whippet', %s, 1, 1)",
            (reply.fact_id,),
        )
        conn.execute("DELETE FROM memory_settings WHERE key = 'passage_windows'")
        pg._cache.clear()
        assert "A whippet, and we named her Bea." not in found()
        assert "4 passages" in passage_windows(conn)[0] and passage_windows(conn) == []  # once
    pg._cache.clear()
    assert "A whippet, and we named her Bea." in found()
    release(postgres_url)


def test_bench_harvest_without_a_model_measures_the_passage_tier_against_raw_turns() -> None:
    """`bench harvest --data F --no-model`: memory holds passages alone (no fact is stated),
    and the passage tier is measured against the raw turns. Sabotage: with no passages kept,
    the tier states nothing while the raw turns still do."""
    from typer.testing import CliRunner

    from loomrt.cli import app

    def run() -> dict[str, Any]:
        got = CliRunner().invoke(
            app, ["bench", "harvest", "--data", str(MINI), "--no-model", "--load-spans", "10", "--json"]
        )
        assert got.exit_code == 0, got.output
        return json.loads(got.stdout.strip().splitlines()[-1])["locomo"]

    out = run()
    assert out["facts"] == 0 and out["passages"] > 0
    assert out["budgets"]["passages"]["recall_at"]["2000"] >= 0.5 and out["budgets"]["raw"]["recall_at"]["2000"] >= 0.5
    assert out["budgets"]["fused"] == out["budgets"]["passages"]

    import loomrt.harvest.consolidator as consolidator

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(consolidator, "passages_of", lambda spans, scope, batch_id: [])
        blind = run()
    assert set(blind["budgets"]["passages"]["recall_at"].values()) == {0.0}
    assert blind["budgets"]["raw"]["recall_at"]["2000"] >= 0.5


def _reads_a_lot(request: ModelRequest) -> str:
    """An extractor whose facts share one word ("Ana") with the question asked below and
    state nothing it asks."""
    ns = [n for n, _, _ in conversation_lines(request)]
    facts = [
        {"statement": "Ana loved reading.", "class": "fact", "subject": "Ana", "source_seqs": ns[-1:]},
        {"statement": "Ana went to the market.", "class": "fact", "subject": "Ana", "source_seqs": ns[-1:]},
    ]
    return json.dumps({"facts": facts})


_PETS = [
    ("assistant", "They look adorable! What are their names?"),
    ("user", "Luna and Oliver, my two cats."),
    ("user", "This week I mostly stayed home and read a lot."),
]


def _cats_first(store: SQLiteStore) -> list[Any]:
    _bank(store, _PETS)
    Consolidator(
        store, provider=FunctionProvider(_reads_a_lot, name="scripted/reads"), embedder="hash", settle_s=0
    ).run_once()
    return memory_store(store, "hash").search("What are the names of Ana's cats?", 3, ["user:ana"])


def test_a_fact_that_shares_one_word_with_the_question_ranks_below_the_passage_that_answers_it(
    store: SQLiteStore,
) -> None:
    """Facts and passages are scored by indexes of their own, but on one BM25 scale: the best
    of weak matches among the facts is not raised to the score of the best passage."""
    hits = _cats_first(store)
    assert hits[0].provenance["class"] == "passage"
    cats = next(h for h in hits if h.text == "Luna and Oliver, my two cats.")
    assert all(h.score < cats.score - 0.05 for h in hits if h.provenance["class"] == "fact")


def test_sabotage_each_kind_on_its_own_bm25_scale_puts_the_weak_fact_first(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loomrt.harvest.memory as sqlite_memory
    import loomrt.harvest.pg_memory as pg_memory

    monkeypatch.setattr(sqlite_memory, "search_together", lambda indexes, q, k: [i.search(q, k) for i in indexes])
    monkeypatch.setattr(pg_memory, "_bm25_scale", lambda every, kind: max(kind.values(), default=0.0))
    hits = _cats_first(store)
    assert hits[0].provenance["class"] == "fact"
