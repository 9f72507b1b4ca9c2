"""Retention modes: what each boundary keeps and evicts, when it fires (pressure from the
estimate and from reported usage), declined distillations, evicted-span callbacks and auto
resolution. Stateful mode has its own file, test_stateful.py."""

from __future__ import annotations

import json

import pytest
from modes_kit import R1, R2, S1, SCHEMA, agent, calc, distillations, request_contents, start, turn_requests
from spine_kit import events, kinds, runtime, send, shape, tool_call, write

from loomrt import load_agents, tool
from loomrt.testing import ScriptedProvider

# ---------------------------------------------------------------- append


def test_append_never_evicts_whatever_the_pressure(tmp_path):
    spec = agent(tmp_path, {"budget_tokens": 256})
    provider = ScriptedProvider([calc(i, usage=100_000) for i in range(5)] + ["done"])
    rt, run = start(tmp_path, spec, provider)
    result = send(rt, run, "add numbers")
    assert result.status == "done"
    assert not {"distillation", "distillation_declined"} & set(kinds(rt, run.run_id))
    assert shape(run) == ["system", "user*"] + ["assistant", "tool"] * 5 + ["assistant"]
    assert len(turn_requests(provider)[-1].messages) == 12  # the model saw everything


def test_append_with_backstop_compacts_at_autocompact_at_pct(tmp_path):
    spec = agent(tmp_path, {"budget_tokens": 1000, "backstop": True, "autocompact_at_pct": 50, "keep_last_n": 2})
    provider = ScriptedProvider([calc(1), calc(2), calc(3, usage=499), calc(4, usage=500), "done"], [S1])
    rt, run = start(tmp_path, spec, provider)
    assert send(rt, run, "add numbers").status == "done"
    (d,) = distillations(rt, run.run_id)
    assert d["mode"] == "append" and d["summary"] == S1 and d["pressure"] == 500
    assert shape(run) == ["system", "user*", "summary", "assistant", "tool", "assistant"]


# ---------------------------------------------------------------- recap


def recap_run(tmp_path, turns, summaries=(R1, R2), **ctx):
    context = {"mode": "recap", "budget_tokens": 256, "keep_last_n": 2, **ctx}
    provider = ScriptedProvider(turns, list(summaries))
    rt, run = start(tmp_path, agent(tmp_path, context), provider)
    result = send(rt, run, "the task: add numbers")
    return rt, run, provider, result


def test_recap_keeps_system_pinned_task_recap_and_the_last_keep_last_n(tmp_path):
    rt, run, provider, result = recap_run(tmp_path, [calc(1), calc(2), calc(3, usage=1000), "done"])
    assert result.status == "done" and result.distillations == 1
    (d,) = distillations(rt, run.run_id)
    ev = {e.seq: e for e in rt.store.events(run.run_id)}
    # evicted: the first two iterations; kept: the last assistant/tool pair
    assert [ev[s].kind for s in d["span_seqs"]] == ["assistant_message", "tool_result"] * 2
    assert d["summary"] == R1 and d["tokens_after"] < d["tokens_before"] and d["pressure"] == 1000
    # what the model was sent right after the boundary
    after = turn_requests(provider)[3]
    assert [r for r, _ in request_contents(after)] == ["system", "user", "user", "assistant", "tool"]
    assert after.messages[0]["content"].startswith("You are careful.")
    assert after.messages[1]["content"] == "the task: add numbers"
    assert after.messages[2]["content"].endswith("\n" + R1) and after.messages[2]["content"].startswith(
        "[Recap written by the assistant"
    )
    assert after.messages[3]["tool_calls"][0]["function"]["arguments"] == '{"expression": "3+3"}'
    assert after.messages[4]["content"] == "6"
    assert shape(run) == ["system", "user*", "recap", "assistant", "tool", "assistant"]


def test_the_recap_prompt_carries_the_task_and_the_evicted_span_with_pointers(tmp_path):
    rt, run, provider, _ = recap_run(tmp_path, [calc(1), calc(2), calc(3, usage=1000), "done"])
    (recap_call,) = [c for c in provider.calls if c.purpose == "recap"]
    prompt = recap_call.messages[1]["content"]
    assert prompt.startswith("The task: the task: add numbers")
    span = distillations(rt, run.run_id)[0]["span_seqs"]
    for seq in span:
        assert f"[#{seq}]" in prompt
    assert '"3+3"' not in prompt  # the kept tail is not recapped
    from loomrt.run.reducers.summarize import block_chars

    limit = block_chars(run, 2000)  # recap_max_chars, or a fifth of a small budget
    assert limit == min(2000, max(400, int(run.budget * 0.2 * 3)))
    assert f"At most {limit} characters" in recap_call.messages[0]["content"]


def test_the_previous_recap_is_carried_forward_and_the_model_recaps_only_the_new_span(tmp_path):
    turns = [calc(1), calc(2), calc(3, usage=1000), calc(4), calc(5), calc(6, usage=1000), "done"]
    rt, run, provider, result = recap_run(tmp_path, turns)
    assert result.distillations == 2
    second = [c for c in provider.calls if c.purpose == "recap"][1].messages[1]["content"]
    assert "R1" not in second  # a small model asked to fold it in copies it instead
    assert f"at most {400 - len(R1) - 1} characters" in second  # the room the carried part leaves
    recaps = [m for m in run.context if m.synthetic == "recap"]
    assert len(recaps) == 1 and recaps[0].content.endswith(f"\n{R1}\n{R2}")
    d = distillations(rt, run.run_id)[1]
    assert d["summary"] == f"{R1}\n{R2}" and d["carried_chars"] == len(R1)
    assert shape(run) == ["system", "user*", "recap", "assistant", "tool", "assistant"]


def test_a_recap_longer_than_recap_max_chars_is_cut(tmp_path):
    long = "I used calculate on each expression. " + "x" * 500
    rt, run, _, _ = recap_run(tmp_path, [calc(1), calc(2), calc(3, usage=1000), "done"], [long], recap_max_chars=100)
    (d,) = distillations(rt, run.run_id)
    assert len(d["summary"]) == 100 and d["summary"].endswith("…")
    (block,) = [m for m in run.context if m.synthetic == "recap"]
    assert block.content.endswith("\n" + d["summary"])


def test_keep_first_false_lets_the_task_go(tmp_path):
    rt, run, _, _ = recap_run(tmp_path, [calc(1), calc(2), calc(3, usage=1000), "done"], keep_first=False)
    (d,) = distillations(rt, run.run_id)
    assert 2 in d["span_seqs"]  # the task (seq 2) was evicted
    assert shape(run) == ["system", "recap", "assistant", "tool", "assistant"]


# ---------------------------------------------------------------- compaction


def test_compaction_keeps_task_summary_and_last_keep_last_n(tmp_path):
    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 256, "keep_last_n": 4})
    provider = ScriptedProvider([calc(1), calc(2), calc(3), calc(4, usage=1000), "done"], [S1])
    rt, run = start(tmp_path, spec, provider)
    assert send(rt, run, "task").status == "done"
    (d,) = distillations(rt, run.run_id)
    assert d["mode"] == "compaction" and d["summary"] == S1
    summary_call = next(c for c in provider.calls if c.purpose == "summary")
    assert summary_call.messages[0]["content"].startswith("Summarise the conversation")
    assert shape(run) == ["system", "user*", "summary", "assistant", "tool", "assistant", "tool", "assistant"]
    kept = [m.seq for m in run.context if m.role in ("assistant", "tool")][:4]
    assert not set(kept) & set(d["span_seqs"])


def _pairs_are_whole(messages) -> bool:
    calls = [c.id for m in messages if m.role == "assistant" for c in m.tool_calls]
    results = [m.tool_call_id for m in messages if m.role == "tool"]
    return sorted(calls) == sorted(results)


@pytest.mark.parametrize("keep_last_n", range(0, 9))
def test_compaction_never_splits_tool_call_and_tool_result(tmp_path, keep_last_n):
    two_calls = {
        "tool_calls": [
            {"name": "calculate", "arguments": {"expression": "1+2"}},
            {"name": "calculate", "arguments": {"expression": "3+4"}},
        ]
    }
    turns = [two_calls, calc(1), two_calls, {**two_calls, "usage": {"input_tokens": 1000}}, "done"]
    spans = []
    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 256, "keep_last_n": keep_last_n})
    provider = ScriptedProvider(turns, [S1])
    rt, run = start(tmp_path, spec, provider, callbacks=[spans.append])
    assert send(rt, run, "task").status == "done"
    (span,) = spans
    assert _pairs_are_whole(span.messages)
    after = run.context[:-1]  # before the final answer
    assert _pairs_are_whole(after)
    tail = [m for m in after if m.role in ("assistant", "tool")]
    assert len(tail) >= keep_last_n  # the cut only ever moves earlier
    assert not tail or tail[0].role == "assistant"


# ---------------------------------------------------------------- auto


def mode_of(tmp_path, script: str, context: dict, interactive: bool = False, **fields) -> tuple[str, str]:
    write(tmp_path, "s.yaml", script)
    body = {"model": "scripted/s.yaml", **fields, "context": context}
    agents = load_agents(write(tmp_path, "agents.yaml", json.dumps({"agents": {"a": body}})))
    rt = runtime(tmp_path)
    run = rt.start("a", agents=agents, interactive=interactive)
    started = rt.store.events(run.run_id)[0].data
    assert started["requested_mode"] == context.get("mode", "append")
    assert run.mode.name == started["mode"]
    return started["mode"], rt.store.get_run(run.run_id).mode


LOCAL = "turns: [{text: hi}]\n"
FRONTIER = "local: false\nturns: [{text: hi}]\n"


def test_auto_is_recap_on_a_local_model(tmp_path):
    assert mode_of(tmp_path, LOCAL, {"mode": "auto", "state_schema": SCHEMA}) == ("recap", "recap")


def test_auto_is_stateful_on_a_frontier_model_with_a_schema(tmp_path):
    assert mode_of(tmp_path, FRONTIER, {"mode": "auto", "state_schema": SCHEMA}) == ("stateful", "stateful")


def test_auto_on_a_frontier_model_without_a_schema_is_compaction(tmp_path):
    assert mode_of(tmp_path, FRONTIER, {"mode": "auto"}) == ("compaction", "compaction")


def test_declared_capabilities_decide_local_or_frontier(tmp_path):
    ctx = {"mode": "auto", "state_schema": SCHEMA}
    assert mode_of(tmp_path, LOCAL, ctx, capabilities={"local": False}) == ("stateful", "stateful")
    assert mode_of(tmp_path, FRONTIER, ctx, capabilities={"local": True}) == ("recap", "recap")


def test_an_interactive_run_never_resolves_auto_to_stateful(tmp_path):
    assert mode_of(tmp_path, FRONTIER, {"mode": "auto", "state_schema": SCHEMA}, interactive=True) == ("recap", "recap")


@pytest.mark.parametrize("mode", ["append", "compaction", "stateful"])
def test_an_explicit_mode_always_wins(tmp_path, mode):
    assert mode_of(tmp_path, LOCAL, {"mode": mode, "state_schema": SCHEMA}, interactive=True) == (mode, mode)


def test_a_mode_given_at_start_wins_over_the_definition(tmp_path):
    write(tmp_path, "s.yaml", LOCAL)
    agents = load_agents(
        write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml, context: {mode: auto}}\n")
    )
    rt = runtime(tmp_path)
    run = rt.start("a", agents=agents, mode="compaction")
    assert rt.store.get_run(run.run_id).mode == "compaction"
    assert rt.store.events(run.run_id)[0].data["requested_mode"] == "compaction"
    assert agents.agents["a"].context.mode == "auto"


def test_the_resolved_mode_is_reported_in_the_result(tmp_path):
    write(tmp_path, "s.yaml", LOCAL)
    agents = load_agents(
        write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml, context: {mode: auto}}\n")
    )
    result = runtime(tmp_path).run_sync("a", "hi", agents=agents)
    assert (result.mode, result.to_json()["mode"]) == ("recap", "recap")


# ---------------------------------------------------------------- pressure


@tool("blob", "Return n words.", {"type": "object", "properties": {"n": {"type": "integer"}}})
def _blob(n: int) -> str:
    return " ".join(f"word{i}" for i in range(n))


def pressure_run(tmp_path, turns):
    # message_max_tokens: the blob must reach the context whole for the estimate to be what grows
    context = {"mode": "compaction", "budget_tokens": 1000, "keep_last_n": 2, "message_max_tokens": 1000}
    spec = agent(tmp_path, context, tools=["calculate", "blob"])
    provider = ScriptedProvider(
        turns, ["the assistant used calculate on each expression; the blob tool returned word0 word1"]
    )
    rt, run = start(tmp_path, spec, provider, tools=[_blob])
    assert send(rt, run, "task").status == "done"
    return rt, run


def test_reported_usage_triggers_a_distillation_although_the_estimate_is_small(tmp_path):
    rt, run = pressure_run(tmp_path, [calc(1), calc(2), calc(3, usage=800), "done"])
    (d,) = distillations(rt, run.run_id)
    assert d["pressure"] == 800 and d["tokens_before"] < 200 and d["budget"] == 1000
    # the same run without the report stays under budget
    rt2, run2 = pressure_run(tmp_path / "control", [calc(1), calc(2), calc(3), "done"])
    assert distillations(rt2, run2.run_id) == []


def test_reported_usage_just_under_the_threshold_does_not_distil(tmp_path):
    rt, run = pressure_run(tmp_path, [calc(1), calc(2), calc(3, usage=799), "done"])
    assert distillations(rt, run.run_id) == []


def test_the_estimate_triggers_a_distillation_although_reported_usage_is_small(tmp_path):
    small = {"input_tokens": 5}
    turns = [{**tool_call("blob", n=450), "usage": small}, {**calc(1), "usage": small}, {**calc(2), "usage": small}]
    rt, run = pressure_run(tmp_path, [*turns, {"text": "done", "usage": small}])
    (d,) = distillations(rt, run.run_id)
    assert d["tokens_before"] >= 800 and d["pressure"] == d["tokens_before"]
    assert all(
        e.data["usage"]["input_tokens"] == 5
        for e in events(rt, run.run_id, "model_call")
        if e.data["purpose"] == "turn"
    )


def test_the_budget_is_capped_by_the_context_window(tmp_path):
    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 100_000, "keep_last_n": 2})
    provider = ScriptedProvider([calc(1), calc(2), calc(3, usage=900), "done"], [S1], context_window=1000)
    rt, run = start(tmp_path, spec, provider)
    send(rt, run, "task")
    (d,) = distillations(rt, run.run_id)
    assert d["budget"] == 1000


# ---------------------------------------------------------------- declined, callbacks


def test_a_distillation_that_is_not_smaller_is_declined_and_the_run_goes_on(tmp_path):
    huge = "the assistant used calculate on each expression " * 40
    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 256, "keep_last_n": 2})
    provider = ScriptedProvider([calc(1), calc(2), calc(3, usage=1000), calc(4), "done"], [huge])
    rt, run = start(tmp_path, spec, provider)
    result = send(rt, run, "task")
    assert (result.status, result.output, result.distillations) == ("done", "done", 0)
    declined = events(rt, run.run_id, "distillation_declined")
    assert declined[0].data["reason"] == "result not smaller"
    assert declined[0].data["tokens_after"] >= declined[0].data["tokens_before"]
    assert "distillation" not in kinds(rt, run.run_id)
    assert not any(m.synthetic for m in run.context)  # the context was left as it was
    # tried again only once the context had grown, not on every iteration
    summary_calls = [c for c in provider.calls if c.purpose == "summary"]
    assert len(summary_calls) == len(declined) <= 2


def test_a_paid_decline_is_not_retried_until_the_context_grows_by_5_percent_of_the_budget(tmp_path):
    huge = "the assistant used calculate on each expression " * 60
    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 4000, "keep_last_n": 1})
    turns = [calc(i, usage=3900) for i in range(1, 9)] + ["done"]
    provider = ScriptedProvider(turns, [huge])
    rt, run = start(tmp_path, spec, provider)
    assert send(rt, run, "task").status == "done"
    declined = [e for e in events(rt, run.run_id, "distillation_declined") if e.data["reason"] == "result not smaller"]
    summary_calls = [c for c in provider.calls if c.purpose == "summary"]
    # pressure stays over the threshold for 8 iterations; each calc exchange adds ~30 tokens,
    # so a retry needs ~7 of them (200 tokens): one paid attempt, maybe two, never eight
    assert 1 <= len(summary_calls) == len(declined) <= 2


def test_nothing_to_evict_is_declined_without_a_model_call(tmp_path):
    spec = agent(tmp_path, {"mode": "recap", "budget_tokens": 256, "keep_last_n": 6})
    provider = ScriptedProvider([calc(1, usage=1000), "done"], ["R"])
    rt, run = start(tmp_path, spec, provider)
    assert send(rt, run, "task").status == "done"
    (declined,) = events(rt, run.run_id, "distillation_declined")
    assert declined.data["reason"] == "nothing to evict"
    assert [c.purpose for c in provider.calls] == ["turn", "turn"]


def test_a_failing_callback_is_recorded_and_never_fails_the_run(tmp_path):
    received = []

    def broken(span):
        raise RuntimeError("index offline")

    async def good(span):
        received.append(span)

    spec = agent(tmp_path, {"mode": "recap", "budget_tokens": 256, "keep_last_n": 2})
    provider = ScriptedProvider([calc(1), calc(2), calc(3, usage=1000), "done"], [R1])
    rt, run = start(tmp_path, spec, provider, callbacks=[broken, good])
    result = send(rt, run, "task")
    assert (result.status, result.output) == ("done", "done")
    (err,) = events(rt, run.run_id, "callback_error")
    (dist,) = events(rt, run.run_id, "distillation")
    assert err.data == {
        "callback": "test_a_failing_callback_is_recorded_and_never_fails_the_run.<locals>.broken",
        "error": "RuntimeError: index offline",
        "distillation_seq": dist.seq,
    }
    (span,) = received  # the next callback still ran
    assert span.seqs == dist.data["span_seqs"] and span.distillation_seq == dist.seq
    assert (span.run_id, span.agent, span.mode) == (run.run_id, "a", "recap")


def test_a_declared_context_window_caps_the_budget_of_a_yaml_agent(tmp_path):
    script = "turns:\n" + "".join(
        f"  - {{tool_call: {{name: calculate, arguments: {{expression: '{i}'}}}}{', usage: {input_tokens: 450}' if i == 2 else ''}}}\n"
        for i in range(3)
    )
    write(
        tmp_path,
        "s.yaml",
        script + "  - {text: done}\nsummaries: ['S1: the assistant used calculate on each expression.']\n",
    )
    body = {
        "model": "scripted/s.yaml",
        "tools": ["calculate"],
        "capabilities": {"context_window": 512},
        "context": {"mode": "compaction", "budget_tokens": 8192, "keep_last_n": 2},
    }
    agents = load_agents(write(tmp_path, "agents.yaml", json.dumps({"agents": {"a": body}})))
    rt = runtime(tmp_path)
    result = rt.run_sync("a", "go", agents=agents)
    (d,) = distillations(rt, result.run_id)
    assert (d["budget"], d["pressure"]) == (512, 450)


def test_the_last_scripted_summary_repeats(tmp_path):
    turns = [calc(1), calc(2), calc(3, usage=1000), calc(4), calc(5, usage=1000), calc(6), calc(7, usage=1000), "done"]
    rt, run, provider, result = recap_run(tmp_path, turns, summaries=[R1, R2])
    assert [d["summary"] for d in distillations(rt, run.run_id)] == [R1, f"{R1}\n{R2}", f"{R1}\n{R2}\n{R2}"]


def test_an_async_callback_that_raises_is_recorded_too(tmp_path):
    async def broken(span):
        raise ValueError("bank full")

    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 256, "keep_last_n": 2})
    provider = ScriptedProvider([calc(1), calc(2), calc(3, usage=1000), "done"], [S1])
    rt, run = start(tmp_path, spec, provider, callbacks=[broken])
    assert send(rt, run, "task").status == "done"
    (err,) = events(rt, run.run_id, "callback_error")
    assert err.data["error"] == "ValueError: bank full"


@pytest.mark.parametrize(
    "local,interactive,expected", [(False, False, "stateful"), (True, False, "recap"), (False, True, "recap")]
)
def test_auto_follows_the_capabilities_of_the_provider_that_resolved(tmp_path, local, interactive, expected):
    from loomrt.testing import FunctionProvider

    spec = agent(tmp_path, {"mode": "auto", "state_schema": SCHEMA})
    rt = runtime(tmp_path, FunctionProvider(lambda request: "hi", local=local))
    run = rt.start(spec, name="a", interactive=interactive)
    started = rt.store.events(run.run_id)[0].data
    assert (run.mode.name, started["mode"], started["local"]) == (expected, expected, local)


def test_a_stateful_agent_from_yaml_and_a_script_file(tmp_path):
    write(
        tmp_path,
        "scripts/triage.yaml",
        """
        local: false
        turns:
          - emit_state: {reasoning: look, patch: {step: 1}, action: {tool: calculate, arguments: {expression: "6*7"}}}
          - emit_state: {reasoning: note, patch: {step: 2, found: ["42"]}, done: false}
          - emit_state: {reasoning: done, patch: {}, done: true, final: "the answer is 42"}
        """,
    )
    write(
        tmp_path,
        "agents.yaml",
        f"""
        agents:
          triage:
            model: scripted/scripts/triage.yaml
            system_prompt: Triage.
            tools: [calculate]
            context:
              mode: auto
              state_schema: {json.dumps(SCHEMA)}
        """,
    )
    agents = load_agents(tmp_path / "agents.yaml")
    rt = runtime(tmp_path)
    result = rt.run_sync("triage", "what is 6*7?", agents=agents)
    assert (result.mode, result.status, result.output) == ("stateful", "done", "the answer is 42")
    assert result.state == {"step": 2, "found": ["42"]} and result.distillations == 2
    assert [e.data["content"] for e in events(rt, result.run_id, "tool_result")][0] == "42"


class _Overcounting:
    """A provider whose tokenizer counts ``factor`` times the runtime's estimate of a prompt."""

    def __init__(self, inner, factor: float):
        self.inner, self.factor = inner, factor
        self.model, self.capabilities = inner.model, inner.capabilities

    async def complete(self, request):
        import dataclasses

        from loomrt.providers.base import Usage
        from loomrt.tokens import count_dicts, count_tools

        response = await self.inner.complete(request)
        counted = int((count_dicts(request.messages) + count_tools(request.tools)) * self.factor)
        return dataclasses.replace(response, usage=Usage(counted, response.usage.output_tokens, 0))


@pytest.mark.parametrize(("factor", "n", "distils"), [(1.25, 280, True), (1.0, 280, False)])
def test_the_estimate_is_scaled_by_how_far_the_provider_counted_past_it(tmp_path, factor, n, distils):
    """A tool result takes the estimate to ~70% of the budget; a provider that counts 25% more
    than the estimate sees ~85%, over the 80% threshold, and the run tries to distil before
    that call rather than after it (the last report, of a small prompt, was far under)."""
    context = {"mode": "compaction", "budget_tokens": 1000, "keep_last_n": 2, "message_max_tokens": 1000}
    spec = agent(tmp_path, context, tools=["calculate", "blob"])
    inner = ScriptedProvider([tool_call("blob", n=n), calc(1), "done"], ["the blob tool returned word0 word1"])
    rt, run = start(tmp_path, spec, _Overcounting(inner, factor), tools=[_blob])
    assert send(rt, run, "task").status == "done"
    calls = [e for e in events(rt, run.run_id, "model_call") if e.data["purpose"] == "turn"]
    assert calls[0].data["usage"]["input_tokens"] < 800  # the last report before the blob's call was far under
    tried = [e for e in rt.store.events(run.run_id) if e.kind in ("distillation", "distillation_declined")]
    before_second = [e for e in tried if e.seq < calls[1].seq]  # (nothing to evict yet: declined, but tried)
    assert bool(before_second) is distils
    if distils:
        d = before_second[0].data
        assert d["pressure"] >= 800 > d["tokens_before"] >= 600  # the estimate alone was under the threshold
    else:
        assert 600 <= calls[1].data["estimated_tokens"] < 800
