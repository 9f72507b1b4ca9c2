"""The one narrow interface between the run loop and a model.

A provider has a single required async call, :meth:`ModelProvider.complete`. The run
loop builds a :class:`ModelRequest` (messages in litellm / OpenAI chat format, the
tools offered, and optionally a JSON Schema the reply must follow) and gets back a
:class:`ModelResponse` (text and/or tool calls, and the usage the provider reported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from loomrt.messages import ToolCall

__all__ = [
    "Purpose",
    "Usage",
    "ToolSchema",
    "ModelRequest",
    "ModelResponse",
    "STOPPED_BY_CALLER",
    "Capabilities",
    "ModelProvider",
    "ARGUMENTS_MAX_DEPTH",
    "nesting_depth",
    "malformed_call",
]

Purpose = Literal["turn", "recap", "summary", "fold", "extract"]


@dataclass(frozen=True)
class Usage:
    """Tokens one call used, as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_tokens + other.cached_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
        }


@dataclass(frozen=True)
class ToolSchema:
    """A tool as offered to the model."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_litellm(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ModelRequest:
    """One model call.

    ``purpose`` says why the loop calls: ``turn`` (an iteration of the agent),
    ``recap`` or ``summary`` (a distillation). ``response_schema`` asks for a JSON reply
    that follows the schema (constrained decoding where the provider supports it).
    ``messages`` may share its dicts with the run's working context: a provider copies a
    message before it changes it (the litellm gateway does). ``on_text``, where set, hears
    the reply's text piece by piece as the model writes it (a provider that streams calls
    it; one that does not never does); the response still carries the whole text.
    ``stop_when``, where set, is asked with the reply's text so far as the model writes it
    (the embedded model asks it at every token): once it is true the model stops, and the
    response's ``finish_reason`` is :data:`STOPPED_BY_CALLER`, its text what was written,
    unchecked (a JSON reply may be cut mid-value: the caller reads what it asked to cut). A
    provider that does not generate locally never asks it. ``reply_prefix``, where set, is
    the text the reply begins with: the embedded model writes on from it (a recap written
    after ``Recap:`` cannot begin by copying its transcript), and the response's text starts
    with it. A provider that cannot begin a reply for the model ignores it.
    """

    messages: list[dict[str, Any]]
    tools: tuple[ToolSchema, ...] = ()
    max_tokens: int = 1024
    temperature: float | None = None
    purpose: Purpose = "turn"
    response_schema: dict[str, Any] | None = None
    tool_choice: Literal["auto", "required"] = "auto"
    on_text: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    stop_when: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)
    reply_prefix: str = ""


STOPPED_BY_CALLER = "stop_when"
"""The finish reason of a reply the request's ``stop_when`` stopped."""


@dataclass(frozen=True)
class ModelResponse:
    """What the model answered."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    finish_reason: str | None = None


ARGUMENTS_MAX_DEPTH = 64
"""How deep a tool call's arguments may nest. A real tool's arguments nest a few levels; a
degenerate reply (``{"a":{"a":...`` thousands deep) would overflow every reader of the record."""


def nesting_depth(value: Any, limit: int = ARGUMENTS_MAX_DEPTH) -> int:
    """How deep ``value`` nests (a scalar is 0), counted without recursion; ``limit + 1`` as
    soon as it is known to be deeper than ``limit``."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list | tuple) else None
        if children is None:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return limit + 1
        stack.extend((child, depth) for child in children)
    return deepest


def malformed_call(call: Any) -> str | None:
    """What is wrong with one tool call of a reply, or None: a provider's call must have a
    name and arguments that are a JSON object nesting at most :data:`ARGUMENTS_MAX_DEPTH` deep."""
    name = getattr(call, "name", None)
    args = getattr(call, "arguments", None)
    if not isinstance(name, str) or not name:
        return f"a tool call without a name ({call!r:.200})"
    if not isinstance(args, dict):
        return f"the arguments for tool {name!r} are not a JSON object: {args!r:.200}"
    if nesting_depth(args) > ARGUMENTS_MAX_DEPTH:
        return f"the arguments for tool {name!r} nest more than {ARGUMENTS_MAX_DEPTH} levels deep"
    return None


@dataclass(frozen=True)
class Capabilities:
    """Facts about a model, from the registry (see :mod:`loomrt.providers.registry`)."""

    local: bool = False
    context_window: int = 8192
    tool_calling: bool = True
    structured_output: bool = False
    one_call_turns: bool = False
    """A model without native tool calls decides and answers in one generation: a grammar
    lets it open a tool-call JSON object or write the answer as text (the embedded model
    only, and its default). False: it decides first, then writes the answer in a second call."""


@runtime_checkable
class ModelProvider(Protocol):
    """Anything that can answer a :class:`ModelRequest`."""

    model: str
    """The model string it serves (e.g. ``local/qwen2.5-coder-1.5b``)."""
    capabilities: Capabilities
    """What the registry knows about it."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer one request. Raise :class:`~loomrt.errors.ProviderError` on failure
        (``retryable=True`` for 429, 5xx and timeouts)."""
        ...
