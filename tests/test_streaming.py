"""A run tells its watchers what it does now and streams its answer to them (issue 44), and
the record is the same with a watcher or without one: the whole answer, one event."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loomrt import AgentSpec, Runtime
from loomrt.activity import Activity, AnswerText
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.providers.scripted import ScriptedProvider
from loomrt.record.sqlite import SQLiteStore

ANSWER = "The port of the staging database is 5433, as the file says."
TURNS: list[dict[str, Any] | str] = [
    {"text": "Reading it.", "tool_call": {"name": "calculate", "arguments": {"expression": "5432 + 1"}}},
    ANSWER,
]


def _play(watch: bool) -> tuple[list[Activity | AnswerText], list[tuple[str, dict[str, Any]]], str]:
    heard: list[Activity | AnswerText] = []
    provider = ScriptedProvider(turns=list(TURNS))
    rt = Runtime(
        SQLiteStore(":memory:"),
        providers=lambda spec, model: provider,
        watchers=[heard.append] if watch else [],
    )
    spec = AgentSpec(model="scripted/inline", tools=["calculate"])
    result = asyncio.run(rt.run(spec, "Which port?"))
    recorded = [(e.kind, _plain(e.data)) for e in rt.store.events(result.run_id)]
    return heard, recorded, result.output or ""


def _plain(data: dict[str, Any]) -> dict[str, Any]:
    """An event's payload less what differs between any two runs (times)."""
    return {k: v for k, v in data.items() if k not in ("seconds", "ts", "started_at")}


def test_the_answer_streams_to_the_watchers_and_the_record_is_unchanged() -> None:
    heard, recorded, output = _play(watch=True)
    _, unwatched, _ = _play(watch=False)
    assert recorded == unwatched  # streaming never changes the record
    texts = [s.text for s in heard if isinstance(s, AnswerText)]
    assert len(texts) > 5 and "".join(texts) == "Reading it." + ANSWER  # each call's text, word by word
    assert output == ANSWER
    messages = [d["message"]["content"] for k, d in recorded if k == "assistant_message"]
    assert messages[-1] == ANSWER  # the whole answer, one event
    doing = [(s.doing, s.tool) for s in heard if isinstance(s, Activity)]
    assert doing == [("thinking", None), ("calling", "calculate"), ("thinking", None)]


def test_a_distillation_is_told_with_its_mode_and_size() -> None:
    heard: list[Activity | AnswerText] = []
    provider = ScriptedProvider(
        turns=[{"text": "x" * 40, "usage": {"input_tokens": 5000}}] * 4, summaries=["Recap: asked four times."]
    )
    rt = Runtime(SQLiteStore(":memory:"), providers=lambda spec, model: provider, watchers=[heard.append])
    spec = AgentSpec.model_validate(
        {"model": "scripted/inline", "context": {"mode": "recap", "budget_tokens": 6000, "keep_last_n": 1}}
    )
    run = rt.start(spec, interactive=True)
    for i in range(4):
        asyncio.run(rt.send(run, f"question {i}"))
    distilling = [s for s in heard if isinstance(s, Activity) and s.doing == "distilling"]
    assert distilling and distilling[0].mode == "recap" and distilling[0].messages >= 2


@pytest.mark.parametrize("streams", [True, False])
def test_a_provider_that_does_not_stream_still_answers(streams: bool) -> None:
    """on_text is optional: a provider that never calls it gives the same answer."""

    class Quiet:
        model = "quiet/inline"
        capabilities = ScriptedProvider().capabilities

        async def complete(self, request: ModelRequest) -> ModelResponse:
            if streams and request.on_text is not None:
                request.on_text("hello")
            return ModelResponse(text="hello", model=self.model)

    heard: list[Activity | AnswerText] = []
    rt = Runtime(SQLiteStore(":memory:"), providers=lambda spec, model: Quiet(), watchers=[heard.append])
    result = asyncio.run(rt.run(AgentSpec(model="quiet/inline"), "hi"))
    assert result.output == "hello"
    assert [s.text for s in heard if isinstance(s, AnswerText)] == (["hello"] if streams else [])


def test_a_watcher_that_fails_is_dropped_with_a_notice_and_the_run_goes_on() -> None:
    """A watcher is an optional part (a terminal that went away): it never fails a run."""
    heard: list[Activity | AnswerText] = []

    def gone(signal: Activity | AnswerText) -> None:
        raise BrokenPipeError("the terminal went away")

    provider = ScriptedProvider(turns=list(TURNS))
    rt = Runtime(SQLiteStore(":memory:"), providers=lambda spec, model: provider, watchers=[gone, heard.append])
    result = asyncio.run(rt.run(AgentSpec(model="scripted/inline", tools=["calculate"]), "Which port?"))
    assert result.status == "done" and result.output == ANSWER
    notices = [e.data["message"] for e in rt.store.events(result.run_id, kinds=["notice"])]
    assert len(notices) == 1 and "BrokenPipeError" in notices[0]
    assert any(isinstance(s, AnswerText) for s in heard)  # the other watcher still hears the answer
