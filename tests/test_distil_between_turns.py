"""Issue 43, item 3: in a chat, a recap or compaction due at its watermark is written
between turns, while the user types; only a context at the whole budget is distilled
inside a turn. A chat that closes with one due leaves it to ``loomrt worker``."""

from __future__ import annotations

import asyncio

import pytest
from owners_kit import crashed_worker
from spine_kit import runtime

from loomrt.events import Event
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.record.owners import worker_name
from loomrt.run.between_turns import between_turns
from loomrt.spec import AgentSpec
from loomrt.testing import FunctionProvider, extractive_summary
from loomrt.worker import work_once

NOTES = [f"Note {i}: the venue team sent another long update about chairs, lights and parking." for i in range(12)]


def answer(request: ModelRequest) -> ModelResponse:
    if request.purpose != "turn":
        return ModelResponse(text=extractive_summary(request, max_chars=300, words_per_line=10))
    last = next(m for m in reversed(request.messages) if m["role"] == "user")
    return ModelResponse(text=f"Noted: {str(last['content'])[:60]}")


def spec(mode: str) -> AgentSpec:
    ctx = {"mode": mode, "budget_tokens": 400, "keep_last_n": 2, "autorecap_at_pct": 60, "autocompact_at_pct": 60}
    return AgentSpec(model="function/inline", system_prompt="You keep the user's plans.", context=ctx)


def turns(events: list[Event]) -> list[list[Event]]:
    """The record cut at each user input: what each turn wrote, up to the next input."""
    cuts = [i for i, e in enumerate(events) if e.kind == "user_input"] + [len(events)]
    return [events[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def play(rt, mode: str, inputs: list[str], *, interactive: bool = True, between: bool = True):
    async def go():
        run = await rt.astart(spec(mode), interactive=interactive, name="planner")
        for text in inputs:
            await rt.send(run, text)
            if between:
                await between_turns(run, rt.coordination)  # what the chat does while the user types
        return run

    return asyncio.run(go())


@pytest.mark.parametrize("mode", ["recap", "compaction"])
def test_a_chat_distils_between_turns_not_inside_them(tmp_path, mode):
    rt = runtime(tmp_path, FunctionProvider(answer))
    run = play(rt, mode, NOTES)
    events = rt.store.events(run.run_id)
    assert sum(e.kind == "distillation" for e in events) >= 2
    for turn in turns(events):  # no summary call, no distillation between an input and its answer
        answered = next(i for i, e in enumerate(turn) if e.kind == "parked")
        assert not [e for e in turn[:answered] if e.kind == "distillation"]
        assert not [e for e in turn[:answered] if e.kind == "model_call" and e.data.get("purpose") != "turn"]
    queued = [e for e in events if e.kind == "distillation_queued"]
    assert queued and all(q.data["mode"] == mode and q.data["pressure"] < q.data["budget"] for q in queued)
    assert not run.view.distillation_queued


def test_a_one_shot_run_still_distils_inside_its_turn(tmp_path):
    rt = runtime(tmp_path, FunctionProvider(answer))
    long = " ".join(NOTES[:8])
    tool_free = play(rt, "recap", [long, long, long], interactive=False, between=False)
    events = rt.store.events(tool_free.run_id)
    assert not [e for e in events if e.kind == "distillation_queued"]


def test_a_context_at_the_whole_budget_is_distilled_inside_the_turn(tmp_path):
    rt = runtime(tmp_path, FunctionProvider(answer))
    at_95 = spec("recap").model_copy(
        update={"context": spec("recap").context.model_copy(update={"autorecap_at_pct": 95})}
    )
    chunks = [" ".join(NOTES[i : i + 5]) for i in (0, 5, 0, 5, 0, 5)]

    async def go():
        run = await rt.astart(at_95, interactive=True, name="planner")
        for text in chunks:  # each input takes the context from under 95% to over the budget
            await rt.send(run, text)
        return run

    run = asyncio.run(go())
    inside = [
        e
        for turn in turns(rt.store.events(run.run_id))
        for i, e in enumerate(turn)
        if e.kind == "distillation" and i < next(j for j, p in enumerate(turn) if p.kind == "parked")
    ]
    assert inside and all(e.data["pressure"] >= e.data["budget"] for e in inside)


def test_a_library_caller_that_never_waits_between_turns_gets_it_before_the_next_input(tmp_path):
    rt = runtime(tmp_path, FunctionProvider(answer))
    run = play(rt, "recap", NOTES[:8], between=False)
    events = rt.store.events(run.run_id)
    for queued in (e for e in events if e.kind == "distillation_queued"):
        after = [e for e in events if e.seq > queued.seq and e.kind in ("distillation", "user_input")]
        if after:  # settled before the next input was recorded
            assert after[0].kind == "distillation", after[0]


def test_a_chat_closed_with_a_recap_due_leaves_it_to_the_worker(tmp_path):
    rt = runtime(tmp_path, FunctionProvider(answer))
    run = play(rt, "recap", NOTES[:8], between=False)
    if not run.view.distillation_queued:  # the last input settled the one before: one more turn queues
        asyncio.run(rt.send(run, NOTES[8]))
    assert run.view.distillation_queued
    rt.finish(run)
    rows = asyncio.run(work_once(rt))
    assert [(r["run_id"], r["work"], r["done"]) for r in rows] == [(run.run_id, "distil", True)]
    assert rt.store.latest(run.run_id, "distillation").data["mode"] == "recap"
    assert asyncio.run(work_once(rt)) == []  # settled: nothing is queued any more


def test_a_recap_left_by_a_chat_that_died_is_written_by_the_next_one(tmp_path):
    rt = runtime(tmp_path, FunctionProvider(answer))
    run = play(rt, "recap", NOTES[:8], between=False)
    if not run.view.distillation_queued:
        asyncio.run(rt.send(run, NOTES[8]))
    lease = f"distil:{run.run_id}"
    dead = f"{crashed_worker()}:1"  # a worker of this machine that ended holding it
    assert rt.store.take_lease(lease, dead, 600)
    assert asyncio.run(between_turns(run, rt.coordination))
    assert not run.view.distillation_queued


def test_a_recap_nothing_wrote_between_turns_is_written_at_the_next_turn(tmp_path):
    rt = runtime(tmp_path, FunctionProvider(answer))
    run = play(rt, "recap", NOTES[:8], between=False)
    if not run.view.distillation_queued:
        asyncio.run(rt.send(run, NOTES[8]))
    queued = run.view.queued_at
    assert rt.store.take_lease(f"distil:{run.run_id}", f"{worker_name()}:0", 600)  # a live process holds it
    assert not asyncio.run(between_turns(run, rt.coordination))
    asyncio.run(rt.send(run, NOTES[9]))
    events = rt.store.events(run.run_id)
    answered = max(e.seq for e in events if e.kind == "parked")
    inside = [e for e in events if e.kind == "distillation" and queued < e.seq < answered]
    assert inside and inside[0].data["pressure"] < inside[0].data["budget"]


@pytest.mark.slow  # a summary slower than the claim's ttl, timed in seconds
def test_a_workers_queued_recap_slower_than_its_claim_keeps_the_run(tmp_path):
    """The worker's claim on a run it distils is renewed while the summary is written: a
    second worker cannot take the run over halfway, and the recap is written (without the
    heartbeat the claim lapses after its ttl, the other worker takes it, and the append is fenced)."""
    import time

    from loomrt.errors import RunOwnedError

    taken: list[str] = []

    def slow(request: ModelRequest) -> ModelResponse:
        if request.purpose != "turn" and rt.owner is not None:
            time.sleep(1.6)  # past the 1 s claim
            try:
                rt.store.claim_run(run.run_id, "other-host/1/0123456789abcdef", 60)
                taken.append("other")
            except RunOwnedError:
                taken.append("kept")
        return answer(request)

    rt = runtime(tmp_path, FunctionProvider(slow))
    run = play(rt, "recap", NOTES[:8], between=False)
    if not run.view.distillation_queued:
        asyncio.run(rt.send(run, NOTES[8]))
    rt.finish(run)
    rt.owner, rt.claim_ttl_s, rt.heartbeat_s = worker_name(), 1.0, 0.3
    rows = asyncio.run(work_once(rt))
    assert taken == ["kept"]
    assert [(r["work"], r["done"]) for r in rows] == [("distil", True)]


def test_a_chat_reads_the_reduced_context_ahead_for_its_next_turn(tmp_path):
    """After a distillation between turns, the chat reads the new context into the model's
    prefix cache while the user types (``read_ahead``), as the next turn's call will send it;
    without a reduction, and for a caller that does not ask, nothing is read. A read-ahead
    that fails is a notice, never a failed run."""
    read: list[list[dict]] = []

    class Caching(FunctionProvider):
        async def prefill(self, request: ModelRequest) -> int:
            read.append(list(request.messages))
            if len(read) == 2:
                raise RuntimeError("the cache is gone")
            return 1

    rt = runtime(tmp_path, Caching(answer))

    async def go(ahead: bool):
        run = await rt.astart(spec("recap"), interactive=True, name="planner")
        reduced = []
        for text in NOTES[:8]:
            await rt.send(run, text)
            before = len(read)
            reduced.append(await between_turns(run, rt.coordination, read_ahead=ahead))
            assert len(read) - before == (1 if ahead and reduced[-1] else 0)
            if ahead and reduced[-1]:
                assert read[-1] == list(run.view.wire)  # the context the next turn's call starts with
        return run, reduced

    run, reduced = asyncio.run(go(True))
    assert any(reduced) and not all(reduced)
    assert run.view.status == "parked"
    notices = [e.data["message"] for e in rt.store.events(run.run_id, kinds=["notice"])]
    assert any("reading ahead failed: RuntimeError: the cache is gone" in m for m in notices)
    read.clear()
    asyncio.run(go(False))
    assert read == []
