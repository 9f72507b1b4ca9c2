"""Issue 43, item 4: the recap and summary prompts a small model can follow (a worked
example; what to keep, named), the same system message for every call so the model's
prefix cache keeps it; and the rejected tries counted where ``runs show`` reports."""

from __future__ import annotations

import asyncio
import json

import pytest
from spine_kit import runtime
from typer.testing import CliRunner

from loomrt.cli.app import app
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.record import default_store
from loomrt.run.between_turns import between_turns
from loomrt.run.reducers.summarize import EXAMPLE_SPAN
from loomrt.spec import AgentSpec
from loomrt.testing import FunctionProvider, extractive_summary

NOTES = [f"Note {i}: the venue team sent another long update about chairs, lights and parking." for i in range(10)]


@pytest.mark.parametrize("mode", ["recap", "compaction"])
def test_every_distillation_call_sends_the_same_instructions_and_worked_example(tmp_path, mode):
    systems: list[str] = []
    replies = iter(["Sure! Happy to help with that.", *["" for _ in range(100)]])  # the first try is rejected

    def answer(request: ModelRequest) -> ModelResponse:
        if request.purpose == "turn":
            return ModelResponse(text="Noted.")
        systems.append(str(request.messages[0]["content"]))
        return ModelResponse(text=next(replies) or extractive_summary(request, max_chars=300, words_per_line=10))

    rt = runtime(tmp_path, FunctionProvider(answer))
    rt.store = default_store()  # the record `loomrt runs show` reads
    ctx = {"mode": mode, "budget_tokens": 400, "keep_last_n": 2, "autorecap_at_pct": 60, "autocompact_at_pct": 60}
    spec = AgentSpec(model="function/inline", system_prompt="You keep the user's plans.", context=ctx)

    async def play():
        run = await rt.astart(spec, interactive=True)
        for text in NOTES:
            await rt.send(run, text)
            await between_turns(run, rt.coordination)
        return run

    run = asyncio.run(play())
    assert len(systems) >= 3 and len(set(systems)) == 1  # one prefix for every call, retries included
    assert EXAMPLE_SPAN in systems[0] and "TRANSCRIPT END" in systems[0]
    for kept in ("name", "number", "date", "[#seq]"):
        assert kept in systems[0]
    shown = json.loads(CliRunner().invoke(app, ["runs", "show", run.run_id, "--json"]).output)
    assert shown["summaries_rejected"] == 1


@pytest.mark.parametrize("mode", ["recap", "compaction"])
def test_a_recap_or_summary_is_asked_for_at_most_a_fifth_of_the_budget(tmp_path, mode):
    """On a small budget a 2,000-character recap (666 tokens) is near half of it: the next
    turns reach the budget again and distil inside the turn, and a small model that fills
    the limit writes a block no smaller than its span. So the block is asked for at most a
    fifth of the budget (the recap's instructions say the same); on a large budget the
    configured limit stands."""
    from loomrt.run.reducers.summarize import block_chars

    asked: list[int] = []
    said: list[str] = []

    def answer(request: ModelRequest) -> ModelResponse:
        if request.purpose == "turn":
            return ModelResponse(text="Noted.")
        asked.append(request.max_tokens)
        said.append(str(request.messages[-1]["content"]))
        return ModelResponse(text=extractive_summary(request, max_chars=300, words_per_line=10))

    rt = runtime(tmp_path, FunctionProvider(answer))

    def spec(budget: int) -> AgentSpec:
        ctx = {"mode": mode, "budget_tokens": budget, "keep_last_n": 2, "recall": False, "autorecap_at_pct": 50}
        ctx["autocompact_at_pct"] = 50
        return AgentSpec(model="function/inline", system_prompt="You keep the user's plans.", context=ctx)

    async def play():
        run = await rt.astart(spec(1000), interactive=True)
        for text in NOTES:
            await rt.send(run, " ".join([text] * 3))
            await between_turns(run, rt.coordination)
        return run, await rt.astart(spec(20000), interactive=True)

    small, large = asyncio.run(play())
    assert block_chars(small, None if mode == "compaction" else 2000) == 600  # a fifth of 1,000 tokens
    assert block_chars(large, 2000) == 2000 and block_chars(large, None) == 4000
    assert asked and set(asked) == {200}, "the summariser is asked for a fifth of the budget, not 666 tokens"
    if mode == "recap":  # the ask names the room the new span's recap has: the block's, less what is carried
        import re

        sizes = [int(re.search(r"in at most (\d+) characters", s).group(1)) for s in said]  # type: ignore[union-attr]
        assert sizes[0] == 600 and all(n <= 600 for n in sizes)
        assert not any("At most 600 characters" in s for s in said)  # one size in the ask, not two
