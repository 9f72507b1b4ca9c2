"""The benchmarks' scripted model: deterministic replies, and extractive summaries blind to the probes.

A :class:`BenchModel` answers through a :class:`~loomrt.testing.FunctionProvider`, so the
runs it drives are real runs of the runtime: the loop, the reducers, the record and
Recall all do their work; only the model's words are generated. Its usage is exact:
``input_tokens`` is the estimated size of the prompt it was sent (:mod:`loomrt.tokens`),
``output_tokens`` the size of what it wrote.

It behaves as a cooperative model would in each mode:

- in stateful mode (``emit_state`` offered) it acts only through ``emit_state``, patching
  into Σ each needle it can see that it has not patched yet;
- when it needs a needle that is not in its prompt and ``Recall`` is offered, it calls
  Recall first (once), and uses the value only if the result holds it verbatim;
- its summaries and recaps are extractive and blind to the needles: the leading sentence
  of each message of the span (at most 24 words of it), earliest first, up to a fixed size
  (and the ``At most N characters`` of a recap's instructions). A value survives a
  boundary only if a leading sentence happens to carry it.
"""

from __future__ import annotations

import abc
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from loomrt.messages import ToolCall
from loomrt.providers.base import ModelRequest, ModelResponse, Usage
from loomrt.providers.scripted import extractive_summary
from loomrt.tokens import count_dicts, count_text

__all__ = ["Needle", "BenchModel", "prompt_text"]

EMIT_STATE = "emit_state"


@dataclass(frozen=True)
class Needle:
    """An exact value a workload plants, and the words a model would search it by."""

    key: str
    value: str
    query: str = ""

    @property
    def search(self) -> str:
        return self.query or self.key


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """Everything a model can read in ``messages``: contents and tool-call arguments."""
    parts: list[str] = []
    for m in messages:
        parts.append(str(m.get("content") or ""))
        for tc in m.get("tool_calls") or ():
            parts.append(str(tc.get("function", {}).get("arguments", "")))
    return "\n".join(parts)


@dataclass
class BenchModel(abc.ABC):
    """The model side of a workload. Subclasses decide what a ``turn`` call answers."""

    needles: list[Needle] = field(default_factory=list)
    summary_tokens: int = 400
    recap_tokens: int = 450
    seed: int = 0
    patched: set[str] = field(default_factory=set)
    _calls: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # ------------------------------------------------------------------ plumbing

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self._calls += 1
        if request.purpose in ("recap", "summary"):
            return self.respond(request, self.summarize(request))
        return self.turn(request)

    def respond(self, request: ModelRequest, text: str = "", calls: tuple[ToolCall, ...] = ()) -> ModelResponse:
        """A reply whose usage is the exact estimated size of prompt and reply."""
        out = count_text(text) + sum(count_text(json.dumps(c.arguments)) for c in calls)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            model="bench/scripted",
            usage=Usage(count_dicts(request.messages), max(1, out), 0),
            finish_reason="tool_calls" if calls else "stop",
        )

    def call(self, name: str, arguments: dict[str, Any]) -> ToolCall:
        return ToolCall(id=f"call_{self._calls}_{name}", name=name, arguments=arguments)

    @staticmethod
    def offers(request: ModelRequest, name: str) -> bool:
        return any(t.name == name for t in request.tools)

    def visible(self, request: ModelRequest) -> list[Needle]:
        text = prompt_text(request.messages)
        return [n for n in self.needles if n.value in text]

    def act(
        self,
        request: ModelRequest,
        *,
        text: str = "",
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
        final: bool = False,
    ) -> ModelResponse:
        """Reply with ``text`` or call ``tool``: directly, or through emit_state in stateful mode."""
        if not self.offers(request, EMIT_STATE):
            if tool:
                return self.respond(request, "", (self.call(tool, arguments or {}),))
            return self.respond(request, text)
        new = {n.key: n.value for n in self.visible(request) if n.key not in self.patched}
        self.patched.update(new)
        emit: dict[str, Any] = {
            "reasoning": "Noting what I learned and deciding the next step.",
            "patch": {"notes": new} if new else {},
        }
        if tool:
            emit["action"] = {"tool": tool, "arguments": arguments or {}}
        else:
            emit.update(done=True, final=text)
        return self.respond(request, "", (self.call(EMIT_STATE, emit),))

    def recalled(self, request: ModelRequest, needle: Needle) -> bool | None:
        """True/False if the last message is a Recall result for ``needle`` (holding it or not)."""
        last = request.messages[-1] if request.messages else {}
        content = str(last.get("content") or "")
        is_tool = last.get("role") == "tool" and last.get("name") == "Recall"
        is_obs = last.get("role") == "user" and content.startswith("Last observation (Recall)")
        if not (is_tool or is_obs):
            return None
        return needle.value in content

    def need(self, request: ModelRequest, needle: Needle) -> tuple[bool, ModelResponse | None]:
        """Whether ``needle`` is available now; if not and Recall can find it, the Recall call to make."""
        if needle.value in prompt_text(request.messages):
            return True, None
        if self.offers(request, "Recall") or self.offers(request, EMIT_STATE) and self._state_can_recall(request):
            if self.recalled(request, needle) is None:
                return False, self.act(request, tool="Recall", arguments={"query": needle.search, "top_k": 5})
        return False, None

    @staticmethod
    def _state_can_recall(request: ModelRequest) -> bool:
        for t in request.tools:
            if t.name == EMIT_STATE:
                action = t.parameters.get("properties", {}).get("action", {})
                return "Recall" in action.get("properties", {}).get("tool", {}).get("enum", [])
        return False

    # ------------------------------------------------------------------ the two kinds of call

    @abc.abstractmethod
    def turn(self, request: ModelRequest) -> ModelResponse:
        """What a workload's model answers to an ordinary (turn) call."""

    def summarize(self, request: ModelRequest) -> str:
        """A summary or recap any reader could write without knowing what will be asked:
        the leading sentence of each message of the span, in order, with its ``[#seq]``
        pointer, up to a fixed size (earliest first; what does not fit is left out). It
        never looks at the workload's needles, so a value survives only where the span's
        own leading sentences carry it."""
        instructions = str(request.messages[0].get("content") or "")
        target = self.recap_tokens if request.purpose == "recap" else self.summary_tokens
        limit = re.search(r"At most (\d+) characters", instructions)
        max_chars = min(int(limit.group(1)) if limit else 10**9, target * 4)
        return extractive_summary(request, max_chars=max_chars, words_per_line=24) or "The conversation went on."
