"""A fold run's card tree as the run page shows it: the cards its catalog sees now (the last
distillation's context), each with the cards it rolls up, down to the leaves and the record
messages they cover. Cards a fork shares with its family are read from the store's card index."""

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


def card_tree(store: Store, distillations: Iterable[Event]) -> list[CardNode]:
    """The catalog's cards now, in catalog order, each with its subtree (empty: no card yet)."""
    found = [e for e in distillations if e.kind == "distillation"]
    written: dict[str, tuple[int, dict[str, Any] | None]] = {}
    cards: dict[str, Card] = {}
    for e in found:
        for c in e.data.get("cards") or ():
            cards[c["id"]] = Card.from_dict(c)
            written[c["id"]] = (e.seq, e.data.get("verify"))
    if not found:
        return []
    roots = [str(x["card"]) for x in found[-1].data.get("context") or () if isinstance(x, dict) and "card" in x]

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
