"""The shape every retention mode shares.

A :class:`RetentionMode` decides, for the loop, everything that differs between modes, so
the loop itself never branches on the mode:

- :meth:`~RetentionMode.offered_tools`, :meth:`~RetentionMode.tool_choice` and
  :meth:`~RetentionMode.response_schema`: what the model is offered;
- :meth:`~RetentionMode.interpret`: what a model reply means (final answer, tool calls,
  or ask again);
- :meth:`~RetentionMode.should_distil` and :meth:`~RetentionMode.reduce`: when a
  boundary fires, and the reducer itself: given the working context, return the new
  working context and the evicted span (a :class:`Reduction`);
- :meth:`~RetentionMode.new_slot` and :meth:`~RetentionMode.replay`: the mode's own state
  on the run (``run.view.slot``), rebuilt from the mode's own events.

A new mode is one module beside this one, plus one line in
:data:`loomrt.spec.RETENTION_MODES` (see docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrt.events import Event
from loomrt.messages import Message, ToolCall
from loomrt.providers.base import ModelResponse, ToolSchema
from loomrt.run.steps import FinalOutput, NextStep, RunTools
from loomrt.tokens import count_text, cut_text

if TYPE_CHECKING:
    from loomrt.record.store import Store
    from loomrt.run.projection import RunView
    from loomrt.run.state import RunState
    from loomrt.tools import Tool

__all__ = ["cut_note", "Reduction", "Declined", "RetentionMode"]


def cut_note(message: Message, limit: int) -> str:
    """The first part of ``message`` that fits ``limit`` tokens, with a note that says it was
    cut and where the full text is (its seq on the record: ``loomrt runs show RUN --seq N``).

    The note does not name the run: the model cannot use the id, and a random id's token
    count differs from run to run, so two runs of the same work would meet their budget at
    different turns."""
    size = count_text(message.content)
    note = (
        f"\n[cut: this message is {size} tokens, over the limit of {limit} (context.message_max_tokens); "
        f"only its start is shown. The full text is on the record as message #{message.seq}.]"
    )
    return cut_text(message.content, max(16, limit - count_text(note))) + note


@dataclass(frozen=True)
class Reduction:
    """A reducer's result: the new working context, the span it evicted, and the mode's
    own payload for the distillation event (``summary`` text, ``state`` Σ, ...)."""

    context: list[Message]
    evicted: list[Message]
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Declined:
    """A reducer's refusal: nothing is evicted. ``paid`` when a model call was made for it."""

    reason: str
    paid: bool = False


class RetentionMode:
    """The base of every mode: never distils, offers the run's tools, a plain reply is the answer."""

    name = "base"

    # ------------------------------------------------------------------ the mode's slot

    def new_slot(self) -> Any:
        """The mode's own state on a fresh run (``run.view.slot``); None when it keeps none."""
        return None

    def replay(self, event: Event, view: RunView) -> None:
        """Apply one of the mode's own events to ``view`` (live and from the record alike)."""

    def state_of(self, slot: Any) -> dict[str, Any] | None:
        """Σ, for modes that keep one."""
        return None

    def queued(self, view: RunView) -> bool:
        """Whether a distillation is queued for between turns: fold's soft watermark, or a
        recap or compaction due in a chat (:attr:`between_turns`)."""
        return view.distillation_queued

    def status(self, view: RunView) -> dict[str, Any] | None:
        """The mode's own state as ``runs show`` reports it (fold: pending, last success, ...)."""
        return None

    # ------------------------------------------------------------------ the boundary

    def threshold_pct(self, run: RunState) -> int | None:
        """Distil when pressure reaches this % of the budget; None never distils."""
        return None

    between_turns = False
    """In an interactive run, a distillation due at the watermark waits for the end of the
    turn and is written while the user types (``distillation_queued``). Inside a turn only a
    context at the whole budget (the hard watermark) is distilled, or one queued before the
    turn's input that nothing wrote between turns (a chat killed meanwhile). Recap and
    compaction do this; fold queues by its own rules, and stateful distils at every step."""

    def should_distil(self, run: RunState) -> bool:
        pct = self.threshold_pct(run)
        if pct is None or not self.may_try(run):
            return False
        pressure = run.pressure()
        if pressure * 100 < pct * run.budget:
            return False
        if not (self.between_turns and run.interactive) or pressure >= run.budget:
            return True
        queued = run.view.queued_at
        if queued is not None and queued < (run.view.input_seq or 0):
            return True  # nothing wrote it between turns (a chat killed meanwhile, its lease held): now
        if queued is None:
            run.emit("distillation_queued", {"mode": self.name, "pressure": pressure, "budget": run.budget})
        return False

    def may_try(self, run: RunState) -> bool:
        """False while the last decline still holds: nothing was added since, or (a paid
        one) the context and the pressure have not grown by 5% of the budget since; and
        while nothing was added since the last distillation (the loop calls the model right
        after one, and a run resumed there must too, not distil or queue again)."""
        view = run.view
        if len(run.context) in (view.declined_at, view.distilled_len):
            return False
        if view.declined_size >= 0:  # the last paid distillation bought nothing: wait until something grew
            size, step = run.estimate(), run.budget // 20
            if size < view.declined_size + step and run.pressure() < view.declined_pressure + step:
                return False
        return True

    async def reduce(self, run: RunState) -> Reduction | Declined | None:
        """The reducer: the new working context and the evicted span; None when there is
        nothing to evict; :class:`Declined` when it would not make a sound result."""
        return None

    # ------------------------------------------------------------------ a model call

    def system_lines(self, spec: Any) -> list[str]:
        """Lines this mode adds to the system prompt."""
        return []

    def granted_tools(self, run: RunState) -> list[Tool]:
        """Tools the mode grants every run of it (fold: Describe, Expand, Grep), through
        :func:`loomrt.toolset.resolve_toolset`."""
        return []

    def fork_catalog(self, store: Store, run_id: str, seq: int) -> list[dict[str, Any]] | None:
        """A fork's starting catalog, read from the parent's record without replaying it
        (fold); None: the fork replays its parent's record up to ``seq`` (every other mode)."""
        return None

    async def refold(self, run: RunState, *, fallback_only: bool) -> Reduction | None:
        """New cards over the same coverage for the catalog's cards (fold); other modes have none."""
        from loomrt.errors import SpecError

        raise SpecError(f"run {run.run_id} is in {self.name} mode, which writes no cards: refold is for fold runs")

    def cut_note(self, message: Message, limit: int) -> str:
        """What the working context holds of a message over ``context.message_max_tokens``."""
        return cut_note(message, limit)

    async def unanswered_calls(self, run: RunState, calls: list[ToolCall]) -> list[ToolCall]:
        """The tool calls a resumed run must settle, given the last assistant message's
        unanswered ones (a mode whose actions are not the message's calls maps them)."""
        return calls

    def offered_tools(self, run: RunState) -> tuple[ToolSchema, ...]:
        return tuple(t.schema for t in run.toolset.tools.values())

    def tool_choice(self, run: RunState) -> str:
        return "auto"

    def response_schema(self, run: RunState) -> dict[str, Any] | None:
        return None

    async def interpret(self, run: RunState, response: ModelResponse) -> NextStep:
        """Record the assistant message; tool calls mean act, plain text means answer."""
        message = Message(role="assistant", content=response.text, tool_calls=response.tool_calls)
        await run.add("assistant_message", {"message": message.to_dict()})
        if response.tool_calls:
            return RunTools(response.tool_calls)
        return FinalOutput(response.text)
