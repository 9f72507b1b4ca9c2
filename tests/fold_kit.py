"""Shared by the fold and fork tests: what a run's catalog covers, and a fold agent with
notes to fill its context."""

from __future__ import annotations

import random
from typing import Any

from loomrt.run.cards import CARD_BLOCK
from loomrt.spec import AgentSpec


def coverage(run: Any) -> list[int]:
    """The seqs the catalog covers: its cards' (through their leaves) and its raw messages."""
    seqs: list[int] = []
    for m in run.context:
        if m.synthetic == CARD_BLOCK:
            seqs.extend(run.view.cards[m.ref].seqs)
        elif m.seq is not None and m.synthetic in (None, "external") and m.role != "system":
            seqs.append(m.seq)
    return seqs


WORDS = "alpha beta gamma delta service deploy port config path value cluster node shard queue".split()


def said(i: int, rng: random.Random) -> str:
    """Note ``i``: a value and a path to remember, and two dozen words of filler."""
    return (
        f"Note {i}: the {rng.choice(WORDS)} {rng.choice(WORDS)} is {rng.randint(1000, 9999)} in /srv/app{i}.conf. "
        + " ".join(rng.choice(WORDS) for _ in range(24))
    )


def spec(**fold: Any) -> AgentSpec:
    """A scripted fold agent with a 4,096-token budget, its fold keys set to ``fold``."""
    return AgentSpec(
        model="scripted/fold",
        max_iterations=6,
        context={"mode": "fold", "budget_tokens": 4096, "fold": {"max_calls_per_10min": 10_000, **fold}},
    )
