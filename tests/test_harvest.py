"""Harvest: banking, the consolidator, and many workers draining one queue (issue 16). The
durable memory the consolidator writes, and its scopes, are tests/test_harvest_memory.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harvest_kit import TALK, chat, harvest_agent, harvest_record, padded

from loomrt import Runtime
from loomrt.bench.harvest_load import bank_load
from loomrt.harvest import Consolidator, MemoryStore
from loomrt.harvest.coreference import CASES
from loomrt.harvest.db import harvest_db
from loomrt.harvest.extract import Unparseable, check_fact, parse_reply
from loomrt.harvest.queue import Queue
from loomrt.harvest.scripted import coreference_extractor, echo_extractor
from loomrt.harvest.wiring import memory_store
from loomrt.providers.scripted import FunctionProvider
from loomrt.record.sqlite import SQLiteStore


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    yield from harvest_record(request, tmp_path)


def _banked(store: SQLiteStore) -> list[tuple]:
    return harvest_db(store).rows("SELECT run_id, distillation_seq, scope, turns FROM harvest_spans ORDER BY id")


def _consolidator(store: SQLiteStore, provider=None, **kw) -> Consolidator:
    return Consolidator(store, provider=provider or echo_extractor(), embedder="hash", settle_s=0, **kw)


# ---------------------------------------------------------------- banking


def test_each_applied_distillation_is_banked_once_with_provenance(store: SQLiteStore) -> None:
    _, run_id = chat(store, harvest_agent(), TALK)
    events = store.events(run_id)
    distilled = [e.seq for e in events if e.kind == "distillation"]
    banked = [e for e in events if e.kind == "harvest_banked"]
    assert distilled and [b.data["distillation_seq"] for b in banked] == distilled
    assert all(b.data["outcome"] == "banked" and b.data["scope"] == "user:alice" for b in banked)
    rows = _banked(store)
    assert [(r[0], r[1], r[2]) for r in rows] == [(run_id, s, "user:alice") for s in distilled]
    row = harvest_db(store).rows("SELECT agent, def_hash, seq_lo, seq_hi, ts_lo FROM harvest_spans LIMIT 1")[0]
    assert row[0] == "agent" and len(row[1]) == 16 and row[2] <= row[3] and row[4] is not None
    # the conversation only: no system prompt, no synthetic blocks
    turns = [t for r in rows for t in json.loads(r[3])]
    assert {t["role"] for t in turns} <= {"user", "assistant"}
    assert not any("Recall:" in t["text"] for t in turns)


def test_a_rejected_recap_is_never_banked(store: SQLiteStore) -> None:
    """The summariser's recap is rejected: the distillation falls back to an extract, and the
    bank gets the evicted originals, never the rejected text or the extract."""
    spec = harvest_agent()
    from loomrt.providers.scripted import ScriptedProvider

    provider = ScriptedProvider(turns=["ok " * 30] * 6, summaries=["an unrelated recap about the weather"])
    rt = Runtime(store, providers=lambda s, m: provider, embedder="hash", user="alice")

    async def play() -> str:
        run = await rt.astart(spec, interactive=True)
        for text in TALK:
            await rt.send(run, text)
        return run.run_id

    run_id = asyncio.run(play())
    made = [e.data for e in store.events(run_id, kinds=["distillation"])]
    assert made and all(d.get("fallback") for d in made)
    banked = json.dumps(_banked(store))
    assert "unrelated recap" not in banked and "an extract: the first sentence" not in banked


def test_resuming_and_rebuilding_recall_bank_nothing_new(store: SQLiteStore) -> None:
    rt, run_id = chat(
        store, harvest_agent(), TALK, finish=False, replies=[f"noted {i}. " + "ok " * 30 for i in range(10)]
    )
    before = _banked(store)
    assert before
    run = rt.open(run_id)
    run.toolset.recall.size()  # the recall index rebuilt from the record
    asyncio.run(rt.resume(run_id))
    assert _banked(store) == before
    assert len([e for e in store.events(run_id) if e.kind == "harvest_banked"]) == len(before)


def test_banking_twice_writes_one_row(store: SQLiteStore) -> None:
    bank_load(store, 3, scopes=("user:alice",))
    bank_load(store, 3, scopes=("user:alice",))
    assert len(_banked(store)) == 3


def test_secrets_are_redacted_and_private_material_is_never_banked(store: SQLiteStore) -> None:
    from loomrt.harvest.bank import conversation_turns
    from loomrt.messages import Message

    messages = (
        Message(
            role="user",
            content="my api_key = sk-abcdefghijklmnopqrstuvwx and the db is at postgres://bob:hunter22@db/x",
            seq=1,
        ),
        Message(role="tool", name="Read", content="top secret payroll " * 30, seq=2),
        Message(role="assistant", content="Noted.", seq=3),
    )
    turns, redacted = conversation_turns(messages, private={2})
    assert redacted == 2 and [t["seq"] for t in turns] == [1, 3]
    assert "sk-abc" not in turns[0]["text"] and "hunter22" not in turns[0]["text"]


def test_a_span_of_tool_traffic_only_is_counted_not_banked(store: SQLiteStore) -> None:
    from loomrt.harvest.bank import Bank
    from loomrt.messages import EvictedSpan, Message, ToolCall

    bank = Bank(
        harvest_db(store),
        run_id="r",
        agent="a",
        def_hash="0" * 16,
        scope="user:alice",
        max_tokens=100,
        private=set,
        record=lambda k, d: None,
    )
    only_tools = EvictedSpan(
        run_id="r",
        agent="a",
        mode="recap",
        distillation_seq=4,
        messages=(
            Message(role="assistant", tool_calls=(ToolCall(id="c", name="Read", arguments={"path": "x"}),), seq=2),
            Message(role="tool", name="Read", tool_call_id="c", content="file body", seq=3),
        ),
    )
    assert bank.bank(only_tools)["outcome"] == "empty"
    huge = EvictedSpan(
        run_id="r",
        agent="a",
        mode="recap",
        distillation_seq=9,
        messages=(Message(role="user", content="word " * 500, seq=5),),
    )
    refused = bank.bank(huge)
    assert refused["outcome"] == "refused" and "harvest_max_tokens" in refused["reason"]
    assert bank.counts == {"banked": 0, "empty": 1, "refused": 1} and _banked(store) == []


def test_misconfiguration_is_one_error_event_per_run(store: SQLiteStore) -> None:
    _, run_id = chat(store, harvest_agent(memory_scopes=[]), TALK[:3], finish=False)
    errors = [e for e in store.events(run_id) if e.kind == "harvest_error"]
    assert len(errors) == 1 and "memory_scopes is empty" in errors[0].data["message"]
    rt, _ = chat(store, harvest_agent(memory_scopes=[]), [], finish=False)
    asyncio.run(rt.reopen(run_id))  # reopened: not said again
    assert len([e for e in store.events(run_id) if e.kind == "harvest_error"]) == 1
    _, no_user = chat(store, harvest_agent(), TALK[:3], user=None)
    (error,) = [e for e in store.events(no_user) if e.kind == "harvest_error"]
    assert "--user" in error.data["message"] and _banked(store) == []
    assert store.get_run(no_user).status == "done"  # the run itself is fine


def test_agents_validate_warns_of_harvest_without_scopes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from loomrt.cli import app

    path = tmp_path / "agents.yaml"
    path.write_text("agents:\n  a:\n    model: local/smollm2-135m\n    context: {harvest_to_memory: true}\n")
    result = CliRunner().invoke(app, ["agents", "validate", str(path)])
    assert "memory_scopes is empty" in result.output


# ---------------------------------------------------------------- the consolidator


def test_whole_batch_extraction_keeps_what_per_span_loses(store: SQLiteStore, tmp_path: Path) -> None:
    for i, (named, said, _) in enumerate(CASES):
        from loomrt.harvest.bank import Bank
        from loomrt.messages import EvictedSpan, Message

        bank = Bank(
            harvest_db(store),
            run_id=f"c{i}",
            agent="a",
            def_hash="0" * 16,
            scope="user:alice",
            max_tokens=8000,
            private=set,
            record=lambda k, d: None,
        )
        for j, text in enumerate((named, said)):
            bank.bank(
                EvictedSpan(
                    run_id=f"c{i}",
                    agent="a",
                    mode="recap",
                    distillation_seq=10 + j,
                    messages=(Message(role="user", content=text, seq=2 * j + 1, ts=1.7e9),),
                )
            )
    whole = coreference_extractor()
    report = _consolidator(store, whole, batch_tokens=60).run_once()
    assert report.dead == 0 and report.spans == 2 * len(CASES)
    # what it was sent: both spans of a case in one call, and nothing but the conversation
    for named, said, _ in CASES:
        (call,) = [c for c in whole.calls if said in c.messages[-1]["content"]]
        text = call.messages[-1]["content"]
        assert named in text
        assert "c0" not in text and "distillation" not in text and "{" not in text
        assert all(m["role"] != "system" or "long-term memory" in m["content"] for m in call.messages)
    kept = {f.statement for f in memory_store(store, "hash").facts()}

    per_span_store = SQLiteStore(tmp_path / "per-span.sqlite")
    for i, (named, said, _) in enumerate(CASES):
        from loomrt.harvest.bank import Bank
        from loomrt.messages import EvictedSpan, Message

        bank = Bank(
            harvest_db(per_span_store.path),
            run_id=f"c{i}",
            agent="a",
            def_hash="0" * 16,
            scope="user:alice",
            max_tokens=8000,
            private=set,
            record=lambda k, d: None,
        )
        for j, text in enumerate((named, said)):
            bank.bank(
                EvictedSpan(
                    run_id=f"c{i}",
                    agent="a",
                    mode="recap",
                    distillation_seq=10 + j,
                    messages=(Message(role="user", content=text, seq=2 * j + 1, ts=1.7e9),),
                )
            )
    per_span = coreference_extractor()
    report = _consolidator(per_span_store, per_span, batch_tokens=1).run_once()
    assert len(per_span.calls) == 2 * len(CASES)  # one span per call
    lost = {f.statement for f in memory_store(per_span_store.path, "hash").facts()}
    assert report.dropped["unresolved"] == len(CASES)
    assert len(kept) == len(CASES) and lost == set()


def test_a_poison_batch_goes_to_dead_letters_and_the_queue_moves_on(store: SQLiteStore) -> None:
    bank_load(store, 3, scopes=("user:alice",))
    calls = []

    def extractor(request):
        calls.append(request)
        text = request.messages[-1]["content"]
        if "Item1x0" in text:
            return "I cannot answer in JSON, sorry"
        return json.dumps({"facts": []})

    worker = _consolidator(store, FunctionProvider(extractor), batch_tokens=1, retries=2)
    report = worker.run_once()
    assert report.dead == 1 and report.retries == 2 and report.empty_batches == 2
    kept = {f.statement for f in worker.memory.facts(["user:alice"], tiers=("passages",))}
    assert "Item1x0 is worth 7 credits." in kept and report.passages["new"] == 3  # no facts, but its words
    (letter,) = worker.queue.dead_letters()
    assert letter["reply_prefix"].startswith("I cannot answer") and "JSON" in letter["error"]
    assert worker.queue.status()[0]["watermark"] == 3  # the poison batch did not pin the queue
    worker.retry_dead()
    healed = _consolidator(store, echo_extractor(), batch_tokens=1)
    again = healed.run_once()
    assert again.batches == 1 and again.facts["new"] == 1 and not healed.queue.dead_letters()


def test_a_failed_write_holds_the_watermark_and_the_next_pass_completes(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = bank_load(store, 4, scopes=("user:alice",))
    worker = _consolidator(store, batch_tokens=1)
    real = MemoryStore.write
    calls = {"n": 0}

    def flaky(self, facts, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        return real(self, facts, **kw)

    monkeypatch.setattr(MemoryStore, "write", flaky)
    report = worker.run_once()
    assert report.held and "disk full" in report.held[0] and report.batches == 1
    assert worker.queue.status()[0]["watermark"] == 1
    monkeypatch.setattr(MemoryStore, "write", real)
    again = worker.run_once()
    assert again.batches == 3
    statements = [f.statement for f in worker.memory.facts()]
    assert sorted(statements) == sorted(texts)  # nothing lost, nothing doubled


def test_a_retried_batch_writes_nothing_new(store: SQLiteStore) -> None:
    bank_load(store, 2, scopes=("user:alice",))
    queue = Queue(harvest_db(store))
    spans = queue.pending("user:alice", after=0)
    batch = queue.claim("user:alice", spans)
    worker = _consolidator(store)
    first = asyncio.run(worker.arun_once())
    assert first.facts["new"] == 2
    queue.revive(batch)  # as if the worker died after writing and the batch came round again
    second = asyncio.run(worker.arun_once())
    assert second.facts["new"] == 0 and second.facts["already"] == 2
    assert len(worker.memory.facts()) == 2


def test_only_settled_runs_are_consolidated(store: SQLiteStore) -> None:
    _, run_id = chat(store, harvest_agent(), TALK, finish=False)
    waiting = Consolidator(store, provider=echo_extractor(), embedder="hash", settle_s=3600).run_once()
    assert waiting.batches == 0 and waiting.unsettled == len(_banked(store))
    now = Consolidator(store, provider=echo_extractor(), embedder="hash", settle_s=0).run_once()
    assert now.batches >= 1 and now.unsettled == 0


def test_a_busy_scope_is_left_to_the_worker_that_holds_its_lease(store: SQLiteStore) -> None:
    bank_load(store, 2, scopes=("user:alice",))
    assert store.take_lease("harvest:user:alice", "someone-else", 60)
    report = _consolidator(store).run_once()
    assert report.busy == ["user:alice"] and report.batches == 0


def test_the_extraction_contract() -> None:
    from loomrt.harvest.extract import Line

    lines = {1: Line(1, "[1] user: x", "r", 5, 1_683_554_160.0, 3)}
    assert parse_reply('{"facts": []}') == [] and parse_reply("[]") == []
    with pytest.raises(Unparseable):
        parse_reply("no json here")
    ok = {
        "statement": "Caroline went to a support group yesterday.",
        "class": "fact",
        "subject": "Caroline",
        "source_seqs": [1],
    }
    fact, _ = check_fact(ok, lines)
    assert fact is not None and fact.statement == "Caroline went to a support group on 7 May 2023."
    assert fact.observed_at == "2023-05-08" and fact.lines[0].seq == 5
    drops = {
        "meta": "Caroline asked the assistant about support groups.",
        "ids": "Run 3f9a2b7c1d0e recorded the group at seq 12.",
        "secret": "Caroline's password is hunter22.",
        "unresolved": "She went to a support group.",
    }
    for why, statement in drops.items():
        assert check_fact({**ok, "statement": statement, "subject": "Caroline"}, lines) == (None, why), why
    assert check_fact({**ok, "class": "gossip"}, lines) == (None, "invalid")
    assert check_fact({**ok, "source_seqs": [9]}, lines) == (None, "unsourced")


# ---------------------------------------------------------------- many workers, crashes


@pytest.mark.slow
def test_four_worker_processes_drain_the_queue_with_nothing_lost_or_doubled(store: SQLiteStore) -> None:
    from loomrt.bench.harvest_load import bank_load, drain, verify

    texts = bank_load(store, 400)
    ran = drain(store, workers=4, batch_tokens=60)
    assert ran["exit_codes"] == [0, 0, 0, 0]
    figures = verify(store, texts, ran)
    assert figures["lost"] == 0 and figures["doubled"] == 0 and figures["facts"] == 400
    assert figures["lines_extracted"] == 400 and figures["redone"] == 0 and figures["stored_twice"] == 0
    assert figures["span_states"] == {"done": 400}


@pytest.mark.slow
def test_a_worker_killed_mid_batch_loses_and_doubles_nothing(store: SQLiteStore) -> None:
    from loomrt.bench.harvest_load import bank_load, drain, verify

    texts = bank_load(store, 40, scopes=("user:alice",))
    ran = drain(store, workers=1, lease_s=1.0, batch_tokens=60, crash_at="in_consolidate:3")
    assert ran["killed"] and ran["exit_codes"][-1] == 0
    figures = verify(store, texts, ran)
    assert figures["lost"] == 0 and figures["doubled"] == 0 and figures["span_states"] == {"done": 40}
    assert figures["redone"] > 0  # the batch the worker died on, extracted again by its replacement: reported apart


def test_the_sweep_banks_from_the_record_what_a_crash_kept_from_the_bank(store: SQLiteStore) -> None:
    _, run_id = chat(store, harvest_agent(), TALK, finish=False)  # parked: its tail is not due yet
    db = harvest_db(store)
    rows = _banked(store)
    lost = rows[1][1]
    with db.write() as conn:  # as if the process died between the distillation event and the bank
        conn.execute("DELETE FROM harvest_spans WHERE run_id = ? AND distillation_seq = ?", (run_id, lost))
    report = _consolidator(store).run_once()
    assert report.swept == 1
    assert sorted((r[0], r[1]) for r in _banked(store)) == sorted((r[0], r[1]) for r in rows)
    assert {json.dumps(json.loads(r[3]), sort_keys=True) for r in _banked(store)} == {
        json.dumps(json.loads(r[3]), sort_keys=True) for r in rows
    }
    assert _consolidator(store).run_once().swept == 0  # swept once; a run without harvest is never read again


def test_a_batch_takes_whole_spans_while_they_fit_one_call(store: SQLiteStore) -> None:
    from loomrt.harvest.bank import Bank
    from loomrt.messages import EvictedSpan, Message

    bank = Bank(
        harvest_db(store),
        run_id="r",
        agent="a",
        def_hash="0" * 16,
        scope="user:alice",
        max_tokens=8000,
        private=set,
        record=lambda k, d: None,
    )
    for i in range(3):
        lines = tuple(
            Message(role="user", content=f"Line {i}.{j} says the shelf holds {j} green boxes.", seq=10 * i + j)
            for j in range(4)
        )
        bank.bank(EvictedSpan(run_id="r", agent="a", mode="recap", distillation_seq=100 + i, messages=lines))
    extractor = echo_extractor()
    report = _consolidator(store, extractor, part_tokens=40, max_parts=2, batch_tokens=10_000).run_once()
    assert report.parts_dropped == 0 and report.batches >= 2
    assert report.facts["new"] + report.facts["superseded"] == 12  # every line stored (one subject: superseded)
    huge = tuple(
        Message(role="user", content=f"Row {j} of a long list of shelves and boxes.", seq=500 + j) for j in range(12)
    )
    bank.bank(EvictedSpan(run_id="r", agent="a", mode="recap", distillation_seq=900, messages=huge))
    alone = _consolidator(store, extractor, part_tokens=40, max_parts=2).run_once()
    assert alone.batches == 1 and alone.parts_dropped > 0  # one span over the cap: its latest parts, the rest reported


def test_a_failing_model_holds_the_batch_then_dead_letters_it(store: SQLiteStore) -> None:
    bank_load(store, 1, scopes=("user:alice",))

    def broken(request):
        raise RuntimeError("the prompt is 5000 tokens and the context window (n_ctx) is 4096")

    worker = _consolidator(store, FunctionProvider(broken), retries=1)
    first = worker.run_once()
    assert first.batches == 0 and "waits for the next pass (1 of 2" in first.held[0]
    second = worker.run_once()  # the second try fails too: a batch that always fails must not pin the queue
    assert second.dead == 1 and "failed 2 times" in worker.queue.dead_letters()[0]["error"]
    assert worker.queue.status()[0]["watermark"] == 1


def test_a_reply_cut_off_at_max_tokens_is_retried_asking_for_fewer_facts(store: SQLiteStore) -> None:
    from loomrt.errors import ProviderError

    bank_load(store, 1, scopes=("user:alice",))
    seen = []

    def cut_then_fine(request):
        seen.append(request.messages[-1]["content"])
        if len(seen) == 1:
            raise ProviderError("the JSON reply was cut off at max_tokens=1024 and is incomplete")
        return json.dumps({"facts": []})

    report = _consolidator(store, FunctionProvider(cut_then_fine)).run_once()
    assert report.retries == 1 and report.empty_batches == 1 and not report.held
    assert "at most 6 facts" in seen[1] and "cut off" in seen[1]


def test_a_dead_consolidators_scope_is_taken_at_once_and_a_live_ones_is_not(store: SQLiteStore) -> None:
    """A consolidator of this machine that died mid-pass does not hold its scope for the rest
    of its 300 s lease: the next one sees it gone (its instance lock is free) and takes over;
    one that still runs keeps its scope."""
    from owners_kit import crashed_worker

    from loomrt.record.owners import worker_name

    bank_load(store, 2, scopes=("user:alice",))
    store.take_lease("harvest:user:alice", f"consolidator:abc123:{worker_name()}", 300.0)  # alive: this process
    assert _consolidator(store).run_once().busy == ["user:alice"]
    dead = f"consolidator:def456:{crashed_worker()}"
    store.release_lease("harvest:user:alice", f"consolidator:abc123:{worker_name()}")
    store.take_lease("harvest:user:alice", dead, 300.0)
    report = _consolidator(store).run_once()
    assert report.busy == [] and report.spans == 2


def test_a_long_extraction_keeps_its_short_lease(store: SQLiteStore) -> None:
    """The scope lease is short (a consolidator that stops elsewhere holds it that long at
    most) and renewed while a slow extraction runs, so no other consolidator takes the scope
    from a live one mid-batch."""
    from loomrt.harvest.scripted import _echo
    from loomrt.providers.base import ModelResponse

    bank_load(store, 1, scopes=("user:alice",))
    held: list[str | None] = []

    class Slow:
        model, capabilities = "scripted/slow", None

        async def complete(self, request):  # three leases long: the model thinks on another thread
            await asyncio.sleep(1.5)
            held.append(store.lease_holder("harvest:user:alice"))
            return ModelResponse(text=_echo(request))

    worker = _consolidator(store, Slow(), lease_s=0.5)
    assert worker.run_once().spans == 1
    assert held == [worker.holder]


def test_a_quiet_runs_tail_is_banked_once_and_not_again_when_it_is_evicted(store: SQLiteStore) -> None:
    """A run banks only what it evicts, so a chat's last words (still in its working context)
    would never be memory: once the run has ended or been quiet for tail_after_s, the sweep
    banks its tail; a later distillation that evicts those words does not bank them again."""
    from loomrt.harvest.sweep import TAILED

    rt, run_id = chat(
        store, harvest_agent(), TALK, finish=False, replies=[f"noted {i}. " + "ok " * 30 for i in range(10)]
    )
    evicted = {s for e in store.events(run_id, kinds=["distillation"]) for s in e.data["span_seqs"]}
    last = max(e.seq for e in store.events(run_id, kinds=["user_input"]))
    assert last not in evicted  # the last input is in the working context
    _consolidator(store).run_once()  # quiet for less than tail_after_s (an hour): no tail yet
    assert all(
        r[1] != r[2] for r in harvest_db(store).rows("SELECT run_id, distillation_seq, seq_hi FROM harvest_spans")
    )
    report = _consolidator(store, tail_after_s=0).run_once()
    tails = harvest_db(store).rows("SELECT seq_lo, seq_hi, turns FROM harvest_spans WHERE distillation_seq = seq_hi")
    assert tails and report.swept >= 1
    tailed = {t["seq"] for *_, turns in tails for t in json.loads(turns)}
    assert last in tailed and not tailed & evicted
    assert harvest_db(store).rows("SELECT harvest FROM harvest_swept WHERE run_id = ?", (run_id,)) == [(TAILED,)]
    kept = {f.statement for f in _consolidator(store).memory.facts(["user:alice"], tiers=("passages",))}
    assert any("Rosa5" in k for k in kept)  # the last words are memory now

    async def more() -> None:  # the chat goes on: the tail is evicted now
        run = await rt.aopen(run_id)
        for i in range(6, 10):
            await rt.send(run, padded(f"My colleague Rosa{i} works on the search service."))

    asyncio.run(more())
    later = [
        e.data
        for e in store.events(run_id, kinds=["harvest_banked"])
        if e.data["distillation_seq"] > max(s for (s,) in [(r[1],) for r in tails])
    ]
    assert later, "the chat went on distilling"
    again = [
        t["seq"]
        for (turns,) in harvest_db(store).rows(
            "SELECT turns FROM harvest_spans WHERE run_id = ? AND distillation_seq <> seq_hi", (run_id,)
        )
        for t in json.loads(turns)
    ]
    assert not set(again) & tailed, "a word of the banked tail was banked again"


def test_an_ended_runs_tail_is_banked_at_the_next_pass(store: SQLiteStore) -> None:
    _, run_id = chat(store, harvest_agent(), TALK)  # finished: the run ended
    _consolidator(store).run_once()
    tails = harvest_db(store).rows(
        "SELECT turns FROM harvest_spans WHERE run_id = ? AND distillation_seq = seq_hi", (run_id,)
    )
    assert tails and any("Rosa5" in t["text"] for (turns,) in tails for t in json.loads(turns))
