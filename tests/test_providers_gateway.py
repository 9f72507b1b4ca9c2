"""The litellm gateway without a real model: litellm's own mock_response stands in for
the provider's HTTP reply, so litellm, the error mapping and the parsing are all real."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from loomrt.errors import ProviderError, SpecError
from loomrt.providers.base import Capabilities, ModelRequest, ToolSchema
from loomrt.providers.decisions import decision_schema, parse_decision, plain_history
from loomrt.providers.gateway import LiteLLMProvider
from loomrt.providers.offline import import_litellm
from loomrt.providers.retry import call_with_retries
from loomrt.spec import AgentSpec
from loomrt.testing import FaultyProvider, ScriptedProvider

CALC = ToolSchema(
    "calculate", "Evaluate arithmetic.", {"type": "object", "properties": {"expression": {"type": "string"}}}
)
HELLO = ModelRequest(messages=[{"role": "user", "content": "hello"}], max_tokens=32)


def mocked(reply: object, **kw: object) -> LiteLLMProvider:
    return LiteLLMProvider(
        "openai/gpt-4o",
        capabilities=Capabilities(tool_calling=True, structured_output=True),
        litellm_params={"mock_response": reply, **kw},
    )


def test_text_reply_and_usage_with_cached_prompt_tokens() -> None:
    litellm = import_litellm()
    reply = litellm.ModelResponse(
        choices=[{"message": {"role": "assistant", "content": "hi there"}, "finish_reason": "stop"}],
        usage=litellm.Usage(
            prompt_tokens=120, completion_tokens=3, total_tokens=123, prompt_tokens_details={"cached_tokens": 100}
        ),
    )
    response = asyncio.run(mocked(reply).complete(HELLO))
    assert response.text == "hi there"
    assert response.tool_calls == ()
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.cached_tokens) == (120, 3, 100)


def test_native_tool_calls_are_parsed() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2+2"}'}}]
    request = ModelRequest(messages=HELLO.messages, tools=(CALC,))
    response = asyncio.run(mocked("", mock_tool_calls=calls).complete(request))
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [("c1", "calculate", {"expression": "2+2"})]
    assert response.finish_reason == "tool_calls"


def test_malformed_tool_arguments_are_a_retryable_error() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": '}}]
    with pytest.raises(ProviderError) as info:
        asyncio.run(mocked("", mock_tool_calls=calls).complete(ModelRequest(messages=HELLO.messages, tools=(CALC,))))
    assert info.value.retryable is True
    assert "malformed JSON arguments for tool 'calculate'" in str(info.value)


@pytest.mark.parametrize(
    ("fault", "status", "retryable", "words"),
    [
        ("429", 429, True, "rate limited"),
        ("500", 500, True, "provider error (500)"),
        ("503", 503, True, "provider error (503)"),
        ("timeout", 408, True, "timed out"),
        ("connection", 500, True, "could not reach"),
        ("400", 400, False, "refused the request (400)"),
        ("401", 401, False, "Check the API key"),
        ("404", 404, False, "Check the model name"),
    ],
)
def test_litellm_errors_map_to_provider_errors(fault: str, status: int, retryable: bool, words: str) -> None:
    with pytest.raises(ProviderError) as info:
        asyncio.run(FaultyProvider([fault]).complete(HELLO))
    assert (info.value.status, info.value.retryable) == (status, retryable)
    assert words in str(info.value) and "injected" in str(info.value)


def test_retries_back_off_then_succeed_and_tell_on_retry() -> None:
    seen: list[tuple[int, int | None]] = []
    provider = FaultyProvider(["429", "timeout"], then=ScriptedProvider(turns=["fine"]))
    response = asyncio.run(
        call_with_retries(
            provider, HELLO, retries=3, on_retry=lambda n, e, d: seen.append((n, getattr(e, "status", None)))
        )
    )
    assert response.text == "fine"
    assert seen == [(1, 429), (2, 408)]


def test_retries_give_up_with_the_count() -> None:
    with pytest.raises(ProviderError, match=r"gave up after 3 attempts"):
        asyncio.run(call_with_retries(FaultyProvider(["500"] * 3), HELLO, retries=2))


def test_non_local_models_are_refused_when_requests_are_disabled() -> None:
    provider = LiteLLMProvider("openai/gpt-4o")
    with pytest.raises(ProviderError) as info:
        asyncio.run(provider.complete(HELLO))
    assert "LOOMRT_ALLOW_MODEL_REQUESTS=0" in str(info.value)
    assert info.value.retryable is False


def test_an_unset_api_key_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOMRT_ALLOW_MODEL_REQUESTS", "1")
    monkeypatch.delenv("LOOMRT_TEST_KEY", raising=False)
    spec = AgentSpec(model="openai/gpt-4o", api_key_env="LOOMRT_TEST_KEY")
    with pytest.raises(ProviderError) as info:
        asyncio.run(LiteLLMProvider.from_spec(spec).complete(HELLO))
    assert "LOOMRT_TEST_KEY" in str(info.value) and info.value.retryable is False


def test_a_missing_api_key_without_api_key_env_is_one_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a server error retried three times: said once, with what to set."""
    from loomrt.runtime import Runtime

    monkeypatch.setenv("LOOMRT_ALLOW_MODEL_REQUESTS", "1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProviderError) as info:
        asyncio.run(LiteLLMProvider.from_spec(AgentSpec(model="openai/gpt-4o")).complete(HELLO))
    assert "OPENAI_API_KEY is not set" in str(info.value) and "api_key_env" in str(info.value)
    assert info.value.retryable is False
    result = Runtime().run_sync(AgentSpec(model="openai/gpt-4o"), "hi")
    assert result.status == "failed" and "OPENAI_API_KEY" in (result.error or "")
    assert not any(e.kind == "retry" for e in Runtime().store.events(result.run_id))


def test_from_spec_carries_endpoint_settings_and_declared_capabilities() -> None:
    spec = AgentSpec.model_validate(
        {
            "model": "hosted_vllm/qwen",
            "api_base": "https://gpu.example.com/v1",
            "timeout_s": 30,
            "capabilities": {"local": True, "context_window": 32768},
        }
    )
    provider = LiteLLMProvider.from_spec(spec)
    assert (provider.api_base, provider.timeout_s) == ("https://gpu.example.com/v1", 30)
    assert (provider.capabilities.local, provider.capabilities.context_window) == (True, 32768)
    # a different summarizer model does not inherit the agent model's declared facts
    assert LiteLLMProvider.from_spec(spec, model="openai/gpt-4o").capabilities.local is False


def test_an_unknown_embedded_model_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="Known embedded models: local/qwen2.5-coder-1.5b, local/smollm2-135m"):
        LiteLLMProvider("local/llama-9000")


def test_decisions_without_native_tool_calling_go_through_the_decision_schema() -> None:
    # an OpenAI-compatible server declared without native tool calling: the reply is a decision
    decision = json.dumps({"action": "calculate", "arguments": {"expression": "6*7"}})
    provider = LiteLLMProvider(
        "openai/small",
        capabilities=Capabilities(tool_calling=False, structured_output=True),
        litellm_params={"mock_response": decision},
    )
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "6*7?"},
    ]
    response = asyncio.run(provider.complete(ModelRequest(messages=history, tools=(CALC,))))
    assert [(c.name, c.arguments) for c in response.tool_calls] == [("calculate", {"expression": "6*7"})]
    answer = LiteLLMProvider(
        "openai/small",
        capabilities=Capabilities(tool_calling=False),
        litellm_params={"mock_response": json.dumps({"action": "answer", "text": "42"})},
    )
    response = asyncio.run(answer.complete(ModelRequest(messages=history, tools=(CALC,))))
    assert (response.text, response.tool_calls) == ("42", ())


def test_decision_schema_branches() -> None:
    schema = decision_schema((CALC,), required=False)
    actions = [b["properties"]["action"]["const"] for b in schema["oneOf"]]
    assert actions == ["calculate", "answer"]
    assert schema["oneOf"][0]["properties"]["arguments"] == CALC.parameters
    required = decision_schema((CALC,), required=True)  # tool_choice=required: no answer branch
    assert required["properties"]["action"]["const"] == "calculate"


def test_decision_parsing_errors() -> None:
    request = ModelRequest(messages=[], tools=(CALC,), tool_choice="required", max_tokens=512)
    with pytest.raises(ProviderError, match="cut off at max_tokens=512") as info:
        parse_decision('{"action": "calc', request, model="m", finish_reason="length")
    assert info.value.retryable is False
    with pytest.raises(ProviderError, match="expected one of") as info:
        parse_decision('{"action": "answer", "text": "no"}', request, model="m", finish_reason="stop")
    assert info.value.retryable is True


def test_plain_history_rewrites_tool_turns_for_models_without_the_tool_role() -> None:
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "6*7?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculate", "arguments": '{"expression": "6*7"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "calculate", "content": "42"},
        {"role": "user", "content": "thanks"},
    ]
    out = plain_history(messages, "TOOLS")
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"] == "sys\n\nTOOLS"
    assert json.loads(out[2]["content"]) == {"action": "calculate", "arguments": {"expression": "6*7"}}
    assert out[3]["content"] == "Result of calculate:\n42\n\nthanks"


def _decide_then_answer(
    monkeypatch: pytest.MonkeyPatch, *replies: str, on_text: Any = None
) -> tuple[Any, list[list[dict[str, Any]]]]:
    """A turn with one tool offered, its calls answered by ``replies`` in order: the
    response and the messages each call sent (``on_text``: the turn streams there)."""
    from types import SimpleNamespace

    sent: list[list[dict[str, Any]]] = []
    queue = iter(replies)

    async def fake(kwargs: dict[str, Any], on_text: Any = None) -> Any:
        sent.append(kwargs["messages"])
        message = SimpleNamespace(content=next(queue), tool_calls=None)
        if on_text is not None:  # a streamed call: its text in two pieces
            on_text(message.content[:3])
            on_text(message.content[3:])
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason="stop")], usage=None)

    provider = LiteLLMProvider(
        "openai/small", capabilities=Capabilities(tool_calling=False), litellm_params={"mock_response": "unused"}
    )
    monkeypatch.setattr(provider, "_acompletion", fake)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6*7?"}]
    request = ModelRequest(messages=history, tools=(CALC,), on_text=on_text)
    return asyncio.run(provider.complete(request)), sent


def test_the_answer_call_continues_the_decision_calls_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefix reuse by construction: after a decision to answer, the answer call sends the
    decision's prompt unchanged, then the decision and one line asking for the answer, so a
    prefix cache re-reads nothing the decision call read (before, the answer call dropped
    the tool instructions from the system message and shared nothing past it)."""
    from loomrt.providers.decisions import ANSWER_NOW

    response, sent = _decide_then_answer(
        monkeypatch, '{"action": "answer"}', '{"action": "answer", "text": "It is 42."}'
    )
    decision, answer = sent
    assert answer[: len(decision)] == decision
    assert answer[len(decision) :] == [{"role": "assistant", "content": '{"action": "answer"}'}, ANSWER_NOW]
    assert response.text == "It is 42.", "an answer written as a decision again is unwrapped"


def test_a_model_that_only_decides_again_is_asked_once_more_without_the_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    response, sent = _decide_then_answer(monkeypatch, '{"action": "answer"}', '{ "action": "answer"}', "It is 42.")
    assert response.text == "It is 42." and len(sent) == 3
    assert "You can use these tools" not in sent[2][0]["content"]


def test_the_answer_streams_and_a_decision_written_again_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """Of a decide-then-answer turn only the answer streams: not the decision, and not an
    answer call that writes its decision again (the bare call after it streams instead)."""
    heard: list[str] = []
    response, _ = _decide_then_answer(monkeypatch, '{"action": "answer"}', "It is 42.", on_text=heard.append)
    assert "".join(heard) == response.text == "It is 42."
    heard.clear()
    response, _ = _decide_then_answer(
        monkeypatch, '{"action": "answer"}', '{ "action": "answer"}', "It is 42.", on_text=heard.append
    )
    assert "".join(heard) == response.text == "It is 42."


def test_a_hosted_model_streams_and_the_reply_is_the_whole_text() -> None:
    heard: list[str] = []
    request = ModelRequest(messages=HELLO.messages, max_tokens=32, on_text=heard.append)
    response = asyncio.run(mocked("The answer is forty-two, as computed.").complete(request))
    assert response.text == "The answer is forty-two, as computed."
    assert len(heard) > 1 and "".join(heard) == response.text
    assert response.usage.output_tokens > 0


def test_a_hosted_model_streams_beside_its_tool_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed reply with text and a tool call (in pieces, as providers send them) comes
    back whole: the text streamed, the call parsed."""
    from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices

    def chunk(finish: str | None = None, **delta: Any) -> Any:
        return ModelResponseStream(choices=[StreamingChoices(index=0, delta=Delta(**delta), finish_reason=finish)])

    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expr'}}
    chunks = [
        chunk(content="Let me "),
        chunk(content="compute."),
        chunk(tool_calls=[call]),
        chunk(tool_calls=[{"index": 0, "function": {"arguments": 'ession": "2+2"}'}}]),
        chunk(finish="tool_calls"),
    ]

    async def stream(**kwargs: Any) -> Any:
        assert kwargs["stream"] is True

        async def pieces() -> Any:
            for c in chunks:
                yield c

        return pieces()

    monkeypatch.setattr(import_litellm(), "acompletion", stream)
    heard: list[str] = []
    request = ModelRequest(messages=HELLO.messages, tools=(CALC,), on_text=heard.append)
    response = asyncio.run(mocked("unused").complete(request))
    assert heard == ["Let me ", "compute."] and response.text == "Let me compute."
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [("c1", "calculate", {"expression": "2+2"})]
