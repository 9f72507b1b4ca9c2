"""The one narrow interface between the run loop and a model.

A provider has a single required async call, :meth:`ModelProvider.complete`. The run
loop builds a :class:`ModelRequest` (messages in litellm / OpenAI chat format, the
tools offered, and optionally a JSON Schema the reply must follow) and gets back a
:class:`ModelResponse` (text and/or tool calls, and the usage the provider reported).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from loomrt.messages import ToolCall

__all__ = ["Purpose", "Usage", "ToolSchema", "ModelRequest", "ModelResponse", "Capabilities", "ModelProvider"]

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
    message before it changes it (the litellm gateway does).
    """

    messages: list[dict[str, Any]]
    tools: tuple[ToolSchema, ...] = ()
    max_tokens: int = 1024
    temperature: float | None = None
    purpose: Purpose = "turn"
    response_schema: dict[str, Any] | None = None
    tool_choice: Literal["auto", "required"] = "auto"


@dataclass(frozen=True)
class ModelResponse:
    """What the model answered."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    finish_reason: str | None = None


@dataclass(frozen=True)
class Capabilities:
    """Facts about a model, from the registry (see :mod:`loomrt.providers.registry`)."""

    local: bool = False
    context_window: int = 8192
    tool_calling: bool = True
    structured_output: bool = False


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
