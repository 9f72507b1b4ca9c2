"""The state of one run while it is in memory: its working context, Σ, totals and wiring.

Everything here can be rebuilt from the record (:mod:`loomrt.run.projection`); the
record is the truth, this is a cache of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrt.events import Event
from loomrt.messages import EvictedSpan, Message
from loomrt.providers.base import ModelProvider, Usage
from loomrt.record.store import Store
from loomrt.spec import AgentSpec
from loomrt.tokens import count_messages

if TYPE_CHECKING:
    from loomrt.run.reducers.base import RetentionMode
    from loomrt.toolset import Toolset

__all__ = ["EvictedSpanCallback", "RunState", "RunResult"]

EvictedSpanCallback = Callable[[EvictedSpan], Awaitable[None] | None]
"""Receives every evicted span; one that raises is recorded as a callback_error event."""


@dataclass
class RunState:
    """One run in memory."""

    run_id: str
    agent: str
    spec: AgentSpec
    """The run's own deep clone of the agent definition."""
    mode: RetentionMode
    interactive: bool
    store: Store
    provider: ModelProvider
    summarizer: ModelProvider
    toolset: Toolset
    callbacks: list[EvictedSpanCallback] = field(default_factory=list)
    context: list[Message] = field(default_factory=list)
    state: dict[str, Any] | None = None
    usage: Usage = field(default_factory=Usage)
    model_calls: int = 0
    distillations: int = 0
    reported_prompt_tokens: int = 0
    """Prompt tokens the provider reported on the last turn call (0 after a distillation)."""
    declined_at: int = -1
    """Length of the context when the last distillation was declined (no retry until it grows)."""
    declined_tokens: int = -1
    """Estimated context size when a summary call last bought nothing: a prose mode retries
    (and pays for another summary call) only once the context has grown by 5% of the budget."""
    patch_failures: int = 0
    output: str | None = None
    last_seq: int = 0
    listeners: list[Callable[[Event], None]] = field(default_factory=list)

    def record(self, kind: str, data: dict[str, Any]) -> Event:
        """Append an event to the record and tell the listeners."""
        event = self.store.append(self.run_id, kind, data)
        self.last_seq = event.seq
        for listener in list(self.listeners):
            listener(event)
        return event

    @property
    def budget(self) -> int:
        """The working-context budget: budget_tokens, or the model's window if smaller."""
        return min(self.spec.context.budget_tokens, self.provider.capabilities.context_window)

    def pressure(self) -> int:
        """The larger of the estimated context size and the last reported prompt tokens."""
        return max(count_messages(self.context), self.reported_prompt_tokens)


@dataclass
class RunResult:
    """What a run (or one turn of an interactive run) produced."""

    run_id: str
    agent: str
    mode: str
    status: str
    """done, parked, or failed."""
    output: str | None
    state: dict[str, Any] | None
    usage: Usage
    model_calls: int
    distillations: int
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The object `loomrt run --json` prints."""
        out = {
            "run_id": self.run_id,
            "agent": self.agent,
            "mode": self.mode,
            "status": self.status,
            "output": self.output,
            "state": self.state,
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
                "model_calls": self.model_calls,
            },
            "distillations": self.distillations,
        }
        if self.error:
            out["error"] = self.error
        return out
