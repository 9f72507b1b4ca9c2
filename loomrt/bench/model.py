"""The benchmarks' scripted model: deterministic replies, and reading rules blind to the gold values.

A :class:`BenchModel` answers through a :class:`~loomrt.testing.FunctionProvider`, so the
runs it drives are real runs of the runtime: the loop, the reducers, the record and
Recall all do their work; only the model's words are generated.

It never looks at the gold values (the workload grades what it says). It behaves as a
cooperative but uninformed model would:

- to answer a question it quotes the line of its prompt that shares the most content words
  with the question (:mod:`loomrt.bench.reader`); if no line shares enough and ``Recall``
  is offered, it calls Recall once with the question's own words, then quotes the best
  line of context and results (wrong, if a lossy summary kept a related line instead);
- in stateful mode (``emit_state`` offered) it acts only through ``emit_state``, noting in Σ
  what any model would note without knowing the questions (the workload's
  :meth:`BenchModel.worth_noting`: in a chat, the sentences the user asked it to note);
- its summaries and recaps are extractive: the leading sentence of each message of the
  span (at most 24 words of it), earliest first, up to a fixed size;
- its usage is counted with another tokenizer than the runtime's estimate (words and
  punctuation marks, ×1.1), so the runtime's ``max(estimate, reported)`` pressure rule is
  exercised: reported input runs ~10-20% above the estimate on the workloads' prose.
"""

from __future__ import annotations

import abc
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from loomrt.bench.reader import ANSWER_OVERLAP, STOP_WORDS, best_line
from loomrt.messages import SEARCH_TOOLS, ToolCall
from loomrt.providers.base import ModelRequest, ModelResponse, Usage
from loomrt.providers.scripted import extractive_summary

__all__ = [
    "Needle",
    "BenchModel",
    "prompt_text",
    "readable",
    "newest",
    "reported_tokens",
    "schema_tokens",
    "recall_texts",
]

EMIT_STATE = "emit_state"


@dataclass(frozen=True)
class Needle:
    """An exact value a workload plants, and the words a model would search it by (one class
    for every workload and measure that plants values)."""

    key: str
    """What the value is ("the deploy lock file"): the words a line that holds it names."""
    value: str
    query: str = ""
    """The words a model would search it by (default: ``key``)."""
    statement: str = ""
    """The sentence that states it, where the planter writes one (the Recall measures)."""
    kind: str = ""
    """What sort of value it is (path, id, number, ...), where the planter says."""
    question: str = ""
    """How a person asks for it later, in other words than the statement's (sharing one or
    two of its content words), where the planter writes one: the reader searches by it."""

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


def newest(messages: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """The newest message of a prompt that the conversation holds, and its index: a block of
    recalled passages the runtime put after it (recall injection) is read as part of the
    prompt, never taken for the newest turn or tool result."""
    from loomrt.injection import BLOCK_HEADER

    for i in range(len(messages) - 1, -1, -1):
        if not str(messages[i].get("content") or "").startswith(BLOCK_HEADER):
            return i, messages[i]
    return -1, {}


def readable(message: dict[str, Any]) -> str:
    """What a model reads in one message as a source of answers: its content, and the
    arguments of its tool calls other than searches (Recall, Grep, …: a query is not an answer)."""
    calls = [tc for tc in message.get("tool_calls") or () if tc.get("function", {}).get("name") not in SEARCH_TOOLS]
    return prompt_text([{"content": message.get("content"), "tool_calls": calls}])


_PIECE = re.compile(r"\w+|[^\w\s]")


def reported_tokens(text: str) -> int:
    """The scripted provider's own token count: words and punctuation marks, ×1.1 (not cl100k)."""
    return max(1, round(len(_PIECE.findall(text)) * 1.1))


def schema_tokens(tools: Any) -> int:
    """The scripted provider's count of the tool schemas sent with a call: a provider bills
    them as prompt tokens, and a mode that offers more tools pays for them on every call."""
    return sum(reported_tokens(json.dumps(t.to_litellm())) for t in tools)


def recall_texts(content: str) -> list[str]:
    """The ``text`` of each result in a Recall tool result (JSON); the content itself if it is not one."""
    try:
        answer = json.loads(content[content.index("{") :])
    except ValueError:
        return [content]
    return [str(r.get("text", "")) for r in answer.get("results", [])] if isinstance(answer, dict) else [content]


@dataclass
class BenchModel(abc.ABC):
    """The model side of a workload. Subclasses decide what a ``turn`` call answers.

    It holds no gold values: a workload tells it what to answer or do, never the value it
    should find, and grades its replies and calls from outside against the gold it keeps
    (tests/test_bench.py walks it for every gold value at every call of a play).
    """

    summary_tokens: int = 400
    recap_tokens: int = 450
    seed: int = 0
    patched: set[str] = field(default_factory=set)
    """The values noted in Σ so far (stateful mode)."""
    _calls: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # ------------------------------------------------------------------ plumbing

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self._calls += 1
        if request.purpose in ("recap", "summary", "fold"):
            return self.respond(request, self.summarize(request))
        return self.turn(request)

    def respond(self, request: ModelRequest, text: str = "", calls: tuple[ToolCall, ...] = ()) -> ModelResponse:
        """A reply whose usage the provider's own tokenizer counted (see :func:`reported_tokens`)."""
        out = reported_tokens(text) + sum(reported_tokens(json.dumps(c.arguments)) for c in calls)
        prompt = sum(4 + reported_tokens(prompt_text([m])) for m in request.messages) + schema_tokens(request.tools)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            model="bench/scripted",
            usage=Usage(prompt, max(1, out), 0),
            finish_reason="tool_calls" if calls else "stop",
        )

    def call(self, name: str, arguments: dict[str, Any]) -> ToolCall:
        return ToolCall(id=f"call_{self._calls}_{name}", name=name, arguments=arguments)

    @staticmethod
    def offers(request: ModelRequest, name: str) -> bool:
        return any(t.name == name for t in request.tools)

    def worth_noting(self, request: ModelRequest) -> dict[str, str]:
        """What a cooperative model keeps in Σ from the newest message (the workload decides; none here)."""
        return {}

    def act(
        self,
        request: ModelRequest,
        *,
        text: str = "",
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> ModelResponse:
        """Reply with ``text`` or call ``tool``: directly, or through emit_state in stateful mode."""
        if not self.offers(request, EMIT_STATE):
            if tool:
                return self.respond(request, "", (self.call(tool, arguments or {}),))
            return self.respond(request, text)
        new = {k: v for k, v in self.worth_noting(request).items() if v not in self.patched}
        self.patched.update(new.values())
        emit: dict[str, Any] = {
            "reasoning": "Noting what I learned and deciding the next step.",
            "patch": {"notes": new} if new else {},
        }
        if tool:
            emit["action"] = {"tool": tool, "arguments": arguments or {}}
        else:
            emit.update(done=True, final=text)
        return self.respond(request, "", (self.call(EMIT_STATE, emit),))

    @staticmethod
    def recall_result(request: ModelRequest) -> list[str] | None:
        """The result texts if the newest message is a Recall result, else None."""
        _, last = newest(request.messages)
        content = str(last.get("content") or "")
        if last.get("role") == "tool" and last.get("name") == "Recall":
            return recall_texts(content)
        if last.get("role") == "user" and content.startswith("Last observation (Recall)"):
            return recall_texts(content)
        return None

    @staticmethod
    def last_tool(request: ModelRequest) -> tuple[str, str]:
        """The newest message's tool name and content, if it is a tool result."""
        _, last = newest(request.messages)
        return (str(last.get("name") or ""), str(last.get("content") or "")) if last.get("role") == "tool" else ("", "")

    def dig(self, request: ModelRequest, question: str, query: str) -> ModelResponse | None:
        """fold's tools, after Recall found nothing: Grep the history for the query's three
        longest words that are not stop words, then Expand the hit that shares the most words with the
        question (a reader's way to the exact words; it never sees the gold value)."""
        name, content = self.last_tool(request)
        if name == "Grep":
            try:
                hits = json.loads(content).get("hits") or []
            except (ValueError, AttributeError):
                return None
            if not hits:
                return None
            best = max(hits, key=lambda h: best_line(question, [str(h.get("snippet", ""))])[1])
            return self.act(request, tool="Expand", arguments={"id": str(best.get("id"))})
        if name in ("Expand",) or not self.offers(request, "Grep"):
            return None
        words = sorted(
            {w for w in re.findall(r"[A-Za-z0-9_.'-]{4,}", query) if w.lower() not in STOP_WORDS}, key=len, reverse=True
        )[:3]
        if not words:
            return None
        pattern = "|".join(re.escape(w) for w in words)
        return self.act(request, tool="Grep", arguments={"pattern": pattern, "scope": "messages", "limit": 50})

    def look_up(
        self, request: ModelRequest, question: str, query: str, *, asked_in: str = ""
    ) -> tuple[str, ModelResponse | None]:
        """The line this model would answer ``question`` from, or the Recall call it makes first.

        It reads its whole prompt but its own Recall queries (and the sentence ``asked_in``,
        where the question was put to it: a question is not its own answer). A line
        sharing :data:`~loomrt.bench.reader.ANSWER_OVERLAP` content words is an answer; if
        none does and Recall is offered (and was not just called), it recalls with ``query``;
        after a Recall it quotes the best line of context and results, if one shares enough.
        """
        recalled = self.recall_result(request)
        tool, _ = self.last_tool(request)
        texts = [readable(m) for m in request.messages]
        if asked_in:
            texts = [t.replace(asked_in, "") for t in texts]
        if recalled is not None:
            at = newest(request.messages)[0]
            texts[at : at + 1] = recalled
        line, score = best_line(question, texts)
        if score >= ANSWER_OVERLAP:
            return line, None
        if (
            recalled is None
            and tool not in ("Grep", "Expand")
            and (self.offers(request, "Recall") or self._state_can_recall(request))
        ):
            return "", self.act(request, tool="Recall", arguments={"query": query, "top_k": 5})
        return "", self.dig(request, question, query)

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
        own leading sentences carry it. (The runtime carries the earlier block forward
        itself; the call asks for the new span's account, in the last size it names.)"""
        instructions = prompt_text(request.messages)
        target = self.recap_tokens if request.purpose == "recap" else self.summary_tokens
        limits = re.findall(r"at most (\d+) characters", instructions, re.IGNORECASE)
        max_chars = min(int(limits[-1]) if limits else 10**9, target * 4)
        return extractive_summary(request, max_chars=max_chars, words_per_line=24) or "The conversation went on."
