"""The state of one run while it is in memory: its wiring, and its view of the record.

The record and the working context meet in one place, :meth:`RunState.add`: it appends an
event to the record (awaiting the store) and applies it to the run's
:class:`~loomrt.run.projection.RunView`.
Everything the view holds can be rebuilt from the record (:func:`loomrt.run.projection.project`);
the record is the truth, the view a cache of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrt.events import Event
from loomrt.messages import EvictedSpanCallback, Message
from loomrt.payloads import check_payload
from loomrt.providers.base import ModelProvider, Usage
from loomrt.record.store import Store
from loomrt.run.projection import RunView
from loomrt.spec import AgentSpec
from loomrt.tokens import count_messages, count_tools
from loomrt.tools import Toolset

if TYPE_CHECKING:
    from loomrt.run.reducers.base import RetentionMode

__all__ = ["RunState", "RunResult"]


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
    toolset: Toolset = field(default_factory=Toolset)
    callbacks: list[EvictedSpanCallback] = field(default_factory=list)
    listeners: list[Callable[[Event], None]] = field(default_factory=list)
    view: RunView = None  # type: ignore[assignment]
    """The record so far, applied: working context, the mode's slot, totals."""
    _queue: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Events queued by :meth:`emit`, recorded by the next :meth:`add` (or :meth:`flush`)."""

    def __post_init__(self) -> None:
        if self.view is None:
            self.view = RunView(mode=self.mode)

    async def add(self, kind: str, data: dict[str, Any]) -> Event:
        """Append an event to the record, apply it to the view, and tell the listeners.
        Events that optional parts queued (:meth:`emit`) are written first, in order."""
        if kind != "run_started":
            await self.flush()
        event = await self._write(kind, data)
        if kind == "run_started":
            await self.flush()
        return event

    async def _write(self, kind: str, data: dict[str, Any]) -> Event:
        check_payload(kind, data)  # a payload that drifts from its documented shape is a bug, caught here
        event = await self.store.write(self.run_id, kind, data)
        self.view.apply(event)
        for listener in list(self.listeners):
            listener(event)
        return event

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Queue an event from an optional part (a notice, a callback error), from code that
        is not async; it is recorded before the run's next event (never before ``run_started``)."""
        self._queue.append((kind, data))

    async def flush(self) -> None:
        """Record the queued events (once the run has started)."""
        if self.view.last_seq == 0:
            return
        while self._queue:
            kind, data = self._queue.pop(0)
            await self._write(kind, data)

    # what the view knows, by the names the loop and the tests use
    @property
    def context(self) -> list[Message]:
        return self.view.context

    @property
    def state(self) -> dict[str, Any] | None:
        return self.view.state

    @property
    def usage(self) -> Usage:
        return self.view.usage

    @property
    def model_calls(self) -> int:
        return self.view.model_calls

    @property
    def distillations(self) -> int:
        return self.view.distillations

    @property
    def output(self) -> str | None:
        return self.view.output

    @property
    def last_seq(self) -> int:
        return self.view.last_seq

    @property
    def reported_prompt_tokens(self) -> int:
        return self.view.reported_prompt_tokens

    @property
    def budget(self) -> int:
        """The working-context budget: budget_tokens, or the model's window if smaller."""
        return min(self.spec.context.budget_tokens, self.provider.capabilities.context_window)

    def estimate(self) -> int:
        """The estimated size of the next call: the working context and the tool schemas sent with it."""
        return count_messages(self.context) + count_tools(self.mode.offered_tools(self))

    def pressure(self) -> int:
        """The larger of the estimated size of the next call and the last reported prompt tokens."""
        return max(self.estimate(), self.view.reported_prompt_tokens)


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
