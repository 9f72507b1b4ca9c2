"""A run at a glance: the row a list of runs shows (``loomrt runs list``, ``loomrt ui``'s runs page).

Read by kind or seq on the record's index, never the whole record: the user inputs (the
first is the task), the last event (how long the run took), and the model calls and
distillations (tokens and boundaries). A private first input is its placeholder (:mod:`loomrt.visibility`).
"""

from __future__ import annotations

from dataclasses import dataclass

from loomrt.events import RunInfo
from loomrt.record.store import Store
from loomrt.visibility import placeholder, private_seqs

__all__ = ["Glance", "glance"]


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


def glance(store: Store, r: RunInfo) -> Glance:
    """Run ``r`` at a glance: at most three reads by kind or seq (the model calls, distillations
    and inputs; the last event; the private marks, when it has an input)."""
    counted = {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0}
    calls = distillations = 0
    inputs = []
    for e in store.events(r.run_id, kinds=["model_call", "distillation", "user_input"]):
        if e.kind == "user_input":
            inputs.append(e)
        elif e.kind == "distillation":
            distillations += 1
        else:
            calls += 1
            usage = e.data.get("usage") or {}
            for key in counted:
                counted[key] += int(usage.get(key) or 0)
    task: str | None = None
    if inputs:
        hidden = private_seqs(store.events(r.run_id, kinds=["mark_private", "declassify"]))
        task = placeholder(inputs[0].seq, "user") if inputs[0].seq in hidden else str(inputs[0].data.get("content"))
    last = store.events(r.run_id, after=r.last_seq - 1) if r.last_seq else []
    return Glance(
        task=task,
        seconds=last[-1].ts - r.created_at if last else None,
        model_calls=calls,
        distillations=distillations,
        turns=len(inputs),
        last_ts=last[-1].ts if last else None,
        **counted,
    )
