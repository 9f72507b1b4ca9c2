"""Issue 43, item 2: one model call per turn where one will do. With ``one_call_turns`` the
embedded model gets a grammar that lets it open a tool-call JSON object or write the answer
as text, in one generation; the two-step path (decide, then answer) stays for a model that
needs it, and takes over a tool call cut off by the answer's token limit."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from test_local_model import WEATHER

from loomrt.providers.base import Capabilities, ModelRequest
from loomrt.providers.gateway import LiteLLMProvider
from loomrt.providers.local import TOOL_OR_TEXT, LocalError, grammar_for

SMOL = "local/smollm2-135m"
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather in Paris?"}]


def one_call(monkeypatch: pytest.MonkeyPatch, *replies: tuple[str, str], on_text: Any = None) -> tuple[Any, list]:
    """A turn of the embedded model with one tool offered, its calls answered by ``replies``
    ((text, finish reason) in order): the response and the arguments of each call."""
    sent: list[dict[str, Any]] = []
    queue = iter(replies)

    async def fake(kwargs: dict[str, Any], on_text: Any = None) -> Any:
        sent.append(kwargs)
        text, finish = next(queue)
        if on_text is not None:
            on_text(text[:4])
            on_text(text[4:])
        message = SimpleNamespace(content=text, tool_calls=None)
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason=finish)], usage=None)

    caps = Capabilities(local=True, tool_calling=False, structured_output=True, one_call_turns=True)
    provider = LiteLLMProvider(SMOL, capabilities=caps)
    provider._prepared = True  # nothing is loaded: the calls are the fake's
    monkeypatch.setattr(provider, "_acompletion", fake)
    request = ModelRequest(messages=ASK, tools=(WEATHER,), max_tokens=40, on_text=on_text)
    return asyncio.run(provider.complete(request)), sent


def test_an_answer_is_one_call_and_streams_from_its_first_token(monkeypatch: pytest.MonkeyPatch) -> None:
    heard: list[str] = []
    response, sent = one_call(monkeypatch, ("It is sunny in Paris.", "stop"), on_text=heard.append)
    assert len(sent) == 1 and response.text == "It is sunny in Paris." and not response.tool_calls
    assert "".join(heard) == response.text
    assert sent[0]["response_format"]["type"] == TOOL_OR_TEXT
    assert sent[0]["max_tokens"] == 40  # the answer's own limit
    assert "plain text" in sent[0]["messages"][0]["content"]


def test_a_tool_call_is_one_call_and_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    heard: list[str] = []
    call = json.dumps({"action": "weather", "arguments": {"city": "Paris"}})
    response, sent = one_call(monkeypatch, (call, "stop"), on_text=heard.append)
    assert len(sent) == 1 and [(c.name, c.arguments) for c in response.tool_calls] == [("weather", {"city": "Paris"})]
    assert heard == []


def test_a_tool_call_cut_off_by_the_answers_limit_is_decided_again_in_two_steps(monkeypatch) -> None:
    cut = '{"action": "weather", "argu'
    again = json.dumps({"action": "weather", "arguments": {"city": "Rome"}})
    response, sent = one_call(monkeypatch, (cut, "length"), (again, "stop"))
    assert len(sent) == 2 and sent[1]["response_format"]["type"] != TOOL_OR_TEXT
    assert [c.arguments for c in response.tool_calls] == [{"city": "Rome"}]


def test_an_answer_cut_off_by_its_limit_says_so_as_the_two_step_answer_does(monkeypatch) -> None:
    response, sent = one_call(monkeypatch, ("It is sunny in Paris, and tomorrow", "length"))
    assert len(sent) == 1 and response.text.startswith("It is sunny in Paris, and tomorrow")
    assert "cut off at max_tokens=40" in response.text


def test_one_call_is_the_embedded_models_default_and_an_agent_may_keep_two() -> None:
    """Issue 43: the embedded models decide and answer in one generation unless an agent
    declares ``one_call_turns: false`` (the paired measures are in docs/providers.md); no
    other model is given the grammar."""
    from loomrt.providers.registry import CATALOGUE, capabilities_for

    assert all(capabilities_for(model).one_call_turns for model in CATALOGUE)
    assert not capabilities_for(SMOL, declared={"one_call_turns": False}).one_call_turns
    assert not capabilities_for("openai/gpt-4o-mini").one_call_turns
    assert not capabilities_for("ollama/llama3").one_call_turns


def test_the_grammar_is_built_and_a_bad_schema_is_a_clear_error() -> None:
    pytest.importorskip("llama_cpp")
    from loomrt.providers.decisions import decision_schema

    assert grammar_for({"type": TOOL_OR_TEXT, "schema": decision_schema((WEATHER,), required=True)}) is not None
    with pytest.raises(LocalError, match="tool-call schema"):
        grammar_for({"type": TOOL_OR_TEXT, "schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}})


@pytest.mark.slow
def test_the_embedded_model_decides_and_answers_in_one_generation() -> None:
    """The real grammar on SmolLM2: each reply is a valid tool call or plain text, made in
    one llama.cpp call (its usage is one call's), and the answer streams whole."""
    pytest.importorskip("llama_cpp")
    caps = Capabilities(
        local=True, context_window=8192, tool_calling=False, structured_output=True, one_call_turns=True
    )
    provider = LiteLLMProvider(SMOL, capabilities=caps)
    calls = 0
    real = provider._acompletion

    async def counted(*a: Any, **k: Any) -> Any:
        nonlocal calls
        calls += 1
        return await real(*a, **k)

    provider._acompletion = counted  # type: ignore[method-assign]
    for question in ("What is the weather in Rome?", "Say hello in French."):
        heard: list[str] = []
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
        request = ModelRequest(messages=messages, tools=(WEATHER,), max_tokens=48, temperature=0, on_text=heard.append)
        calls = 0
        response = asyncio.run(provider.complete(request))
        assert calls == 1, "one generation decides and answers"
        if response.tool_calls:
            assert response.tool_calls[0].arguments.get("city") in ("Paris", "Rome", "Berlin") and heard == []
        else:
            assert response.text and not response.text.lstrip().startswith("{")
            assert "".join(heard).strip() == response.text


@pytest.mark.slow
def test_only_the_first_token_is_sampled_under_the_grammar() -> None:
    """llama.cpp checks the whole vocabulary against a grammar at every token, so an answer
    sampled under the tool-or-text grammar decodes at a fraction of the model's speed. Once
    the first token has begun the answer, the rest is sampled free (the grammar allows any
    text there); a reply that opens ``{`` keeps the grammar to its end. Sabotage: with the
    grammar kept throughout, the answer's second generation never happens."""
    pytest.importorskip("llama_cpp")
    from loomrt.providers.local import ToolOrText, generate, load

    schema = {
        "type": "object",
        "properties": {"action": {"const": "calculate"}, "arguments": {"type": "object"}},
        "required": ["action", "arguments"],
    }
    either = grammar_for({"type": TOOL_OR_TEXT, "schema": schema})
    assert isinstance(either, ToolOrText)
    loaded = load(SMOL, 4096)
    sampled: list[Any] = []
    real = loaded.llama.create_completion

    def spied(*a: Any, **k: Any) -> Any:
        sampled.append(k.get("grammar"))
        return real(*a, **k)

    loaded.llama.create_completion = spied
    try:
        heard: list[str] = []
        story = [{"role": "user", "content": "Tell me about lighthouses in three sentences."}]
        answer = generate(loaded, story, max_tokens=40, temperature=0, grammar=either, on_text=heard.append)
        assert sampled == [either.grammar, None], "the first token under the grammar, the rest free"
        assert answer.completion_tokens == 40 and answer.finish_reason == "length"
        assert not answer.text.startswith("{") and "".join(heard) == answer.text
        kept = generate(loaded, story, max_tokens=40, temperature=0, grammar=either.grammar)  # the sabotage
        assert sampled[2:] == [either.grammar] and kept.text.split()[:3] == answer.text.split()[:3]

        sampled.clear()
        echo = '{"action": "calculate", "arguments": {"expression": "2+2"}}\nRepeat the JSON above exactly.'
        ask = [{"role": "system", "content": "Reply with a JSON object only."}, {"role": "user", "content": echo}]
        call = generate(loaded, ask, max_tokens=60, temperature=0, grammar=either)
        assert sampled == [either.grammar] and json.loads(call.text)["action"] == "calculate"
    finally:
        loaded.llama.create_completion = real
