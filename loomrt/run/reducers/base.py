"""The shape every retention mode shares.

A :class:`RetentionMode` decides three things for the loop, so the loop itself never
branches on the mode:

- :meth:`~RetentionMode.offered_tools`: which tools the model is offered;
- :meth:`~RetentionMode.interpret`: what a model reply means (final answer, tool calls,
  or ask again);
- :meth:`~RetentionMode.should_distil` and :meth:`~RetentionMode.reduce`: when a
  boundary fires, and the reducer itself: given the working context, return the new
  working context and the evicted span (a :class:`Reduction`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loomrt.messages import Message
from loomrt.providers.base import ModelResponse, ToolSchema
from loomrt.run.state import RunState
from loomrt.run.steps import FinalOutput, NextStep, RunTools
from loomrt.tokens import count_messages

__all__ = ["Reduction", "RetentionMode"]


@dataclass(frozen=True)
class Reduction:
    """A reducer's result: the new working context and the span it evicted."""

    context: list[Message]
    evicted: list[Message]
    summary: str | None = None
    """The recap or summary text, when the mode writes one."""
    state: dict[str, Any] | None = None
    """Σ, in stateful mode."""
    extra: dict[str, Any] = field(default_factory=dict)


class RetentionMode:
    """append: keep everything. The other modes override what differs."""

    name = "append"

    def threshold_pct(self, run: RunState) -> int | None:
        """Distil when pressure reaches this % of the budget; None never distils."""
        return run.spec.context.autocompact_at_pct if run.spec.context.backstop else None

    def should_distil(self, run: RunState) -> bool:
        pct = self.threshold_pct(run)
        if pct is None or len(run.context) == run.declined_at:
            return False
        if run.declined_tokens >= 0 and count_messages(run.context) < run.declined_tokens + run.budget // 20:
            return False
        return run.pressure() * 100 >= pct * run.budget

    def system_lines(self, spec: Any) -> list[str]:
        """Lines this mode adds to the system prompt."""
        return []

    def offered_tools(self, run: RunState) -> tuple[ToolSchema, ...]:
        return tuple(t.schema for t in run.toolset.tools.values())

    def tool_choice(self, run: RunState) -> str:
        return "auto"

    def response_schema(self, run: RunState) -> dict[str, Any] | None:
        return None

    async def interpret(self, run: RunState, response: ModelResponse) -> NextStep:
        """Record the assistant message; tool calls mean act, plain text means answer."""
        message = Message(role="assistant", content=response.text, tool_calls=response.tool_calls)
        event = run.record("assistant_message", {"message": message.to_dict()})
        run.context.append(message.with_(seq=event.seq, ts=event.ts))
        if response.tool_calls:
            return RunTools(response.tool_calls)
        return FinalOutput(response.text)

    async def reduce(self, run: RunState) -> Reduction | None:
        """append's reducer is the compaction backstop (when enabled)."""
        from loomrt.run.reducers.compaction import compact

        return await compact(run)
