"""Retention modes: what each boundary keeps and evicts, when it fires (pressure from the
estimate and from reported usage), declined distillations, evicted-span callbacks, auto
resolution, and stateful mode's merge-patch, validation, retry and fail."""

from __future__ import annotations

import json

import pytest
from spine_kit import events, kinds, runtime, send, shape, tool_call, write

from loomrt import load_agents, tool
from loomrt.run.reducers.stateful import merge_patch
from loomrt.testing import ScriptedProvider

SCHEMA = {
    "type": "object",
    "properties": {
        "step": {"type": "integer"},
        "notes": {"type": "object"},
        "found": {"type": "array", "items": {"type": "string"}, "default": []},
    },
    "required": ["step"],
}


def agent(tmp_path, context=None, **fields):
    """One agent 'a', written to agents.yaml and loaded from there."""
    body = {"model": "scripted/unused.yaml", "system_prompt": "You are careful.", "tools": ["calculate"], **fields}
    if context is not None:
        body["context"] = context
    path = write(tmp_path, "agents.yaml", json.dumps({"agents": {"a": body}}))
    return load_agents(path).agents["a"]


def calc(n: int, usage: int | None = None) -> dict:
    return tool_call("calculate", usage=usage, expression=f"{n}+{n}")


def emit(patch, **kw) -> dict:
    return {"emit_state": {"reasoning": "thinking", "patch": patch, **kw}}


def start(tmp_path, spec, provider, **kw):
    rt = runtime(tmp_path, provider, **kw)
    return rt, rt.start(spec, name="a")


def distillations(rt, run_id):
    return [e.data for e in events(rt, run_id, "distillation")]


def request_contents(request) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in request.messages]


def turn_requests(provider):
    return [c for c in provider.calls if c.purpose == "turn"]


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
    provider = ScriptedProvider([calc(1), calc(2), calc(3, usage=499), calc(4, usage=500), "done"], ["S1"])
    rt, run = start(tmp_path, spec, provider)
    assert send(rt, run, "add numbers").status == "done"
    (d,) = distillations(rt, run.run_id)
    assert d["mode"] == "append" and d["summary"] == "S1" and d["pressure"] == 500
    assert shape(run) == ["system", "user*", "summary", "assistant", "tool", "assistant"]


# ---------------------------------------------------------------- recap


def recap_run(tmp_path, turns, summaries=("R1", "R2"), **ctx):
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
    assert d["summary"] == "R1" and d["tokens_after"] < d["tokens_before"] and d["pressure"] == 1000
    # what the model was sent right after the boundary
    after = turn_requests(provider)[3]
    assert [r for r, _ in request_contents(after)] == ["system", "user", "user", "assistant", "tool"]
    assert after.messages[0]["content"].startswith("You are careful.")
    assert after.messages[1]["content"] == "the task: add numbers"
    assert after.messages[2]["content"].endswith("\nR1") and after.messages[2]["content"].startswith("Recap of my work")
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
    assert "At most 2000 characters" in recap_call.messages[0]["content"]


def test_the_previous_recap_folds_into_the_next(tmp_path):
    turns = [calc(1), calc(2), calc(3, usage=1000), calc(4), calc(5), calc(6, usage=1000), "done"]
    rt, run, provider, result = recap_run(tmp_path, turns)
    assert result.distillations == 2
    second = [c for c in provider.calls if c.purpose == "recap"][1].messages[1]["content"]
    assert "Your earlier account (fold it into the new one):" in second and "\nR1" in second
    recaps = [m for m in run.context if m.synthetic == "recap"]
    assert len(recaps) == 1 and recaps[0].content.endswith("\nR2")
    assert shape(run) == ["system", "user*", "recap", "assistant", "tool", "assistant"]


def test_a_recap_longer_than_recap_max_chars_is_cut(tmp_path):
    long = "x" * 500
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
    provider = ScriptedProvider([calc(1), calc(2), calc(3), calc(4, usage=1000), "done"], ["S1"])
    rt, run = start(tmp_path, spec, provider)
    assert send(rt, run, "task").status == "done"
    (d,) = distillations(rt, run.run_id)
    assert d["mode"] == "compaction" and d["summary"] == "S1"
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
    provider = ScriptedProvider(turns, ["S1"])
    rt, run = start(tmp_path, spec, provider, callbacks=[spans.append])
    assert send(rt, run, "task").status == "done"
    (span,) = spans
    assert _pairs_are_whole(span.messages)
    after = run.context[:-1]  # before the final answer
    assert _pairs_are_whole(after)
    tail = [m for m in after if m.role in ("assistant", "tool")]
    assert len(tail) >= keep_last_n  # the cut only ever moves earlier
    assert not tail or tail[0].role == "assistant"


# ---------------------------------------------------------------- stateful


def stateful_run(tmp_path, turns, prompt="triage", **ctx):
    context = {"mode": "stateful", "state_schema": SCHEMA, **ctx}
    provider = ScriptedProvider(turns)
    rt, run = start(tmp_path, agent(tmp_path, context), provider)
    return rt, run, provider, send(rt, run, prompt)


def test_stateful_offers_only_emit_state_and_states_the_schema(tmp_path):
    rt, run, provider, result = stateful_run(tmp_path, [emit({"step": 1}, done=True, final="ok")])
    assert result.output == "ok"
    request = provider.calls[0]
    assert [t.name for t in request.tools] == ["emit_state"] and request.tool_choice == "required"
    params = request.tools[0].parameters
    assert params["properties"]["action"]["properties"]["tool"]["enum"] == ["calculate"]
    assert params["required"] == ["reasoning", "patch"]
    system = request.messages[0]["content"]
    assert json.dumps(SCHEMA) in system and 'The state starts as: {"found": []}' in system


def test_stateful_boundary_keeps_system_task_sigma_and_the_last_observation_only(tmp_path):
    turns = [
        emit({"step": 1, "found": ["a"]}, action={"tool": "calculate", "arguments": {"expression": "20+22"}}),
        emit({"step": 2}),
        emit({"step": 3}, done=True, final="finished"),
    ]
    rt, run, provider, result = stateful_run(tmp_path, turns)
    assert (result.status, result.output) == ("done", "finished")
    assert result.state == {"step": 3, "found": ["a"]}
    second, third = provider.calls[1], provider.calls[2]
    assert request_contents(second) == [
        ("system", provider.calls[0].messages[0]["content"]),
        ("user", "triage"),
        ("user", 'Your state Σ:\n{"found": ["a"], "step": 1}'),
        ("user", "Last observation (calculate):\n42"),
    ]
    assert request_contents(third)[2:] == [
        ("user", 'Your state Σ:\n{"found": ["a"], "step": 2}'),
        ("user", "Last observation (emit_state):\nState accepted."),
    ]
    ds = distillations(rt, run.run_id)
    assert [d["state"] for d in ds] == [{"found": ["a"], "step": 1}, {"found": ["a"], "step": 2}]
    assert all(d["mode"] == "stateful" for d in ds)


def test_interactive_stateful_keeps_the_turn_in_progress_input_until_the_turn_ends(tmp_path):
    context = {"mode": "stateful", "state_schema": SCHEMA}
    provider = ScriptedProvider([
        emit({"step": 1}, done=True, final="first done"),
        emit({"step": 2}, action={"tool": "calculate", "arguments": {"expression": "1+1"}}),
        emit({"step": 3}, done=True, final="second done"),
    ])
    rt = runtime(tmp_path, provider)
    run = rt.start(agent(tmp_path, context), name="a", interactive=True)
    send(rt, run, "first task")
    assert send(rt, run, "now the second question").output == "second done"
    third = request_contents(provider.calls[2])
    assert ("user", "first task") in third  # the pinned task
    assert third[-2:] == [("user", "now the second question"), ("user", "Last observation (calculate):\n2")]


def test_merge_patch_through_a_run_deletes_with_null_and_merges_nested_objects(tmp_path):
    turns = [
        emit({"step": 1, "notes": {"db": {"host": "h", "port": 5432}, "owner": "ann"}}),
        emit({"notes": {"db": {"port": 6543, "host": None}, "owner": None, "tag": "x"}}),
        emit({"found": ["k"]}, done=True),
    ]
    rt, run, provider, result = stateful_run(tmp_path, turns)
    assert result.state == {"step": 1, "notes": {"db": {"port": 6543}, "tag": "x"}, "found": ["k"]}
    assert json.loads(result.output) == result.state  # no final: the state is the answer
    updates = [e.data for e in events(rt, run.run_id, "state_update")]
    assert updates[1]["patch"] == {"notes": {"db": {"port": 6543, "host": None}, "owner": None, "tag": "x"}}


def test_an_invalid_patch_is_shown_back_with_the_error_then_the_run_goes_on(tmp_path):
    turns = [emit({"step": "one"}), emit({"step": 1}, done=True, final="ok")]
    rt, run, provider, result = stateful_run(tmp_path, turns)
    assert (result.status, result.output) == ("done", "ok")
    (rejected,) = events(rt, run.run_id, "patch_rejected")
    assert rejected.data["attempt"] == 1 and rejected.data["patch"] == {"step": "one"}
    assert "at step: 'one' is not of type 'integer'" in rejected.data["error"]
    shown = provider.calls[1].messages[-1]["content"]
    assert "Rejected: the patched state is invalid: at step: 'one' is not of type 'integer'" in shown
    assert "Call emit_state again" in shown
    assert result.state == {"step": 1, "found": []}


def test_required_is_part_of_validation(tmp_path):
    turns = [emit({"notes": {"a": 1}}), emit({"step": 1, "notes": {"a": 1}}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns)
    (rejected,) = events(rt, run.run_id, "patch_rejected")
    assert "'step' is a required property" in rejected.data["error"]
    assert result.status == "done" and result.state["step"] == 1


def test_on_invalid_patch_fail_fails_at_once(tmp_path):
    turns = [emit({"step": "one"}), emit({"step": 1}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns, on_invalid_patch="fail")
    assert result.status == "failed" and len(provider.calls) == 1
    assert "stateful mode: the patched state is invalid: at step: 'one' is not of type 'integer'" in result.error
    assert "on_invalid_patch=fail" in result.error
    error = events(rt, run.run_id, "error")[0].data
    assert error["type"] == "StateError" and error["message"] == result.error
    assert kinds(rt, run.run_id)[-2:] == ["patch_rejected", "error"]


def test_retries_exhausted_fail_the_run_cleanly(tmp_path):
    turns = [emit({"step": "a"}), emit({"step": "b"}), emit({"step": "c"}), emit({"step": 1}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns, max_patch_retries=2)
    assert result.status == "failed" and len(provider.calls) == 3
    assert "after 3 attempt(s); on_invalid_patch=retry, max_patch_retries=2" in result.error
    assert "raise max_patch_retries" in result.error
    assert [e.data["attempt"] for e in events(rt, run.run_id, "patch_rejected")] == [1, 2, 3]
    assert rt.store.get_run(run.run_id).status == "failed"


def test_a_valid_patch_resets_the_retry_count(tmp_path):
    turns = [emit({"step": "a"}), emit({"step": 1}), emit({"step": "b"}), emit({"step": 2}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns, max_patch_retries=1)
    assert result.status == "done" and result.state["step"] == 2


def test_a_reply_without_emit_state_is_asked_again(tmp_path):
    rt, run, provider, result = stateful_run(tmp_path, ["I think it is done.", emit({"step": 1}, done=True)])
    assert result.status == "done"
    (rejected,) = events(rt, run.run_id, "patch_rejected")
    assert "you must act by calling emit_state" in rejected.data["error"]
    assert "you must act by calling emit_state" in provider.calls[1].messages[-1]["content"]


def test_a_patch_that_is_not_an_object_is_rejected(tmp_path):
    rt, run, provider, result = stateful_run(tmp_path, [emit([1, 2]), emit({"step": 1}, done=True)])
    assert "patch must be a JSON object, got list" in events(rt, run.run_id, "patch_rejected")[0].data["error"]
    assert result.status == "done"


def test_propose_schema_is_recorded_and_never_applied(tmp_path):
    proposal = {"type": "object", "properties": {"step": {"type": "string"}}}
    turns = [emit({"step": 1}, propose_schema=proposal), emit({"step": "two"}), emit({"step": 2}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns, propose_schema=True)
    (proposed,) = events(rt, run.run_id, "schema_proposed")
    assert "propose_schema" in provider.calls[0].tools[0].parameters["properties"]
    assert proposed.data["schema"] == proposal
    # the original schema still rules: a string step is rejected
    assert "'two' is not of type 'integer'" in events(rt, run.run_id, "patch_rejected")[0].data["error"]
    assert run.spec.context.state_schema == SCHEMA
    assert json.dumps(SCHEMA) in provider.calls[-1].messages[0]["content"]
    assert result.status == "done"


def test_propose_schema_is_not_offered_unless_the_definition_opts_in(tmp_path):
    proposal = {"type": "object"}
    rt, run, provider, result = stateful_run(tmp_path, [emit({"step": 1}, propose_schema=proposal, done=True)])
    assert "propose_schema" not in provider.calls[0].tools[0].parameters["properties"]
    assert events(rt, run.run_id, "schema_proposed") == [] and result.status == "done"


def test_an_action_on_a_tool_outside_the_allowlist_is_an_error_observation(tmp_path):
    turns = [emit({"step": 1}, action={"tool": "read_file", "arguments": {"path": "/etc/passwd"}}), emit({}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns)
    assert result.status == "done"
    assert (
        "Last observation (read_file):\nError: no tool named 'read_file'. Available: calculate."
        in (provider.calls[1].messages[-1]["content"])
    )


@pytest.mark.parametrize(
    "target,patch,expected",
    [  # RFC 7386, appendix A
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_follows_rfc_7386(target, patch, expected):
    before = json.dumps(target)
    assert merge_patch(target, patch) == expected
    assert json.dumps(target) == before  # the target is untouched


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
    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 1000, "keep_last_n": 2}, tools=["calculate", "blob"])
    provider = ScriptedProvider(turns, ["S"])
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
    provider = ScriptedProvider([calc(1), calc(2), calc(3, usage=900), "done"], ["S"], context_window=1000)
    rt, run = start(tmp_path, spec, provider)
    send(rt, run, "task")
    (d,) = distillations(rt, run.run_id)
    assert d["budget"] == 1000


# ---------------------------------------------------------------- declined, callbacks


def test_a_distillation_that_is_not_smaller_is_declined_and_the_run_goes_on(tmp_path):
    huge = "long summary " * 200
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
    huge = "long summary " * 300
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
    provider = ScriptedProvider([calc(1), calc(2), calc(3, usage=1000), "done"], ["R1"])
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
    write(tmp_path, "s.yaml", script + "  - {text: done}\nsummaries: [S]\n")
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
    rt, run, provider, result = recap_run(tmp_path, turns, summaries=["R1", "R2"])
    assert [d["summary"] for d in distillations(rt, run.run_id)] == ["R1", "R2", "R2"]


def test_an_async_callback_that_raises_is_recorded_too(tmp_path):
    async def broken(span):
        raise ValueError("bank full")

    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 256, "keep_last_n": 2})
    provider = ScriptedProvider([calc(1), calc(2), calc(3, usage=1000), "done"], ["S"])
    rt, run = start(tmp_path, spec, provider, callbacks=[broken])
    assert send(rt, run, "task").status == "done"
    (err,) = events(rt, run.run_id, "callback_error")
    assert err.data["error"] == "ValueError: bank full"


def test_before_any_valid_patch_sigma_is_the_initial_state_from_the_schema_defaults(tmp_path):
    rt, run, provider, result = stateful_run(tmp_path, [emit({"step": "bad"}), emit({"step": 1}, done=True)])
    assert result.status == "done"
    sigma = provider.calls[1].messages[2]["content"]
    assert sigma == 'Your state Σ:\n{"found": []}'
    (d,) = distillations(rt, run.run_id)
    assert d["state"] == {"found": []}


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
