"""The keys of one retention mode each (``context.stateful:``, ``context.fold:``), apart
from :mod:`loomrt.spec` so that module stays the definition file's shape and loader."""

from __future__ import annotations

from pydantic import Field, model_validator

from loomrt.spec_reach import _Strict

__all__ = ["StatefulSpec", "FoldSpec"]


class StatefulSpec(_Strict):
    """stateful mode's own keys (``context.stateful:``)."""

    state_max_tokens: int | None = Field(None, ge=16)
    """The most tokens Σ may take; a patch that would grow it past this is refused with a
    message the model sees. Default: half the budget."""


class FoldSpec(_Strict):
    """fold mode's own keys (``context.fold:``): how history folds into cards."""

    keep_recent: int = Field(32, ge=2)
    """The newest messages, never folded (or fewer: see keep_recent_pct)."""
    keep_recent_pct: int = Field(10, ge=5, le=80)
    """The newest messages fitting this percentage of the budget, if fewer than keep_recent.
    The tail always keeps the newest user input and everything after it, and a tool call
    with its result. The default (10%) keeps a tail of a few messages, as recap keeps its
    last few: what is older is on a card that Expand unfolds to the exact words."""
    leaf_min_messages: int = Field(8, ge=2)
    """The fewest raw messages a leaf card folds."""
    leaf_source_tokens: int | None = Field(None, ge=256)
    """The most tokens of raw messages one leaf card folds. Default: the smaller of 20,000
    and a quarter of the budget."""
    leaf_target_tokens: int | None = Field(None, ge=32)
    """The size a leaf card is asked to be. Default: 1/16 of its source (at least 64)."""
    rollup: int = Field(4, ge=2, le=16)
    """Adjacent cards of one depth that roll up into one card a level higher (under hard
    pressure as few as 2)."""
    soft_pct: int = Field(70, ge=10, le=100)
    """Pressure (% of the budget) at which a fold is queued, to run between turns."""
    hard_pct: int = Field(100, ge=10, le=100)
    """Pressure at which the run folds at once, before the next call."""
    target_pct: int | None = Field(None, ge=5, le=100)
    """Where a fold stops: it folds until the context is at most this percentage of the
    budget, or nothing outside the tail is left to fold. Default: the smaller of 25 and
    soft_pct, so one fold makes room for many turns (and changes the cached prompt prefix
    once, not every few turns)."""
    cache_idle_s: float = Field(300, ge=0)
    """A run whose last call was this recent is not folded at the soft watermark (its
    prompt prefix is likely still cached), unless pressure is at 85% or more."""
    max_calls_per_10min: int = Field(24, ge=1)
    """The most summariser calls folding makes for one run in any 10 minutes; past it a
    soft fold waits, and a hard one writes fallback cards (repair them with
    `loomrt runs refold --fallback-only`)."""
    call_timeout_s: float | None = Field(None, gt=0)
    """Seconds one card-writing call may take (default: the agent's timeout_s)."""
    tools: bool = True
    """Grant the Describe, Expand and Grep tools (off: the cards alone, and Recall if on)."""

    @model_validator(mode="after")
    def _soft_below_hard(self) -> FoldSpec:
        if self.soft_pct > self.hard_pct:
            raise ValueError(f"soft_pct ({self.soft_pct}) must not be above hard_pct ({self.hard_pct})")
        if self.target_pct is not None and self.target_pct > self.soft_pct:
            raise ValueError(f"target_pct ({self.target_pct}) must not be above soft_pct ({self.soft_pct})")
        return self

    @property
    def fold_target_pct(self) -> int:
        """target_pct, or its default: the smaller of 25 and soft_pct."""
        return self.target_pct if self.target_pct is not None else min(25, self.soft_pct)
