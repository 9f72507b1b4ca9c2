"""fold: history folded into a tree of immutable summary cards that unfold to the exact words.

The working context is: system, pins, the catalog's cards in order, the raw recent
messages. A fold (:mod:`.plan` says which) turns the oldest raw stretch outside the tail
into a leaf card, or ``fold.rollup`` adjacent cards of one depth into a card a level
higher; :mod:`.writer` writes and checks each card. The fold's distillation event holds
the cards it wrote (``cards``) and the new catalog (``context``, cards by id); nothing is
evicted from the record, and the Describe, Expand and Grep tools (:mod:`.tools`) read any
card back down to the verbatim messages.

When: at call assembly (just before a model call), pressure at ``fold.hard_pct`` folds at
once; at ``fold.soft_pct`` a fold is queued (``fold_queued``) for between turns (the chat,
``loomrt runs fold``), unless the run was active within ``fold.cache_idle_s`` (its
prompt prefix is likely cached) and pressure is under 85%.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrt.crashpoints import reached
from loomrt.events import Event
from loomrt.messages import Message
from loomrt.run.cards import CARD_BLOCK, Card, card_message
from loomrt.run.reducers.base import Declined, Reduction, RetentionMode
from loomrt.run.reducers.fold.plan import next_step
from loomrt.run.reducers.fold.writer import CardWriter, FoldSkipped
from loomrt.tokens import count_messages, count_text, count_tools

if TYPE_CHECKING:
    from loomrt.run.projection import RunView
    from loomrt.run.state import RunState
    from loomrt.tools import Tool

__all__ = ["FoldMode", "FoldSlot", "EXTERNAL", "PAUSE_AFTER", "PAUSE_S", "DEFER_ESCAPE_PCT", "fold_prompt"]

EXTERNAL = "external"
"""The ``synthetic`` tag of a tool result the tail holds as a reference (its text is on the record)."""
PAUSE_AFTER = 5
"""Consecutive failed folds (provider errors) after which folding pauses for the run."""
PAUSE_S = 600.0
"""How long folding pauses then."""
DEFER_ESCAPE_PCT = 85
"""Pressure at which a soft fold is queued even for a run whose cache is likely warm."""
WINDOW_S = 600.0


def fold_prompt(recall: bool, tools: bool = True) -> str:
    """The system prompt's line about cards, naming only the tools the run has."""
    named = [*(["Describe", "Expand", "Grep"] if tools else []), *(["Recall"] if recall else [])]
    if not named:
        return (
            "Older parts of this conversation are folded into <card> blocks: summaries that are maps to the "
            "details, not the details. For exact values the cards do not state, say you are not sure."
        )
    tools_text = ", ".join(named[:-1]) + (" or " if len(named) > 1 else "") + named[-1]
    return (
        "Older parts of this conversation are folded into <card> blocks: summaries that are maps to the details, "
        f"not the details. For exact values (commands, paths, timestamps, numbers, configuration) use {tools_text} "
        f"first{' (Expand takes a card id or a #seq)' if tools else ''}, or say you are not sure."
    )


@dataclass
class FoldSlot:
    """fold mode's state on a run, rebuilt from its events."""

    pending: dict[str, Any] | None = None
    """The queued fold (a ``fold_queued`` event's data), until a fold or a skip settles it."""
    failures: int = 0
    """Consecutive folds that failed on a provider error."""
    paused_until: float = 0.0
    fold_calls: list[float] = field(default_factory=list)
    """When each card-writing call was made (the spend guard's window)."""
    last_turn: float = 0.0
    """When the last turn call was made (cache-idle deferral)."""
    last_success: float | None = None
    last_failure: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pending": self.pending is not None,
            "failures": self.failures,
            "paused_until": self.paused_until or None,
            "last_success": self.last_success,
            "last_failure": self.last_failure,
        }


class FoldMode(RetentionMode):
    name = "fold"

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        """The mode's clock (tests inject one): deferral, pauses and the spend guard read it."""

    def new_slot(self) -> FoldSlot:
        return FoldSlot()

    def replay(self, event: Event, view: RunView) -> None:
        slot: FoldSlot = view.slot
        d = event.data
        match event.kind:
            case "model_call" if d.get("purpose") == "fold":
                slot.fold_calls = [t for t in slot.fold_calls if event.ts - t < WINDOW_S] + [event.ts]
            case "model_call" if d.get("purpose") == "turn":
                slot.last_turn = event.ts
            case "fold_queued":
                slot.pending = dict(d)
            case "distillation":
                slot.pending, slot.failures, slot.paused_until, slot.last_success = None, 0, 0.0, event.ts
            case "fold_skipped":  # settled: queued again at a later call, once any pause is over
                slot.pending = None
                slot.failures = int(d.get("failures", 0))
                slot.paused_until = float(d.get("paused_until") or 0.0)
                slot.last_failure = {"at": event.ts, "reason": d.get("reason"), "error": d.get("error")}

    def queued(self, view: RunView) -> bool:
        return view.slot.pending is not None

    def status(self, view: RunView) -> dict[str, Any] | None:
        return {**view.slot.to_json(), "cards": len(view.cards)}

    # ------------------------------------------------------------------ when

    def should_distil(self, run: RunState) -> bool:
        spec, view = run.spec.context.fold, run.view
        if not self.may_try(run):
            return False
        slot: FoldSlot = view.slot
        pct = run.pressure() * 100 / run.budget
        if pct >= spec.hard_pct:
            return True
        now = self.clock()
        if pct >= spec.soft_pct and slot.pending is None and now >= slot.paused_until:
            idle = now - slot.last_turn >= spec.cache_idle_s
            if idle or pct >= DEFER_ESCAPE_PCT:
                run.emit(
                    "fold_queued",
                    {
                        "pressure": run.pressure(),
                        "budget": run.budget,
                        "reason": "cache idle" if idle else f"pressure at {DEFER_ESCAPE_PCT}% or more",
                    },
                )
        return False

    # ------------------------------------------------------------------ the fold

    async def reduce(self, run: RunState) -> Reduction | Declined | None:
        spec, view, slot = run.spec.context.fold, run.view, run.view.slot
        budget, now = run.budget, self.clock()
        hard = run.pressure() * 100 >= spec.hard_pct * budget
        if now < slot.paused_until:
            return Declined(
                f"folding is paused after {slot.failures} failed folds, until {time.ctime(slot.paused_until)}"
            )
        recent = [t for t in slot.fold_calls if now - t < WINDOW_S]
        writer = CardWriter(run, hard=hard, calls_left=spec.max_calls_per_10min - len(recent))
        context, cards = list(run.context), dict(view.cards)
        written: list[Card] = []
        evicted: list[Message] = []
        counts = {"leaves": 0, "rollups": 0, "externalised": 0}
        tools, target = count_tools(self.offered_tools(run)), spec.fold_target_pct * budget // 100
        scale = run.tokenizer_scale()  # the plan's sizes in the provider's tokens, as pressure reads them
        try:
            while True:
                size = int((count_messages(context) + tools) * scale)
                first = not (written or counts["externalised"])
                step = next_step(
                    context,
                    cards,
                    spec,
                    budget,
                    pressing=first or size > target,
                    critical=size * 100 >= spec.hard_pct * budget,
                )
                if step is None:
                    break
                span = context[step.start : step.end]
                if step.kind == "externalise":
                    context[step.start] = span[0].with_(
                        content=external_note(view.original(span[0])), synthetic=EXTERNAL
                    )
                    counts["externalised"] += 1
                    continue
                if step.kind == "leaf":
                    before = context[step.start - 1] if step.start else None
                    previous = cards.get(before.ref or "") if before and before.synthetic == CARD_BLOCK else None
                    card = await writer.leaf(
                        [view.original(m) if m.synthetic else m for m in span], count_messages(span), previous
                    )
                    evicted.extend(span)
                    counts["leaves"] += 1
                else:
                    card = await writer.rollup([cards[m.ref or ""] for m in span])
                    counts["rollups"] += 1
                reached("in_fold")
                cards[card.id] = card
                written.append(card)
                context[step.start : step.end] = [card_message(card)]
        except FoldSkipped as skip:
            if skip.error:  # a provider error: retried later; after PAUSE_AFTER in a row, a pause
                failures = slot.failures + 1
                paused = now + PAUSE_S if failures >= PAUSE_AFTER else 0.0
                await run.add(
                    "fold_skipped",
                    {"reason": skip.reason, "error": skip.error, "failures": failures, "paused_until": paused or None},
                )
            if not written:
                return Declined(skip.reason, paid=bool(skip.error))
        if not written and not counts["externalised"]:
            return None
        payload = {"cards": [c.to_dict() for c in written], "folds": counts, "verify": writer.figures, "hard": hard}
        return Reduction(context=context, evicted=[m for m in evicted if m.seq is not None], payload=payload)

    # ------------------------------------------------------------------ what the model gets

    def system_lines(self, spec: Any) -> list[str]:
        return [fold_prompt(bool(spec.context.recall), spec.context.fold.tools)]

    def granted_tools(self, run: RunState) -> list[Tool]:
        from loomrt.run.reducers.fold.tools import fold_tools

        return fold_tools(run) if run.spec.context.fold.tools else []

    def cut_note(self, message: Message, limit: int) -> str:
        return external_note(message)

    async def refold(self, run: RunState, *, fallback_only: bool) -> Reduction | None:
        from loomrt.run.reducers.fold.refold import refold

        return await refold(run, fallback_only=fallback_only)

    def fork_catalog(self, store: Any, run_id: str, seq: int) -> list[dict[str, Any]] | None:
        from loomrt.run.reducers.fold.fork import fork_catalog

        return fork_catalog(store, run_id, seq)


def external_note(message: Message, lines: int = 4) -> str:
    """The reference an externalised message leaves in the working context: its seq, its
    size and its first few lines."""
    head = [line[:200] for line in message.content.splitlines() if line.strip()][:lines]
    return (
        f"[externalised: message #{message.seq} ({message.role}{' ' + message.name if message.name else ''}), "
        f"{count_text(message.content)} tokens, kept whole on the record. Its first lines:\n"
        + "\n".join(head)
        + f'\nRead it page by page with Expand("#{message.seq}"), or search it with Grep.]'
    )
