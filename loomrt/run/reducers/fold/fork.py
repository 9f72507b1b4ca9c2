"""A fold run's fork: its parent's catalog trimmed at the fork point, copying no text.

Cards wholly at or before the fork seq are referenced as they are; the one card that
straddles it is expanded one level (recursively, down to a leaf, whose messages up to the
fork seq come back raw); cards and messages after it are left out. The fork's catalog is
read from the parent's last distillation (its ``context``) and the messages recorded
after it, so a fork costs the same at 10,000 messages as at 100.
"""

from __future__ import annotations

from typing import Any

from loomrt.events import Event, message_of

__all__ = ["fork_catalog"]


def fork_catalog(store: Any, run_id: str, seq: int) -> list[dict[str, Any]]:
    """The catalog of a fork of fold run ``run_id`` at ``seq``: ``{card}`` and ``{seq}`` refs."""
    started: Event = store.latest(run_id, "run_started")
    system = started.seq  # the parent's system message; the fork has its own
    last = store.latest(run_id, "distillation", until=None)
    if last is not None:
        refs, since = list(last.data["context"]), last.seq
    else:
        refs, since = list(started.data.get("catalog") or []), started.seq
    cards: dict[str, dict[str, Any]] = {}

    def load(ids: list[str]) -> None:
        missing = [i for i in ids if i not in cards]
        if missing:
            cards.update(store.cards(missing))

    def trim(card_id: str) -> list[dict[str, Any]]:
        card = cards[card_id]
        seqs = card["seqs"]
        if seqs[-1] <= seq:
            return [{"card": card_id}]
        if seqs[0] > seq:
            return []
        if card.get("children"):
            load(card["children"])
            return [r for child in card["children"] for r in trim(child)]
        return [{"seq": s} for s in seqs if s <= seq]

    load([r["card"] for r in refs if "card" in r])
    out: list[dict[str, Any]] = []
    for ref in refs:
        if "card" in ref:
            out.extend(trim(ref["card"]))
        else:
            at = ref.get("seq", (ref.get("message") or {}).get("seq"))
            if at is not None and at != system and at <= seq:  # a pin block (no seq) comes back from the pins
                out.append({"seq": at, **({"pinned": True} if ref.get("pinned") else {})})
    if seq > since:
        for e in store.events(run_id, after=since, until=seq):
            if message_of(e) is not None and e.kind != "run_started":
                out.append({"seq": e.seq})
    return out
