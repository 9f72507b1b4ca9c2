"""Provider failures during a run: every attempt is on the record, nothing is lost, a
permanent error fails the run cleanly, and the run stays resumable."""

from __future__ import annotations

import asyncio

from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import FaultyProvider, ScriptedProvider, scripted_runtime


def kinds(rt: Runtime, run_id: str) -> list[str]:
    return [e.kind for e in rt.store.events(run_id)]


def test_every_retry_is_an_event_and_the_run_completes() -> None:
    then = ScriptedProvider(turns=[{"tool_call": {"name": "calculate", "arguments": {"expression": "6*7"}}}, "42"])
    provider = FaultyProvider(["429", "500", "timeout", "malformed_tool_call"], then=then)
    rt = scripted_runtime(provider)
    result = rt.run_sync(AgentSpec(model="scripted/x", tools=["calculate"], retries=4), "what is 6*7?")
    assert result.status == "done" and result.output == "42"
    events = rt.store.events(result.run_id)
    retries = [e.data for e in events if e.kind == "retry"]
    assert [r["attempt"] for r in retries] == [1, 2, 3, 4]
    assert [r["status"] for r in retries] == [429, 500, 408, None]
    assert "malformed JSON arguments for tool 'calculate'" in retries[3]["error"]
    # nothing is lost: the input, the tool call and its result, and the answer are all there
    assert kinds(rt, result.run_id) == [
        "run_started",
        "user_input",
        "retry",
        "retry",
        "retry",
        "retry",
        "model_call",
        "assistant_message",
        "tool_call",
        "tool_result",
        "model_call",
        "assistant_message",
        "final",
    ]
    tool_result = next(e.data for e in events if e.kind == "tool_result")
    assert tool_result["content"] == "42" and not tool_result["is_error"]
    assert result.model_calls == 2  # failed attempts are retries, not model calls
    then.assert_complete()


def test_a_permanent_error_fails_the_run_with_the_providers_message_and_it_resumes() -> None:
    then = ScriptedProvider(turns=["recovered"])
    rt = scripted_runtime(FaultyProvider(["429", "401"], then=then))
    result = rt.run_sync(AgentSpec(model="scripted/x", retries=3), "hello")
    assert result.status == "failed"
    assert "authentication failed (401): injected invalid API key" in (result.error or "")
    assert kinds(rt, result.run_id) == ["run_started", "user_input", "retry", "error"]
    error = rt.store.events(result.run_id)[-1].data
    assert "injected invalid API key" in error["message"] and error["type"] == "ProviderError"

    resumed = asyncio.run(rt.resume(result.run_id))  # the same runtime's provider now answers
    assert resumed.status == "done" and resumed.output == "recovered"
    assert kinds(rt, result.run_id)[4:] == ["resumed", "model_call", "assistant_message", "final"]
    assert rt.store.events(result.run_id)[1].data == {"content": "hello"}  # the record was never rewritten


def test_retries_running_out_fail_the_run_with_the_count() -> None:
    rt = scripted_runtime(FaultyProvider(["503", "503", "503"]))
    result = rt.run_sync(AgentSpec(model="scripted/x", retries=2), "hello")
    assert result.status == "failed"
    assert "gave up after 3 attempts" in (result.error or "")
    assert kinds(rt, result.run_id).count("retry") == 2


def test_retries_zero_means_one_attempt() -> None:
    rt = scripted_runtime(FaultyProvider(["429"]))
    result = rt.run_sync(AgentSpec(model="scripted/x", retries=0), "hello")
    assert result.status == "failed" and "retry" not in kinds(rt, result.run_id)


def test_a_chat_survives_a_provider_outage_and_continues_afterwards() -> None:
    """An outage longer than the retries: the turn fails and is recorded, the chat parks
    (nothing lost), the next input works once the provider is back, and so does
    `runs continue` on the same run later."""
    then = ScriptedProvider(turns=["first", "after the outage", "later still"])
    provider = FaultyProvider(["503"] * 4, then=then)  # retries=2: the second turn's three attempts all fail
    rt = scripted_runtime(provider)
    spec = AgentSpec(model="scripted/x", retries=2)

    async def chat() -> list:
        run = await rt.astart(spec, interactive=True)
        provider.faults, queued = [], list(provider.faults)
        first = await rt.send(run, "hello")
        provider.faults = queued
        down = await rt.send(run, "are you there?")
        up = await rt.send(run, "and now?")
        later = await rt.continue_run(run.run_id, "one more")
        return [first, down, up, later]

    first, down, up, later = asyncio.run(chat())
    assert (first.output, up.output, later.output) == ("first", "after the outage", "later still")
    assert down.status == "failed" and "503" in (down.error or "")
    events = rt.store.events(first.run_id)
    assert sum(e.kind == "retry" for e in events) >= 2
    assert [e.data["content"] for e in events if e.kind == "user_input"] == [
        "hello",
        "are you there?",
        "and now?",
        "one more",
    ]
    assert any(e.kind == "parked" and e.data.get("after_error") for e in events)


def _replying(*replies: object) -> object:
    """A custom provider whose replies are tool calls with the given arguments, then an answer."""
    from loomrt.messages import ToolCall
    from loomrt.providers.base import ModelResponse
    from loomrt.testing import FunctionProvider

    queue = list(replies)

    def reply(request: object) -> ModelResponse:
        if queue:
            return ModelResponse(tool_calls=(ToolCall(id="c1", name="calculate", arguments=queue.pop(0)),))  # type: ignore[arg-type]
        return ModelResponse(text="done")

    return FunctionProvider(reply)


def _deep(n: int) -> dict:
    value: dict = {}
    for _ in range(n):
        value = {"a": value}
    return value


def test_deeply_nested_or_non_object_arguments_are_a_retried_provider_error_never_recorded() -> None:
    from loomrt.audit import prompt_problems
    from loomrt.run.projection import project

    for bad in (_deep(3000), ["not", "an", "object"], "2 + 2"):
        rt = scripted_runtime(_replying(bad))  # type: ignore[arg-type]
        result = rt.run_sync(AgentSpec(model="scripted/x", tools=["calculate"], retries=2), "compute")
        assert result.status == "done" and result.output == "done", result.error
        events = rt.store.events(result.run_id)
        retries = [e.data for e in events if e.kind == "retry"]
        assert retries and "malformed reply" in retries[0]["error"]
        assert not any(e.kind == "tool_call" for e in events), "the malformed call was never recorded"
        project(events)  # the record can be read, shown and verified
        assert prompt_problems(events) == []


def test_a_malformed_call_already_on_a_record_reads_as_a_placeholder() -> None:
    from loomrt.messages import Message

    m = Message.from_dict({"role": "assistant", "tool_calls": [{"id": "c", "name": "x", "arguments": [1, 2]}]})
    assert m.tool_calls[0].arguments == {"malformed_arguments": "[1, 2]"}
