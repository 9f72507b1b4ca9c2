"""A fold run's card tree as the run page shows it: the cards its catalog sees now (the last
distillation's context), each with the cards it rolls up, down to the leaves and the record
messages they cover. Cards a fork shares with its family (its starting catalog names them) are
read from the store's card index."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from loomrt.events import Event
from loomrt.record.store import Store
from loomrt.run.cards import Card

__all__ = ["CardNode", "card_tree"]

DEPTH_MAX = 32
"""Deeper than any fold writes: a tree that claims more is read no further."""


@dataclass(frozen=True)
class CardNode:
    card: Card
    children: tuple[CardNode, ...]
    written_at: int | None
    """The seq of the distillation that wrote it (None: a card of the family, written by another run)."""
    checked: dict[str, Any] | None
    """That distillation's verbatim check: values checked, invented, cards rejected, fallbacks."""


def card_tree(store: Store, events: Iterable[Event]) -> list[CardNode]:
    """The catalog's cards now (the last distillation's context, else a fold fork's starting
    catalog on its ``run_started``), in catalog order, each with its subtree (empty: no card)."""
    events = list(events)
    found = [e for e in events if e.kind == "distillation"]
    started = [e.data["catalog"] for e in events if e.kind == "run_started" and e.data.get("catalog")]
    written: dict[str, tuple[int, dict[str, Any] | None]] = {}
    cards: dict[str, Card] = {}
    for e in found:
        for c in e.data.get("cards") or ():
            cards[c["id"]] = Card.from_dict(c)
            written[c["id"]] = (e.seq, e.data.get("verify"))
    catalog = found[-1].data.get("context") or () if found else started[-1] if started else ()
    roots = [str(x["card"]) for x in catalog if isinstance(x, dict) and "card" in x]

    def fetch(ids: Iterable[str]) -> None:
        missing = [i for i in ids if i not in cards]
        if missing:
            cards.update({i: Card.from_dict(d) for i, d in store.cards(missing).items()})

    def node(card_id: str, depth: int) -> CardNode | None:
        card = cards.get(card_id)
        if card is None or depth > DEPTH_MAX:
            return None
        fetch(card.children)
        kids = tuple(n for n in (node(c, depth + 1) for c in card.children) if n is not None)
        seq, checked = written.get(card_id, (None, None))
        return CardNode(card, kids, seq, checked)

    fetch(roots)
    return [n for n in (node(r, 0) for r in roots) if n is not None]
