"""Recall as a reader asks it, outside the run: the run's recall index rebuilt from its record
(every distillation's evicted span, and a fork's shared history up to its fork point), searched,
private hits as their placeholders unless asked. ``loomrt recall`` and ``loomrt ui`` read this."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from loomrt.recall import RunRecall
from loomrt.recall.tool import RecallHit
from loomrt.record.store import Store
from loomrt.run.family import Family
from loomrt.spec import AgentSpec
from loomrt.visibility import placeholder, private_seqs

__all__ = ["RecallAnswer", "recall_in_record"]


@dataclass(frozen=True)
class RecallAnswer:
    hits: list[RecallHit]
    indexed: int
    """Entries the rebuilt index holds (0: the run has evicted nothing yet)."""
    notes: list[str]
    """What the index reported while it was rebuilt (an embedder that could not load, say)."""


def recall_in_record(
    store: Store, run_id: str, query: str, *, k: int = 5, include_private: bool = False, source: str | None = None
) -> RecallAnswer:
    """The ``k`` best hits for ``query`` in what run ``run_id`` evicted (``NotFoundError`` for an
    unknown run); ``source``: the ``k`` best of one source only (``run`` or ``family``)."""
    store.get_run(run_id)
    events = store.events(run_id)
    context: Any = None
    if events and events[0].kind == "run_started":
        try:
            context = AgentSpec.model_validate(events[0].data["definition"]).context
        except Exception:  # noqa: BLE001 - an old definition still has a searchable record
            context = None
    notes: list[str] = []
    family = Family.of(store, events[0].data.get("forked_from")) if events else None
    shared = list(family.events()) if family is not None else []
    rr = RunRecall(
        run_id=run_id,
        context=context,
        emit=lambda kind, data: notes.append(str(data.get("message") or data.get("error"))),
        shared_runs=[r for r, _ in family.links] if family is not None else (),
    )
    rr.rebuild([*shared, *events])
    private = private_seqs([*shared, *events]) | (family.private() if family is not None else set())
    hits = rr.search(query, top_k=k if source is None else max(k, rr.size()))
    if source is not None:
        hits = [h for h in hits if h.source == source][:k]
    if not include_private:  # the reader without the right sees the placeholder
        hits = [
            replace(h, text=placeholder(h.seq, h.role or "tool")) if h.seq is not None and h.seq in private else h
            for h in hits
        ]
    return RecallAnswer(hits, rr.size(), notes)
