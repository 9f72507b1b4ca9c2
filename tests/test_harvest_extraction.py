"""Extraction quality, cheaply (issue 48 item 3): repeats inside one reply are dropped
before merging and counted; the prompt asks for distinct statements of one thing each with
absolute dates; ``LOOMRT_HARVEST_MODEL`` sets the extraction model beside ``--model``."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harvest_kit import harvest_record

from loomrt.bench.harvest_bench import _bench_bank, locomo_tiers
from loomrt.errors import SpecError
from loomrt.harvest import Consolidator
from loomrt.harvest.consolidator import MODEL_ENV, harvest_model
from loomrt.harvest.db import harvest_db
from loomrt.harvest.extract import EXTRACT_PROMPT, REPLY_SCHEMA, Line, Unparseable, check_fact, distinct
from loomrt.harvest.scripted import conversation_lines, echo_extractor, repeating_extractor
from loomrt.harvest.wiring import memory_store
from loomrt.messages import EvictedSpan, Message
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.record.sqlite import SQLiteStore
from loomrt.testing import FunctionProvider

MINI = Path(__file__).parent / "data" / "locomo-mini.json"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    yield from harvest_record(request, tmp_path)


def _bank(store: SQLiteStore, said: list[str]) -> None:
    messages = tuple(Message(role="user", name="Ana", content=text, seq=i + 1) for i, text in enumerate(said))
    _bench_bank(harvest_db(store), "r-x", "user:ana").bank(
        EvictedSpan(run_id="r-x", agent="bench", mode="recap", distillation_seq=1, messages=messages)
    )


def test_repeats_in_one_reply_are_dropped_before_merging_and_counted(store: SQLiteStore) -> None:
    _bank(store, ["Ana's sister Marta lives in Porto.", "Ana keeps bees on her roof."])
    report = Consolidator(store, provider=repeating_extractor(), embedder="hash", settle_s=0).run_once()
    assert report.dropped["repeated"] == 4  # two facts, each made three times
    assert report.facts == {"new": 2, "merged": 0, "superseded": 0, "already": 0}
    history = [memory_store(store, "hash").history(f.fact_id) for f in memory_store(store, "hash").facts()]
    assert [[h["action"] for h in hs] for hs in history] == [["created"], ["created"]]  # no merge rows from repeats


def test_a_repeat_that_cites_other_lines_adds_them_to_the_fact(store: SQLiteStore) -> None:
    _bank(store, ["Ana runs the Lisbon half marathon.", "Yes, Ana runs the Lisbon half marathon!"])

    def twice(request: ModelRequest) -> str:
        fact = {"statement": "Ana runs the Lisbon half marathon.", "class": "fact", "subject": "Ana"}
        ns = [n for n, _, _ in conversation_lines(request)]
        return json.dumps({"facts": [{**fact, "source_seqs": [n]} for n in ns]})

    report = Consolidator(store, provider=FunctionProvider(twice), embedder="hash", settle_s=0).run_once()
    assert report.dropped["repeated"] == 1
    (fact,) = memory_store(store, "hash").facts()
    assert [line["seq"] for line in fact.lines] == [1, 2]


def test_a_statement_in_the_first_person_is_dropped_as_unresolved() -> None:
    """As the embedded model wrote them on LoCoMo (a real run): a line copied as said names
    nobody. Sabotage: without the check, "me" would be kept as a fact about no one."""
    said = "The support group has made me feel accepted and given me courage to embrace myself."
    lines = {7: Line(7, f"[7] user (Caroline): {said}", "r-1", 7, 1683504000.0, 20, said=said, speaker="Caroline")}
    for statement, why in (
        (said, "unresolved"),
        ("I'm keen on counseling or working in mental health.", "unresolved"),
        ("Caroline feels accepted by the support group, which gave her courage.", ""),
        (f'Caroline said: "{said}"', ""),  # a quote, and who said it: "me" is Caroline
        ("Caroline calls the evenings she paints ‘me time’.", ""),
    ):
        item = {"subject": "Caroline", "statement": statement, "source_seqs": [7], "class": "fact"}
        assert check_fact(item, lines)[1] == why, statement
    # a user's own chat names no speaker: "my" is the memory scope's owner, and the fact is kept
    mine = "My colleague Rosa works on the billing service."
    own = {1: Line(1, f"[1] user: {mine}", "r-2", 1, 1683504000.0, 12, said=mine)}
    item = {"subject": "Rosa", "statement": mine, "source_seqs": [1], "class": "fact"}
    assert check_fact(item, own)[1] == ""


def test_an_item_is_asked_for_its_subject_and_statement_before_the_lines_it_cites() -> None:
    """The embedded model writes an item in the schema's order: with the keys sorted it chose
    its lines before its statement (and cited lines 1 to 6 for most facts)."""
    order = list(REPLY_SCHEMA["properties"]["facts"]["items"]["properties"])
    assert order.index("subject") < order.index("statement") < order.index("source_seqs")
    assert '{"subject", "statement", "source_seqs", "class"}' in EXTRACT_PROMPT


def test_distinct_keeps_the_first_of_each_statement_and_leaves_the_rest_to_the_checks() -> None:
    items: list[Any] = [
        {"statement": "Ana keeps bees.", "source_seqs": [1]},
        {"statement": "ana keeps  BEES", "source_seqs": [3]},
        {"statement": "Ana keeps bees on her roof.", "source_seqs": [2]},
        "not an item",
        {"class": "fact"},
    ]
    kept, repeats = distinct(items)
    assert repeats == 1 and kept[0]["source_seqs"] == [1, 3] and kept[2:] == items[3:]
    assert items[0]["source_seqs"] == [1]  # the reply itself is left as it was


def test_a_statement_that_repeats_its_own_clauses_keeps_each_once() -> None:
    """As the embedded model wrote it on the mini LoCoMo set (a real run): one statement
    repeating its clauses until the length limit cut the last one off."""
    said = (
        "Dee started pottery classes in the week of 26 May 2024, it really helps her relax; Cy added a sourdough "
        "rye, it sells out by nine; Dee needs to try it; Cy added a sourdough rye, it sells out by nine; Dee needs "
        "to try it; Cy added a sourdough rye, it sells out by nine; Dee needs"
    )
    kept, repeats = distinct([{"statement": said, "source_seqs": [1]}, {"statement": "Cy bakes; and Cy sells."}])
    assert kept[0]["statement"] == (
        "Dee started pottery classes in the week of 26 May 2024, it really helps her relax; Cy added a sourdough "
        "rye, it sells out by nine; Dee needs to try it"
    )
    assert repeats == 4 and kept[1]["statement"] == "Cy bakes; and Cy sells."


def test_the_prompt_asks_for_distinct_single_statements_with_absolute_dates() -> None:
    for asked in ("states one thing", "each once", "absolute date", "last Tuesday"):
        assert asked in EXTRACT_PROMPT, asked


def test_the_bench_reports_the_repeats_of_an_extractor_that_repeats() -> None:
    """Sabotage of ``bench harvest``'s repeats figure: none for the echo extractor; two for
    every statement of one that says each three times, with the same facts stored."""
    from loomrt.cli.bench_harvest_cmd import _locomo_lines

    def tiers(provider: FunctionProvider) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            return asyncio.run(locomo_tiers(Path(tmp), MINI, provider=provider, embedder="hash", raw=False))

    once, thrice = tiers(echo_extractor()), tiers(repeating_extractor())
    assert once["repeats"] == 0 and thrice["facts"] == once["facts"] > 0
    assert thrice["repeats"] >= 2 * once["facts"]
    assert f"**{thrice['repeats']} repeats dropped**" in "\n".join(_locomo_lines(thrice))


@pytest.mark.slow  # litellm's import: 9 s
def test_the_extraction_model_comes_from_the_flag_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loomrt.providers.models import DEFAULT_LOCAL_MODEL

    store = SQLiteStore(tmp_path / "record.sqlite")
    monkeypatch.delenv(MODEL_ENV, raising=False)
    assert harvest_model() == DEFAULT_LOCAL_MODEL
    monkeypatch.setenv(MODEL_ENV, "  ")
    assert harvest_model() == DEFAULT_LOCAL_MODEL  # blank is unset
    monkeypatch.setenv(MODEL_ENV, "openai/gpt-4o-mini")
    assert Consolidator(store, embedder="hash").provider.model == "openai/gpt-4o-mini"
    assert Consolidator(store, model="anthropic/claude-3-5-haiku", embedder="hash").provider.model == (
        "anthropic/claude-3-5-haiku"
    )  # the flag wins
    monkeypatch.setenv(MODEL_ENV, "local/no-such-model")
    with pytest.raises(SpecError, match=r"local/no-such-model.*\$LOOMRT_HARVEST_MODEL.*unset LOOMRT_HARVEST_MODEL"):
        _ = Consolidator(store, embedder="hash").provider
    store.close()


def test_each_fact_records_the_model_that_extracted_it(store: SQLiteStore) -> None:
    _bank(store, ["Ana's cat is called Miso."])
    Consolidator(
        store, provider=FunctionProvider(echo_extractor().fn, name="vendor/model-a"), embedder="hash", settle_s=0
    ).run_once()
    (fact,) = memory_store(store, "hash").facts()
    assert fact.model == "vendor/model-a" and fact.to_dict()["model"] == "vendor/model-a"


def test_a_reply_that_begins_to_repeat_itself_is_stopped_and_its_complete_items_kept() -> None:
    from loomrt.harvest.extract import parse_reply, repeats_a_statement

    one = '{"statement": "Mara adopted a cat named Pip.", "class": "fact", "subject": "Mara", "source_seqs": [2]}'
    two = '{"statement": "Mara moved to Porto in 2021.", "class": "fact", "subject": "Mara", "source_seqs": [5]}'
    again = '{"statement": "Mara adopted a  cat named Pip!", "class": "fact"'  # the same words, cut after them
    assert not repeats_a_statement(f'{{"facts": [{one}, {two}, {{"statement": "Mara adopted a cat')
    assert not repeats_a_statement(f'{{"facts": [{one}, {two}]}}')
    assert repeats_a_statement(f'{{"facts": [{one}, {two}, {again}')
    cut = f'{{"facts": [{one}, {two}, {again}'
    assert [i["statement"] for i in parse_reply(cut, cut=True)] == [
        "Mara adopted a cat named Pip.",
        "Mara moved to Porto in 2021.",
    ]
    with pytest.raises(Unparseable):  # a reply not stopped on purpose is not read as cut
        parse_reply(cut)


def test_the_extraction_call_asks_to_be_stopped_where_the_reply_repeats(store: SQLiteStore) -> None:
    from loomrt.harvest.extract import repeats_a_statement
    from loomrt.providers.base import STOPPED_BY_CALLER

    asked: list[Any] = []
    item = {"statement": "Mara adopted a cat named Pip.", "class": "fact", "subject": "Mara", "source_seqs": [1]}

    def extractor(request: ModelRequest) -> ModelResponse:
        asked.append(request.stop_when)
        text = json.dumps({"facts": [item]})[:-2] + ", " + json.dumps(item)[:40]  # what a stopped reply holds
        return ModelResponse(text=text, finish_reason=STOPPED_BY_CALLER)

    _bank(store, ["Mara adopted a cat named Pip last week."])
    report = Consolidator(store, provider=FunctionProvider(extractor), embedder="hash", settle_s=0).run_once()
    assert asked == [repeats_a_statement]
    assert report.stopped_repeating == 1 and report.dead == 0 and report.retries == 0
    assert report.facts["new"] == 1
