"""The scripted provider: deterministic replies for tests, benchmarks and demos.

From YAML, ``model: scripted/PATH`` reads a script file (PATH relative to the agents file)::

    local: true            # optional; scripted runs count as local unless this says false
    context_window: 8192   # optional
    turns:                 # ordinary model calls take these in order
      - text: "plain assistant reply"
      - tool_call: {name: Recall, arguments: {query: "staging db port"}}
      - emit_state: {patch: {step: 2}, done: false}
        usage: {input_tokens: 7000}      # optional: simulate reported prompt tokens
        delay_s: 0.5                     # optional: simulate a slow model (seconds before the reply)
        stream_s: 0.05                   # optional: seconds between the streamed words of the text
    summaries:             # recap / compaction calls take these in order; the last one repeats
      - "Recap: ..."
      - extractive: 600    # or: the leading sentence of each message of the span, up to 600 characters
        words: 12          #   (optional) at most 12 words of each
      - text: "Recap: ..."
        delay_s: 2         # a slow summariser (seconds before the reply)

A turn's text streams word by word to a request's ``on_text`` (where the run has a watcher,
as a chat does), as a provider that streams would send it.

From Python, ``ScriptedProvider(turns=[...], summaries=[...])`` takes the same items.
A run that asks for more turns than the script has fails with
:class:`~loomrt.errors.ScriptExhaustedError` naming the script.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from loomrt.errors import ScriptExhaustedError, SpecError
from loomrt.messages import ToolCall
from loomrt.providers.base import Capabilities, ModelRequest, ModelResponse, Usage

__all__ = ["ScriptedProvider", "FunctionProvider", "load_script", "extractive_summary"]

_TURN_KEYS = {"text", "tool_call", "tool_calls", "emit_state", "usage", "extractive", "words", "delay_s", "stream_s"}


class ScriptedProvider:
    """Replies from a script. ``calls`` holds every request it answered."""

    def __init__(
        self,
        turns: list[dict[str, Any] | str] | None = None,
        summaries: list[str | dict[str, Any]] | None = None,
        *,
        local: bool = True,
        context_window: int = 32768,
        name: str = "scripted/inline",
        count_tokens: Callable[[list[dict[str, Any]]], int] | None = None,
    ):
        self.model = name
        where = name.removeprefix("scripted/")
        for key, replies in (("turns", turns), ("summaries", summaries)):
            if replies is not None and not isinstance(replies, list):
                raise SpecError(f"'{key}:' must be a list of replies (got {type(replies).__name__})", where=where)
        self.turns = [t if isinstance(t, dict) else {"text": t} for t in (turns or [])]
        self.summaries = [s if isinstance(s, dict) else {"text": s} for s in (summaries or [])]
        for i, turn in enumerate(self.turns):
            problem = _turn_problem(turn)
            if problem:
                raise SpecError(f"turn {i + 1}: {problem}", where=where)
        self.capabilities = Capabilities(
            local=local, context_window=context_window, tool_calling=True, structured_output=True
        )
        self.calls: list[ModelRequest] = []
        self._turn = 0
        self._summary = 0
        if count_tokens is None:
            from loomrt.tokens import count_dicts as count_tokens
        self._count = count_tokens

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls.append(request)
        if request.purpose == "turn":
            if self._turn >= len(self.turns):
                raise ScriptExhaustedError(
                    f"the script {self.model.removeprefix('scripted/')} has {len(self.turns)} turns "
                    f"and the run asked for turn {self._turn + 1}. Add turns to the script, or lower max_iterations."
                )
            item = self.turns[self._turn]
            self._turn += 1
            if item.get("delay_s"):
                await asyncio.sleep(float(item["delay_s"]))
            reply = self._reply(item, request, call_no=self._turn)
            if request.on_text is not None:
                await _stream(reply.text, request.on_text, float(item.get("stream_s") or 0))
            return reply
        if not self.summaries:
            raise ScriptExhaustedError(
                f"the script {self.model.removeprefix('scripted/')} has no summaries, and a {request.purpose} was asked for. "
                "Add a 'summaries:' list to the script."
            )
        item = self.summaries[min(self._summary, len(self.summaries) - 1)]
        self._summary += 1
        if item.get("delay_s"):
            await asyncio.sleep(float(item["delay_s"]))
        return self._reply(item, request, call_no=self._summary)

    def _reply(self, item: dict[str, Any], request: ModelRequest, call_no: int) -> ModelResponse:
        calls: list[ToolCall] = []
        raw_calls = item.get("tool_calls") or ([item["tool_call"]] if "tool_call" in item else [])
        for j, tc in enumerate(raw_calls):
            calls.append(ToolCall(id=f"call_{call_no}_{j}", name=tc["name"], arguments=dict(tc.get("arguments") or {})))
        if "emit_state" in item:
            calls.append(ToolCall(id=f"call_{call_no}_state", name="emit_state", arguments=dict(item["emit_state"])))
        text = str(item.get("text") or "")
        if item.get("extractive"):
            text = extractive_summary(
                request, max_chars=int(item["extractive"]), words_per_line=int(item.get("words", 40))
            )
        usage = dict(item.get("usage") or {})
        prompt = usage.get("input_tokens")
        if prompt is None:
            prompt = self._count(request.messages) if self._count else 0
        written = text + "".join(json.dumps(c.arguments, ensure_ascii=False) + c.name for c in calls)
        output = usage.get("output_tokens", max(1, len(written) // 4))
        return ModelResponse(
            text=text,
            tool_calls=tuple(calls),
            usage=Usage(int(prompt), int(output), int(usage.get("cached_tokens", 0))),
            model=self.model,
            finish_reason="tool_calls" if calls else "stop",
        )

    def advance(self, turns: int, summaries: int) -> None:
        """Skip replies already used (a resumed run picks up where its record left off)."""
        self._turn = min(turns, len(self.turns))
        self._summary = summaries

    def assert_complete(self) -> None:
        """Fail unless every scripted turn was used."""
        if self._turn != len(self.turns):
            raise AssertionError(f"{self.model}: {len(self.turns) - self._turn} scripted turns were never used")


def _turn_problem(turn: dict[str, Any]) -> str | None:
    """What is wrong with one scripted turn, or None."""
    unknown = set(turn) - _TURN_KEYS
    if unknown or not (set(turn) - {"usage", "delay_s"}):
        return f"must have one of text, tool_call, tool_calls, emit_state (got {sorted(turn)})"
    if "tool_call" in turn and not _is_call(turn["tool_call"]):
        return "tool_call must be a mapping with a name, like {name: calculate, arguments: {expression: '1+1'}}"
    calls = turn.get("tool_calls", [])
    if not isinstance(calls, list) or not all(_is_call(c) for c in calls):
        return "tool_calls must be a list of mappings with a name"
    if "emit_state" in turn and not isinstance(turn["emit_state"], dict):
        return "emit_state must be a mapping, like {reasoning: ..., patch: {step: 2}}"
    if "usage" in turn and not isinstance(turn["usage"], dict):
        return "usage must be a mapping like {input_tokens: 7000}"
    for key in ("delay_s", "stream_s"):
        delay = turn.get(key, 0)
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= 600:
            return f"{key} must be a number of seconds between 0 and 600"
    return None


async def _stream(text: str, on_text: Callable[[str], None], pause_s: float) -> None:
    """Send ``text`` to ``on_text`` a word (with the space after it) at a time."""
    for piece in re.findall(r"\s*\S+\s*|\s+", text):
        on_text(piece)
        if pause_s:
            await asyncio.sleep(pause_s)


def _is_call(call: Any) -> bool:
    return isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("arguments", {}), dict)


class FunctionProvider:
    """A provider whose replies come from a function of the request (sync or async).

    The function returns a :class:`ModelResponse` or a plain string.
    """

    def __init__(
        self,
        fn: Callable[[ModelRequest], ModelResponse | str | Awaitable[ModelResponse | str]],
        *,
        local: bool = True,
        context_window: int = 32768,
        name: str = "function/inline",
    ):
        self.model = name
        self.fn = fn
        self.capabilities = Capabilities(local=local, context_window=context_window, structured_output=True)
        self.calls: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls.append(request)
        out = self.fn(request)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, str):
            return ModelResponse(text=out, model=self.model)
        return out


def load_script(
    path: str | Path, *, count_tokens: Callable[[list[dict[str, Any]]], int] | None = None
) -> ScriptedProvider:
    """Read a script file into a :class:`ScriptedProvider`."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise SpecError(f"the scripted model's script does not exist: {p}", where=str(p)) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"the script is not valid YAML: {exc}", where=str(p)) from None
    except UnicodeDecodeError:
        raise SpecError("the script is not UTF-8 text; save it as UTF-8", where=str(p)) from None
    if not isinstance(data, dict):
        raise SpecError("a script must be a mapping with 'turns:' and optionally 'summaries:'", where=str(p))
    unknown = set(data) - {"turns", "summaries", "local", "context_window"}
    if unknown:
        raise SpecError(
            f"unknown script keys {sorted(unknown)}; known: turns, summaries, local, context_window", where=str(p)
        )
    local, window = data.get("local", True), data.get("context_window", 32768)
    if not isinstance(local, bool):
        raise SpecError(f"'local:' must be true or false, got {local!r}", where=f"{p}: local")
    if isinstance(window, bool) or not isinstance(window, int) or window < 256:
        raise SpecError(
            f"'context_window:' must be a whole number of tokens (at least 256), got {window!r}",
            where=f"{p}: context_window",
        )
    return ScriptedProvider(
        turns=data.get("turns") or [],
        summaries=data.get("summaries") or [],
        local=local,
        context_window=window,
        name=f"scripted/{p}",
        count_tokens=count_tokens,
    )


_TRANSCRIPT = re.compile(r"TRANSCRIPT[^\n]*START\n(.*?)\nTRANSCRIPT END", re.S)
_SENTENCE = re.compile(r"(.+?[.!?])(\s|$)")


def extractive_summary(request: Any, *, max_chars: int = 1200, words_per_line: int = 40) -> str:
    """A summary any reader could write without knowing what will be asked: the leading
    sentence of each transcript line in the summariser's prompt (at most ``words_per_line``
    words of it), with its ``[#seq]`` pointer, up to ``max_chars`` in all. Deterministic; for benchmarks and tests that need real
    summaries from a scripted model (it never sees the probes)."""
    prompt = "\n".join(str(m.get("content") or "") for m in request.messages if m.get("role") == "user")
    match = _TRANSCRIPT.search(prompt)
    lines = (match.group(1) if match else prompt).splitlines()
    out: list[str] = []
    size = 0
    for line in lines:
        head, _, body = line.partition(": ")
        body = body or head
        first = _SENTENCE.match(body.strip())
        sentence = " ".join((first.group(1) if first else body.strip()).split()[:words_per_line])
        pointer = head.split(" ", 1)[0] if head.startswith("[#") and not sentence.startswith("[#") else ""
        item = f"{pointer} {sentence}".strip()
        if size + len(item) > max_chars:
            break
        out.append(item)
        size += len(item) + 1
    return "\n".join(out)
