"""The pieces a QA replay is built from: the acknowledging provider of the replay, a meter
of model calls, an embedding cache for forks, and the scripted reader for tests.

None of them changes what the runtime does: the acknowledging provider answers a replay's
turns with a fixed line (a turn needs no model reply) and passes every distillation to the
real model; the meter only counts; the cache only saves re-embedding the same texts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from loomrt.bench.model import BenchModel
from loomrt.providers.base import ModelProvider, ModelRequest, ModelResponse, Usage
from loomrt.tokens import count_dicts, count_text

__all__ = ["ACKNOWLEDGEMENT", "Meter", "Acknowledging", "Metered", "QAReader", "question_of"]

ACKNOWLEDGEMENT = "I see."
"""What the model "says" after each replayed turn (no model call is made for it)."""

QUESTION_PREFIX = "Question: "


@dataclass
class Meter:
    """Every real model call: purpose, input and output tokens, seconds."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def mark(self) -> int:
        return len(self.calls)

    def since(self, mark: int) -> list[dict[str, Any]]:
        return self.calls[mark:]

    @staticmethod
    def totals(calls: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "calls": len(calls),
            "input_tokens": sum(c["input_tokens"] for c in calls),
            "output_tokens": sum(c["output_tokens"] for c in calls),
            "seconds": round(sum(c["seconds"] for c in calls), 2),
            "largest_prompt": max((c["input_tokens"] for c in calls), default=0),
            "largest_prompt_estimate": max((c["prompt_estimate"] for c in calls), default=0),
        }


class Metered:
    """A provider whose every call the meter records."""

    def __init__(self, inner: ModelProvider, meter: Meter):
        self.inner, self.meter = inner, meter
        self.model = inner.model
        self.capabilities = inner.capabilities

    async def complete(self, request: ModelRequest) -> ModelResponse:
        started = time.perf_counter()
        response = await self.inner.complete(request)
        self.meter.calls.append(
            {
                "purpose": request.purpose,
                "input_tokens": response.usage.input_tokens or count_dicts(request.messages),
                "prompt_estimate": count_dicts(request.messages),
                "output_tokens": response.usage.output_tokens,
                "seconds": time.perf_counter() - started,
                "recall": any(c.name == "Recall" for c in response.tool_calls),
            }
        )
        return response


class Acknowledging(Metered):
    """The replay's provider: a turn is acknowledged without a model call; summaries and
    recaps are written by the real model (and metered)."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if request.purpose == "turn":
            return ModelResponse(
                text=ACKNOWLEDGEMENT,
                model=self.model,
                usage=Usage(count_dicts(request.messages), count_text(ACKNOWLEDGEMENT), 0),
            )
        return await super().complete(request)


def question_of(request: ModelRequest) -> str:
    """The question of a QA prompt: the text after the last ``Question: `` of the last user message."""
    for m in reversed(request.messages):
        content = str(m.get("content") or "")
        if m.get("role") == "user" and QUESTION_PREFIX in content:
            return content.rsplit(QUESTION_PREFIX, 1)[1].strip()
    return ""


@dataclass
class QAReader(BenchModel):
    """The scripted model of ``loomrt bench qa --model scripted`` (the CI configuration): it
    answers with the line of its prompt that shares the most content words with the
    question, recalling first when none shares enough (:meth:`BenchModel.look_up`), and
    abstains when it finds nothing. It knows no gold answer; its summaries are extractive."""

    def turn(self, request: ModelRequest) -> ModelResponse:
        question = question_of(request)
        if not question:
            return self.respond(request, ACKNOWLEDGEMENT)
        line, recall = self.look_up(request, question, question, asked_in=question)
        if recall is not None:
            return recall
        return self.respond(request, line or "No information available")
