"""Shared by the fold and fork tests: what a run's catalog covers."""

from __future__ import annotations

from typing import Any

from loomrt.run.cards import CARD_BLOCK


def coverage(run: Any) -> list[int]:
    """The seqs the catalog covers: its cards' (through their leaves) and its raw messages."""
    seqs: list[int] = []
    for m in run.context:
        if m.synthetic == CARD_BLOCK:
            seqs.extend(run.view.cards[m.ref].seqs)
        elif m.seq is not None and m.synthetic in (None, "external") and m.role != "system":
            seqs.append(m.seq)
    return seqs
