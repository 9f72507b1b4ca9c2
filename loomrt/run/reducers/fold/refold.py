"""``loomrt runs refold``: new cards over the same coverage, for a catalog's cards.

A fallback card (a truncation written when the summariser kept failing, or under the
spend guard) can be repaired, and a better model can refold old history. Cards are
immutable: refolding writes new cards (new ids, since their text differs) and moves the
catalog to them; the old cards stay on the record. A card is rewritten from its source,
depth first: a leaf from its messages, a rollup from its (rewritten) children. With
``fallback_only``, only the cards that are fallbacks or stand on one are rewritten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loomrt.events import message_of
from loomrt.messages import Message
from loomrt.run.cards import CARD_BLOCK, Card, card_message
from loomrt.run.reducers.base import Reduction
from loomrt.run.reducers.fold.writer import CardWriter
from loomrt.tokens import count_messages

if TYPE_CHECKING:
    from loomrt.run.state import RunState

__all__ = ["refold"]


async def refold(run: RunState, *, fallback_only: bool) -> Reduction | None:
    """The catalog with its cards rewritten; None when there is nothing to rewrite."""
    view = run.view
    writer = CardWriter(run, hard=True, calls_left=10**9)  # an operator's command: no spend guard
    known: dict[str, Card] = dict(view.cards)
    done: dict[str, Card] = {}
    written: list[Card] = []

    def card(card_id: str) -> Card:
        if card_id not in known and view.family is not None:
            known.update(view.family.cards([card_id]))
        return known[card_id]

    def needs(c: Card) -> bool:
        return c.fallback or any(needs(card(child)) for child in c.children)

    def message(seq: int) -> Message | None:
        m = view.messages.get(seq)
        if m is None and view.family is not None:
            e = view.family.events_at([seq]).get(seq)
            m = message_of(e) if e is not None else None
        return view.original(m) if m is not None else None

    async def redo(c: Card) -> Card:
        if c.id in done:
            return done[c.id]
        new = c
        if not fallback_only or needs(c):
            if c.children:
                new = await writer.rollup([await redo(card(child)) for child in c.children])
            else:
                messages = [m for s in c.seqs if (m := message(s)) is not None]
                new = await writer.leaf(messages, count_messages(messages), None)
            written.append(new)
        done[c.id] = new
        return new

    context = []
    for m in run.context:
        context.append(card_message(await redo(card(m.ref or ""))) if m.synthetic == CARD_BLOCK else m)
    if not written:
        return None
    return Reduction(
        context=context,
        evicted=[],
        payload={
            "cards": [c.to_dict() for c in written],
            "folds": {"refolded": len(written)},
            "verify": writer.figures,
            "refold": "fallbacks" if fallback_only else "all",
        },
    )
