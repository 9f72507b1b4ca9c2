"""The runtime: the deep clone, the loop's stops and errors, tools, streaming, interactive
runs, and runs rebuilt from the record (open, resume, continue)."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
from modes_kit import S1, S2
from spine_kit import context_dicts, events, kinds, runtime, send, shape, tool_call, write

from loomrt import AgentSpec, ProviderError, ToolCall, load_agents, tool
from loomrt.providers.base import ModelResponse
from loomrt.spec import definition_hash
from loomrt.testing import FunctionProvider, ScriptedProvider

SCHEMA = {
    "type": "object",
    "properties": {"step": {"type": "integer"}, "db": {"type": "object", "properties": {"port": {"type": "integer"}}}},
    "required": ["step"],
}


def agents_file(tmp_path, script: str | None = None, **context):
    """agents.yaml with one agent 'a' on scripted/s.yaml (written from ``script`` when given)."""
    if script is not None:
        write(tmp_path, "s.yaml", script)
    body = {"model": "scripted/s.yaml", "system_prompt": "You are careful.", "tools": ["calculate"]}
    if context:
        body["context"] = context
    return load_agents(write(tmp_path, "agents.yaml", json.dumps({"agents": {"a": body}})))


def calc(n: int, usage: int | None = None) -> dict:
    return tool_call("calculate", usage=usage, expression=f"{n}+{n}")


def emit(patch, **kw) -> dict:
    return {"emit_state": {"reasoning": "r", "patch": patch, **kw}}


# ---------------------------------------------------------------- the deep clone


def test_a_run_with_overrides_leaves_the_shared_definition_untouched(tmp_path):
    agents = agents_file(tmp_path, mode="stateful", state_schema=SCHEMA, keep_last_n=4)
    shared = agents.agents["a"]
    before = copy.deepcopy(shared.model_dump())
    before_hash = definition_hash(shared)
    override_schema = {"type": "object", "properties": {"step": {"type": "integer", "minimum": 0}}}
    overrides = {"max_iterations": 5, "context": {"keep_last_n": 1, "state_schema": override_schema}}
    provider = ScriptedProvider([emit({"step": 1}), emit({"step": 2}, done=True)])
    rt = runtime(tmp_path, provider)
    run = rt.start("a", agents=agents, overrides=overrides)
    assert send(rt, run, "go").status == "done"

    assert shared.model_dump() == before and definition_hash(shared) == before_hash
    assert (run.spec.max_iterations, run.spec.context.keep_last_n) == (5, 1)
    assert run.spec.context.state_schema == override_schema
    # nothing nested is shared: not with the definition, not with the caller's overrides
    assert run.spec.context.state_schema["properties"] is not override_schema["properties"]
    run.spec.context.state_schema["properties"]["step"]["minimum"] = 99
    assert override_schema["properties"]["step"]["minimum"] == 0
    assert overrides == {"max_iterations": 5, "context": {"keep_last_n": 1, "state_schema": override_schema}}
    started = rt.store.events(run.run_id)[0].data
    assert started["definition"]["context"]["keep_last_n"] == 1 and started["def_hash"] != before_hash


def test_two_runs_of_one_definition_do_not_share_state(tmp_path):
    agents = agents_file(tmp_path, mode="stateful", state_schema=SCHEMA)
    rt = runtime(tmp_path, ScriptedProvider([emit({"step": 1, "db": {"port": 1}}, done=True)] * 2))
    first = rt.start("a", agents=agents)
    second = rt.start("a", agents=agents)
    assert first.spec is not second.spec
    assert first.spec.context.state_schema is not second.spec.context.state_schema
    assert send(rt, first, "go").state == {"step": 1, "db": {"port": 1}}
    assert second.state is None
    assert agents.agents["a"].context.state_schema == SCHEMA


# ---------------------------------------------------------------- the loop's stops and errors


def test_max_iterations_fails_the_run_with_a_clear_message(tmp_path):
    write(tmp_path, "s.yaml", "turns:\n" + "  - tool_call: {name: calculate, arguments: {expression: '1+1'}}\n" * 5)
    agents = load_agents(
        write(
            tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml, tools: [calculate], max_iterations: 3}\n"
        )
    )
    rt = runtime(tmp_path)
    result = rt.run_sync("a", "loop", agents=agents)
    assert result.status == "failed" and result.model_calls == 3
    assert "reached max_iterations (3) without a final answer. Raise max_iterations" in result.error
    assert result.error.startswith(f"run {result.run_id} (after event #")
    (error,) = events(rt, result.run_id, "error")
    assert error.data["type"] == "RunError"
    assert rt.store.get_run(result.run_id).status == "failed"


def test_an_unknown_tool_is_an_error_result_shown_to_the_model(tmp_path):
    provider = ScriptedProvider([tool_call("shell", cmd="rm -rf /"), "sorry"])
    rt = runtime(tmp_path, provider)
    result = rt.run_sync("a", "go", agents=agents_file(tmp_path))
    assert (result.status, result.output) == ("done", "sorry")
    (res,) = events(rt, result.run_id, "tool_result")
    assert res.data["is_error"] is True
    assert res.data["content"] == "Error: no tool named 'shell'. Available: calculate."
    assert provider.calls[1].messages[-1] == {
        "role": "tool",
        "content": "Error: no tool named 'shell'. Available: calculate.",
        "tool_call_id": "call_1_0",
        "name": "shell",
    }


@tool("flaky", "Always fails.", {"type": "object", "properties": {}})
def _flaky() -> str:
    raise ValueError("the disk is on fire")


@tool("lookup", "Return a dict.", {"type": "object", "properties": {"key": {"type": "string"}}})
async def _lookup(key: str) -> dict:
    await asyncio.sleep(0)
    return {"key": key, "value": [1, 2]}


def test_a_tool_that_raises_is_an_error_result_and_the_run_goes_on(tmp_path):
    write(tmp_path, "s.yaml", "turns: []\n")
    agents = load_agents(
        write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml, tools: [flaky, calculate, lookup]}\n")
    )
    turns = [
        tool_call("flaky"),
        tool_call("calculate", expression="import os"),
        tool_call("calculate", wrong_argument="1"),
        tool_call("lookup", key="k"),
        "done",
    ]
    rt = runtime(tmp_path, ScriptedProvider(turns), tools=[_flaky, _lookup])
    result = rt.run_sync("a", "go", agents=agents)
    assert result.status == "done"
    results = [(e.data["is_error"], e.data["content"]) for e in events(rt, result.run_id, "tool_result")]
    assert results[0] == (True, "Error: ValueError: the disk is on fire")
    assert results[1][0] is True and results[1][1].startswith("Error: ")
    assert results[2][0] is True and "TypeError" in results[2][1] and "wrong_argument" in results[2][1]
    assert results[3] == (False, '{"key": "k", "value": [1, 2]}')


def test_a_script_that_runs_out_names_the_script(tmp_path):
    agents = agents_file(tmp_path, "turns: [{tool_call: {name: calculate, arguments: {expression: '1+1'}}}]\n")
    rt = runtime(tmp_path)
    result = rt.run_sync("a", "go", agents=agents)
    assert result.status == "failed"
    script = tmp_path / "s.yaml"
    assert f"the script {script} has 1 turns and the run asked for turn 2" in result.error
    assert "Add turns to the script, or lower max_iterations" in result.error
    assert events(rt, result.run_id, "error")[0].data["type"] == "ScriptExhaustedError"


def test_a_summary_asked_of_a_script_without_summaries_is_a_clear_error(tmp_path):
    script = "turns:\n" + "".join(
        f"  - {{tool_call: {{name: calculate, arguments: {{expression: '{i}'}}}}, usage: {{input_tokens: 9000}}}}\n"
        for i in range(4)
    )
    agents = agents_file(tmp_path, script, mode="recap", budget_tokens=256, keep_last_n=1)
    result = runtime(tmp_path).run_sync("a", "go", agents=agents)
    assert result.status == "failed"
    assert "has no summaries, and a recap was asked for. Add a 'summaries:' list" in result.error


def test_a_permanent_provider_error_fails_the_run(tmp_path):
    def fn(request):
        raise ProviderError("401 invalid api key", status=401)

    rt = runtime(tmp_path, FunctionProvider(fn))
    result = rt.run_sync("a", "go", agents=agents_file(tmp_path))
    assert result.status == "failed" and "401 invalid api key" in result.error
    assert kinds(rt, result.run_id)[-1] == "error"


def test_an_unexpected_exception_ends_the_run_with_a_clear_error_not_a_traceback(tmp_path):
    def fn(request):
        raise KeyError("bug in a provider")

    rt = runtime(tmp_path, FunctionProvider(fn))
    run = rt.start("a", agents=agents_file(tmp_path))
    result = send(rt, run, "go")  # nothing escapes Runtime.send
    assert result.status == "failed" and "KeyError" in result.error and "bug in a provider" in result.error
    assert f"run {run.run_id}" in result.error
    (error,) = events(rt, run.run_id, "error")
    assert error.data["type"] == "KeyError" and "bug in a provider" in error.data["message"]
    assert rt.store.get_run(run.run_id).status == "failed"


def test_a_tool_bug_is_a_tool_error_and_a_failed_interactive_turn_parks_the_chat(tmp_path):
    calls = {"n": 0}

    def fn(request):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("provider bug")
        return "fine now"

    rt = runtime(tmp_path, FunctionProvider(fn))
    run = rt.start("a", agents=agents_file(tmp_path), interactive=True)
    first = send(rt, run, "one")
    assert first.status == "failed" and "provider bug" in first.error
    assert rt.store.get_run(run.run_id).status == "parked"  # the chat is not over
    second = send(rt, run, "two")
    assert (second.status, second.output) == ("parked", "fine now")


# ---------------------------------------------------------------- stream


def test_stream_yields_every_event_in_seq_order(tmp_path):
    provider = ScriptedProvider([calc(1), calc(2), calc(3), calc(4, usage=9000), "done"], [S1])
    rt = runtime(tmp_path, provider)
    agents = agents_file(tmp_path, mode="recap", budget_tokens=256, keep_last_n=1)

    async def collect():
        return [e async for e in rt.stream("a", "go", agents=agents)]

    streamed = asyncio.run(collect())
    run_id = streamed[0].run_id
    assert [e.seq for e in streamed] == list(range(1, len(streamed) + 1))
    assert streamed == rt.store.events(run_id)
    assert streamed[0].kind == "run_started" and streamed[-1].kind == "final"
    assert "distillation" in [e.kind for e in streamed]


def test_stream_of_a_failing_run_ends_with_the_error(tmp_path):
    rt = runtime(tmp_path, ScriptedProvider([]))

    async def collect():
        return [e.kind async for e in rt.stream("a", "go", agents=agents_file(tmp_path))]

    assert asyncio.run(collect())[-1] == "error"


# ---------------------------------------------------------------- interactive


def test_an_interactive_run_parks_and_continues_on_the_next_send(tmp_path):
    provider = ScriptedProvider(["hello", calc(1), "it is 2", "bye"])
    rt = runtime(tmp_path, provider)
    run = rt.start("a", agents=agents_file(tmp_path), interactive=True)
    first = send(rt, run, "hi")
    assert (first.status, first.output) == ("parked", "hello")
    assert kinds(rt, run.run_id)[-1] == "parked" and rt.store.get_run(run.run_id).status == "parked"
    second = send(rt, run, "what is 1+1?")
    assert (second.status, second.output) == ("parked", "it is 2")
    # the second turn saw the first
    assert [m["content"] for m in provider.calls[1].messages[1:4]] == ["hi", "hello", "what is 1+1?"]
    assert shape(run) == ["system", "user*", "assistant", "user", "assistant", "tool", "assistant"]
    done = rt.finish(run)
    assert (done.status, done.output) == ("done", "it is 2")
    assert rt.store.get_run(run.run_id).interactive is True


def test_an_interactive_run_continues_from_the_record_in_a_new_runtime(tmp_path):
    provider = ScriptedProvider(["hello", "second answer"])
    rt = runtime(tmp_path, provider)
    run = rt.start("a", agents=agents_file(tmp_path), interactive=True)
    send(rt, run, "hi")
    later = runtime(tmp_path, provider)
    assert asyncio.run(later.resume(run.run_id)).status == "parked"  # nothing to do: it waits for input
    result = asyncio.run(later.continue_run(run.run_id, "and then?"))
    assert (result.status, result.output) == ("parked", "second answer")
    assert [m["content"] for m in provider.calls[1].messages[1:]] == ["hi", "hello", "and then?"]


# ---------------------------------------------------------------- from the record


def _assert_rebuilt_equals_live(tmp_path, live, provider):
    rebuilt = runtime(tmp_path, provider).open(live.run_id)
    assert context_dicts(rebuilt) == context_dicts(live)
    assert rebuilt.state == live.state
    assert (rebuilt.usage, rebuilt.model_calls, rebuilt.distillations) == (
        live.usage,
        live.model_calls,
        live.distillations,
    )
    assert (rebuilt.output, rebuilt.last_seq, rebuilt.mode.name) == (live.output, live.last_seq, live.mode.name)
    assert rebuilt.reported_prompt_tokens == live.reported_prompt_tokens
    return rebuilt


@pytest.mark.parametrize(
    "context,turns",
    [
        ({}, [calc(1), calc(2), "done"]),
        ({"mode": "recap", "budget_tokens": 256, "keep_last_n": 2}, [calc(1), calc(2), calc(3, 900), calc(4), "done"]),
        (
            {"mode": "recap", "budget_tokens": 256, "keep_last_n": 2, "keep_first": False},
            [calc(1), calc(2), calc(3, 900), "done"],
        ),
        (
            {"mode": "compaction", "budget_tokens": 256, "keep_last_n": 3},
            [calc(1), calc(2), calc(3, 900), calc(4, 900), "done"],
        ),
        ({"mode": "append", "backstop": True, "budget_tokens": 256, "keep_last_n": 0}, [calc(1), calc(2, 900), "done"]),
        (
            {"mode": "stateful", "state_schema": SCHEMA},
            [
                emit({"step": 1}, action={"tool": "calculate", "arguments": {"expression": "2+2"}}),
                emit({"step": "x"}),
                emit({"db": {"port": 5}}),
                emit({"step": 2}, done=True),
            ],
        ),
        (
            {"mode": "stateful", "state_schema": SCHEMA},
            ["no emit", emit({"step": 1}), "again no emit", emit({}, done=True)],
        ),
    ],
    ids=["append", "recap", "recap-no-pin", "compaction", "backstop", "stateful", "stateful-feedback"],
)
def test_the_context_rebuilt_from_the_record_equals_the_live_one(tmp_path, context, turns):
    provider = ScriptedProvider(turns, [S1, S2])
    rt = runtime(tmp_path, provider)
    live = rt.start("a", agents=agents_file(tmp_path, **context))
    result = send(rt, live, "the task")
    assert result.status == "done"
    if context.get("budget_tokens"):
        assert result.distillations >= 1
    _assert_rebuilt_equals_live(tmp_path, live, provider)


def test_the_rebuilt_context_equals_the_live_one_at_every_model_call(tmp_path):
    provider = ScriptedProvider([calc(1), calc(2), calc(3, 900), calc(4), calc(5, 900), "done"], [S1, S2])
    rt = runtime(tmp_path, provider)
    live = rt.start("a", agents=agents_file(tmp_path, mode="compaction", budget_tokens=256, keep_last_n=2))
    checked = []

    def check(event):  # a turn's model_call is recorded once the context it was sent is complete
        if event.kind == "model_call" and event.data["purpose"] == "turn":
            rebuilt = runtime(tmp_path, provider).open(live.run_id)
            checked.append(context_dicts(rebuilt) == context_dicts(live))

    live.listeners.append(check)
    assert send(rt, live, "task").distillations == 2
    assert checked == [True] * 6
    _assert_rebuilt_equals_live(tmp_path, live, provider)


def test_a_run_that_failed_mid_turn_resumes_from_the_record_and_completes(tmp_path):
    calls = []

    def flaky(request):
        calls.append([m["content"] for m in request.messages])
        if len(calls) == 2:
            raise ProviderError("upstream 400: bad gateway config", status=400)
        if len(calls) == 1:
            return ModelResponse(tool_calls=(tool_call_obj(),))
        return "the answer is 4"

    rt = runtime(tmp_path, FunctionProvider(flaky))
    run = rt.start("a", agents=agents_file(tmp_path))
    failed = send(rt, run, "what is 2+2?")
    assert failed.status == "failed" and "upstream 400" in failed.error
    context_at_failure = context_dicts(run)

    later = runtime(tmp_path, FunctionProvider(flaky))  # a fresh process: only the record is shared
    result = asyncio.run(later.resume(run.run_id))
    assert (result.status, result.output) == ("done", "the answer is 4")
    assert calls[2] == calls[1]  # the model was sent exactly what it was sent when it failed
    assert context_dicts(later.open(run.run_id))[: len(context_at_failure)] == context_at_failure
    ks = kinds(later, run.run_id)
    assert ks[ks.index("error") :] == ["error", "resumed", "model_call", "assistant_message", "final"]
    assert later.store.get_run(run.run_id).status == "done"


def tool_call_obj():
    return ToolCall(id="c1", name="calculate", arguments={"expression": "2+2"})


def test_an_exhausted_script_resumes_once_the_script_has_more_turns(tmp_path):
    line = "  - {tool_call: {name: calculate, arguments: {expression: '%d'}}}\n"
    agents = agents_file(tmp_path, "turns:\n" + line % 1 + line % 2)
    rt = runtime(tmp_path)
    failed = rt.run_sync("a", "go", agents=agents)
    assert failed.status == "failed"
    write(tmp_path, "s.yaml", "turns:\n" + line % 1 + line % 2 + "  - {text: finished}\n")
    result = asyncio.run(runtime(tmp_path).resume(failed.run_id))
    assert (result.status, result.output, result.model_calls) == ("done", "finished", 3)


def test_resuming_a_finished_run_plays_nothing(tmp_path):
    provider = ScriptedProvider(["done"])
    rt = runtime(tmp_path, provider)
    result = rt.run_sync("a", "go", agents=agents_file(tmp_path))
    again = asyncio.run(runtime(tmp_path, provider).resume(result.run_id))
    assert (again.status, again.output) == ("done", "done") and len(provider.calls) == 1
    assert kinds(rt, result.run_id)[-1] == "final"


def test_continue_run_adds_a_turn_to_a_finished_run(tmp_path):
    provider = ScriptedProvider(["four", calc(3), "six"])
    rt = runtime(tmp_path, provider)
    first = rt.run_sync("a", "2+2?", agents=agents_file(tmp_path))
    result = asyncio.run(runtime(tmp_path, provider).continue_run(first.run_id, "and 3+3?"))
    assert (result.run_id, result.status, result.output, result.model_calls) == (first.run_id, "done", "six", 3)
    assert [m["content"] for m in provider.calls[1].messages[1:4]] == ["2+2?", "four", "and 3+3?"]
    assert provider.calls[1].messages[1]["content"] == "2+2?"
    ks = kinds(rt, first.run_id)
    assert ks.count("user_input") == 2 and ks.count("final") == 2 and "resumed" in ks


def test_a_resumed_run_keeps_its_resolved_mode_and_definition(tmp_path):
    write(tmp_path, "s.yaml", "local: false\nturns: [{emit_state: {reasoning: r, patch: {step: 1}, done: true}}]\n")
    agents = agents_file(tmp_path, mode="auto", state_schema=SCHEMA)
    rt = runtime(tmp_path)
    run = rt.start("a", agents=agents)
    assert run.mode.name == "stateful"
    # the definition file changes afterwards; the run keeps what it started with
    write(tmp_path, "agents.yaml", "agents:\n  a: {model: other}\n")
    opened = runtime(tmp_path).open(run.run_id)
    assert opened.mode.name == "stateful" and opened.spec == run.spec


def test_open_an_unknown_run(tmp_path):
    from loomrt import NotFoundError

    with pytest.raises(NotFoundError, match="no run 'nope'"):
        runtime(tmp_path).open("nope")


def test_a_resumed_stateful_run_keeps_counting_its_patch_retries(tmp_path):
    def emitted(patch, **kw):
        return ModelResponse(tool_calls=(ToolCall("c", "emit_state", {"reasoning": "r", "patch": patch, **kw}),))

    replies = iter([emitted({"step": "a"}), ProviderError("503 overloaded", status=503), emitted({"step": "b"})])

    def fn(request):
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    agents = agents_file(tmp_path, mode="stateful", state_schema=SCHEMA, max_patch_retries=1)
    rt = runtime(tmp_path, FunctionProvider(fn))
    first = rt.run_sync("a", "go", agents=agents, overrides={"retries": 0})
    assert first.status == "failed" and "503 overloaded" in first.error
    # one invalid patch is already on the record: a second one exhausts max_patch_retries=1
    result = asyncio.run(runtime(tmp_path, FunctionProvider(fn)).resume(first.run_id))
    assert result.status == "failed" and "after 2 attempt(s)" in result.error


def test_a_resumed_run_does_not_retry_a_declined_distillation_at_once(tmp_path):
    huge = "long summary " * 200
    turns = [calc(1), calc(2), calc(3, usage=1000)]
    agents = agents_file(tmp_path, mode="compaction", budget_tokens=256, keep_last_n=2)
    first = runtime(tmp_path, ScriptedProvider(turns, [huge])).run_sync("a", "go", agents=agents)
    assert first.status == "failed"  # the script ran out right after the declined distillation
    rt = runtime(tmp_path, ScriptedProvider([*turns, "done"], [huge]))
    assert asyncio.run(rt.resume(first.run_id)).status == "done"
    assert kinds(rt, first.run_id).count("distillation_declined") == 1


@tool("slow", "A long job.", {"type": "object", "properties": {}})
def _interrupted() -> str:
    raise KeyboardInterrupt  # the operator pressed Ctrl-C while the tool ran


def test_a_run_interrupted_inside_a_tool_resumes_with_well_formed_tool_pairs(tmp_path):
    write(tmp_path, "s.yaml", "turns: []\n")
    agents = load_agents(write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml, tools: [slow]}\n"))
    provider = ScriptedProvider([tool_call("slow"), "gave up on the slow job"])
    rt = runtime(tmp_path, provider, tools=[_interrupted])
    run = rt.start("a", agents=agents)
    with pytest.raises(KeyboardInterrupt):
        send(rt, run, "go")
    assert kinds(rt, run.run_id)[-1] == "tool_call"  # no result was recorded

    later = runtime(tmp_path, provider, tools=[_interrupted])
    result = asyncio.run(later.resume(run.run_id))
    assert (result.status, result.output) == ("done", "gave up on the slow job")
    sent = provider.calls[1].messages
    assert sent[-2]["tool_calls"][0]["id"] == sent[-1]["tool_call_id"] == "call_1_0"
    assert sent[-1]["content"].startswith("Error: the run stopped before this tool call returned")
    pending = [e for e in events(later, run.run_id, "tool_result")]
    assert len(pending) == 1 and pending[0].data["is_error"] is True
    rebuilt = later.open(run.run_id)
    assert [m.tool_call_id for m in rebuilt.context if m.role == "tool"] == ["call_1_0"]


def test_a_run_continues_from_the_record_after_its_prompt_file_is_gone(tmp_path):
    write(tmp_path, "prompt.md", "You answer in one word.")
    write(tmp_path, "s.yaml", "turns: [{text: four}, {text: six}]\n")
    path = write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml, system_prompt_file: prompt.md}\n")
    first = runtime(tmp_path).run_sync("a", "2+2?", agents=load_agents(path))
    (tmp_path / "prompt.md").unlink()
    rt = runtime(tmp_path)
    result = asyncio.run(rt.continue_run(first.run_id, "3+3?"))
    assert (result.status, result.output) == ("done", "six")
    assert rt.open(first.run_id).context[0].content == "You answer in one word."


def test_events_the_toolset_emits_while_it_is_resolved_land_after_run_started(tmp_path, monkeypatch):
    import loomrt.runtime_assembly as assembly_module

    real = assembly_module.resolve_toolset

    def noisy(spec, **kw):
        kw["emit"]("notice", {"message": "resolved early"})
        return real(spec, **kw)

    monkeypatch.setattr(assembly_module, "resolve_toolset", noisy)
    rt = runtime(tmp_path, ScriptedProvider(["ok"]))
    run = rt.start(AgentSpec(model="scripted/x"), name="a")
    assert [e.kind for e in rt.store.events(run.run_id)][:2] == ["run_started", "notice"]
    assert send(rt, run, "go").status == "done"
    reopened = runtime(tmp_path, ScriptedProvider(["ok"])).open(run.run_id)  # open() needs run_started first
    assert reopened.run_id == run.run_id


def test_harvest_without_memory_scopes_is_one_error_event_per_run(tmp_path):
    rt = runtime(tmp_path, ScriptedProvider(["one", "two"]))
    run = rt.start("a", agents=agents_file(tmp_path, harvest_to_memory=True), interactive=True)
    send(rt, run, "first")
    reopened = runtime(tmp_path, ScriptedProvider(["two"])).open(run.run_id)
    asyncio.run(reopened_send(reopened, tmp_path))
    errors = [e.data for e in events(rt, run.run_id, "harvest_error")]
    assert len(errors) == 1 and "memory_scopes is empty" in errors[0]["message"]


async def reopened_send(run, tmp_path):
    return await runtime(tmp_path, ScriptedProvider(["two"])).send(run, "second")


@pytest.mark.parametrize("mode", ["append", "recap", "compaction", "stateful"])
def test_the_wire_form_the_view_keeps_is_the_working_context_in_every_mode(tmp_path, mode):
    from modes_kit import SCHEMA, emit

    if mode == "stateful":
        ctx = {"mode": "stateful", "state_schema": SCHEMA}
        turns = [
            "no emit",
            emit({"step": 1}, action={"tool": "calculate", "arguments": {"expression": "1+1"}}),
            emit({"step": 2}, done=True),
        ]
    else:
        ctx = {"mode": mode, "budget_tokens": 256, "keep_last_n": 2, "backstop": True}
        turns = [calc(1), calc(2), calc(3, 900), calc(4), "done"]
    provider = ScriptedProvider(turns, [S1, S2])
    rt = runtime(tmp_path, provider)
    run = rt.start("a", agents=agents_file(tmp_path, **ctx))
    in_step, as_sent = [], []

    def check(event):
        in_step.append(run.view.wire == [m.to_litellm() for m in run.context])
        if event.kind == "model_call" and event.data["purpose"] == "turn":
            # recorded with the answer, in one transaction: what was sent is the context up to the answer
            sent = provider.calls[-1].messages
            as_sent.append(sent == [m.to_litellm() for m in run.context][: len(sent)])

    run.listeners.append(check)
    send(rt, run, "the task")
    assert in_step and all(in_step)
    assert as_sent and all(as_sent)
