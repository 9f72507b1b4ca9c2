"""A run at a glance: the row a list of runs shows (``loomrt runs list``, ``loomrt ui``'s runs page).

Read for a whole list of runs in one grouped query (:meth:`~loomrt.record.store.Store.run_sums`),
never the whole record: its model calls' tokens, its distillations, its user inputs (the first
is the task), its last event (how long the run took). A private first input is its placeholder
(:mod:`loomrt.visibility`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from loomrt.events import RunInfo
from loomrt.record.rows import RunSums
from loomrt.record.store import Store
from loomrt.visibility import placeholder

__all__ = ["Glance", "glance", "glances"]


@dataclass(frozen=True)
class Glance:
    """What a runs row shows beyond the run's own row (:class:`~loomrt.events.RunInfo`)."""

    task: str | None
    """The first user input (its placeholder if private); None for a run that has none yet (a fork
    before its first input)."""
    seconds: float | None
    """From the run's creation to its last event; None for a run with no event yet."""
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    model_calls: int
    distillations: int
    turns: int
    """Its user inputs (a fork's own, after its fork point)."""
    last_ts: float | None
    """When its last event was recorded (the row's "last activity")."""


def _glance(r: RunInfo, s: RunSums) -> Glance:
    task = s.task
    if s.first_input is not None and s.task_private:
        task = placeholder(s.first_input, "user")
    same = ("input_tokens", "output_tokens", "cached_tokens", "model_calls", "distillations", "turns", "last_ts")
    seconds = None if s.last_ts is None else s.last_ts - r.created_at
    return Glance(task=task, seconds=seconds, **{name: getattr(s, name) for name in same})


def glances(store: Store, runs: Iterable[RunInfo]) -> dict[str, Glance]:
    """Each of ``runs`` at a glance, by run id: one grouped query for them all."""
    runs = list(runs)
    sums = store.run_sums([r.run_id for r in runs]) if runs else {}
    return {r.run_id: _glance(r, sums.get(r.run_id, RunSums())) for r in runs}


def glance(store: Store, r: RunInfo) -> Glance:
    """Run ``r`` at a glance (one query: :func:`glances` of it alone)."""
    return glances(store, [r])[r.run_id]
