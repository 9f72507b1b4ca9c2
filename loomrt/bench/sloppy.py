"""A summariser that gets fold's cards wrong on purpose: the ``fold/sloppy`` variant.

The scripted summariser copies words of its source, so fold's verified-card check never
has a value to catch and its fallback path never runs: "0 invented values, 0 fallbacks"
could not come out otherwise. :class:`SloppySummariser` wraps the workload's model and,
for a share of fold calls drawn from the seed and the prompt (the same run makes the same
mistakes), does what a real small summariser does:

- **invents a value**: a leaf card opens with a sentence naming a port its source never
  stated (rollups are not checked for values by design, so nothing is planted there);
- **fails**: an empty reply (the card is rejected and asked for again), or a provider
  error (the fold is skipped and tried later).

It keeps every value it planted, so the bench counts, apart from the product's own
figures, how many reached a card (:func:`invented_in_cards`): the check's figure is the
count it caught, this one what got past it.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from loomrt.bench.model import BenchModel
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.run.reducers.fold.writer import INSTRUCTIONS

__all__ = ["SloppySummariser", "SummariserOutage", "invented_in_cards"]


class SummariserOutage(RuntimeError):
    """The provider error a sloppy summariser raises on a share of its calls."""


@dataclass
class SloppySummariser:
    """``model`` with its fold calls made unreliable: of every fold call, ``invent`` invents
    a value (leaf cards only), ``empty`` replies with nothing and ``error`` raises."""

    model: BenchModel
    seed: int = 7
    invent: float = 0.3
    empty: float = 0.15
    error: float = 0.05
    planted: list[str] = field(default_factory=list)
    """The values it invented, in order."""
    faults: Counter[str] = field(default_factory=Counter)
    """How many calls it spoilt, by fault (``invented``, ``empty``, ``error``), and fold calls in all."""

    def __call__(self, request: ModelRequest) -> ModelResponse:
        if request.purpose != "fold":
            return self.model(request)
        prompt = "\n".join(str(m.get("content") or "") for m in request.messages)
        roll = random.Random(f"{self.seed}\n{prompt}")  # a retry's prompt says why: another draw
        self.faults["calls"] += 1
        draw = roll.random()
        if draw < self.error:
            self.faults["error"] += 1
            raise SummariserOutage("the scripted summariser is down (fold/sloppy)")
        if draw < self.error + self.empty:
            self.faults["empty"] += 1
            return self.model.respond(request, "")
        response = self.model(request)
        leaf = any(m.get("content") == INSTRUCTIONS[0] for m in request.messages if m.get("role") == "system")
        if not leaf or draw >= self.error + self.empty + self.invent:
            return response
        value = next(v for v in (str(roll.randint(10_000, 65_535)) for _ in range(100)) if v not in prompt)
        self.planted.append(value)
        self.faults["invented"] += 1
        return self.model.respond(request, f"The service listens on port {value}. {response.text}")


def invented_in_cards(planted: list[str], events: list[Any]) -> int:
    """How many of the ``planted`` values a card on the record states (each counted once)."""
    cards = [str(c.get("text", "")) for e in events if e.kind == "distillation" for c in e.data.get("cards") or ()]
    return sum(any(v in text for text in cards) for v in dict.fromkeys(planted))
