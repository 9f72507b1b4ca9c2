"""Cards: the immutable summaries fold mode writes, and how the working context shows them.

A card covers either record messages (a leaf, depth 0) or adjacent cards one level down
(a rollup, depth 1 and above). It is a value: its id is a hash of its text and what it
covers, so the same card written twice is the same card, and once written it never
changes. A card is written once, in the ``cards`` list of the distillation event that
made it; a run's catalog (which cards and which raw messages it sees, in order) is that
event's ``context``, where a card is referenced as ``{"card": ID}``.

In the working context a card is one user message (``synthetic="card"``, ``ref`` its id)
in a small tagged wrapper that names its id, depth, coverage and time range, so the
model can Describe or Expand it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from loomrt.messages import Message

__all__ = ["Card", "card_id", "CARD_BLOCK", "card_message", "render", "EXPAND_LINE"]

CARD_BLOCK = "card"
"""The ``synthetic`` tag of a card in the working context."""

EXPAND_LINE = "Expand for details about:"
"""How a card's last line starts: what it left out, by name."""


def card_id(text: str, depth: int, seqs: tuple[int, ...], children: tuple[str, ...]) -> str:
    """The content address of a card: its text and its exact coverage."""
    blob = json.dumps([text, depth, list(seqs), list(children)], ensure_ascii=False, separators=(",", ":"))
    return "c" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:11]


@dataclass(frozen=True)
class Card:
    """One card, as its distillation event stores it."""

    id: str
    depth: int
    """0 for a leaf (it covers messages), n for a card that rolls up cards of depth n-1."""
    text: str
    """What the card says (without its wrapper and its Expand line)."""
    hint: str
    """What it left out, by name (the text after "Expand for details about:")."""
    seqs: tuple[int, ...]
    """Every record message it covers, in order (a rollup: its children's, joined)."""
    children: tuple[str, ...]
    """The cards it rolls up (empty for a leaf)."""
    ts_lo: float
    ts_hi: float
    tokens: int
    """Its rendered size in the working context."""
    descendants: int
    """Cards and messages below it."""
    kind: str
    """The prompt that wrote it: leaf, rollup, or the deterministic fallback."""
    model: str
    fallback: bool = False
    """Written by deterministic truncation, not a model (``loomrt runs refold --fallback-only`` repairs it)."""
    run_id: str = ""
    """The run whose fold wrote it."""

    @property
    def seq_lo(self) -> int:
        return self.seqs[0]

    @property
    def seq_hi(self) -> int:
        return self.seqs[-1]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seqs"], d["children"] = list(self.seqs), list(self.children)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Card:
        return cls(**{**d, "seqs": tuple(d["seqs"]), "children": tuple(d.get("children") or ())})


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def render(card: Card) -> str:
    """The card as the model reads it."""
    lo, hi = _when(card.ts_lo), _when(card.ts_hi)
    span = lo if lo == hi else f"{lo} – {hi[11:] if hi[:10] == lo[:10] else hi}"
    covers = f"#{card.seq_lo}–#{card.seq_hi}, {len(card.seqs)} messages"
    if card.children:
        covers += f", {len(card.children)} cards"
    note = ' fallback="truncated, not summarised"' if card.fallback else ""
    hint = f"\n{EXPAND_LINE} {card.hint}" if card.hint else ""
    return (
        f'<card id="{card.id}" depth="{card.depth}" covers="{covers}" time="{span} UTC"{note}>\n'
        f"{card.text}{hint}\n</card>"
    )


def card_message(card: Card) -> Message:
    """The card's block in the working context."""
    return Message(role="user", content=render(card), synthetic=CARD_BLOCK, ref=card.id)
