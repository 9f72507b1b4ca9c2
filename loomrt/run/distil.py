"""The boundary: check pressure, run the mode's reducer, record the distillation, hand the
evicted span to the callbacks. A result that is not smaller is declined, and the run goes on."""

from __future__ import annotations

import inspect
from typing import Any

from loomrt.messages import EvictedSpan, Message
from loomrt.run.state import RunState
from loomrt.tokens import count_messages

__all__ = ["maybe_distil", "context_refs"]


def context_refs(context: list[Message]) -> list[dict[str, Any]]:
    """The working context as the record stores it: record messages by seq, synthetic ones whole."""
    refs: list[dict[str, Any]] = []
    for m in context:
        if m.seq is not None and m.synthetic is None:
            refs.append({"seq": m.seq, "pinned": True} if m.pinned else {"seq": m.seq})
        else:
            refs.append({"message": m.to_dict()})
    return refs


async def maybe_distil(run: RunState) -> bool:
    """Distil if the mode says pressure calls for it. True if the context was reduced."""
    if not run.mode.should_distil(run):
        return False
    before = count_messages(run.context)
    pressure = run.pressure()
    reduction = await run.mode.reduce(run)
    after = count_messages(reduction.context) if reduction else before
    if reduction is None or not reduction.evicted or after >= before:
        paid = reduction is not None and bool(reduction.evicted)  # a summary call was made, for nothing
        run.declined_at = len(run.context)
        if paid:
            run.declined_tokens = before
        run.record("distillation_declined", {
            "mode": run.mode.name, "tokens_before": before, "tokens_after": after, "pressure": pressure,
            "reason": "result not smaller" if paid else "nothing to evict",
        })
        return False
    event = run.record("distillation", {
        "mode": run.mode.name,
        "span_seqs": [m.seq for m in reduction.evicted if m.seq is not None],
        "tokens_before": before,
        "tokens_after": after,
        "pressure": pressure,
        "budget": run.budget,
        "summary": reduction.summary,
        "state": reduction.state,
        "context": context_refs(reduction.context),
    })
    run.context = reduction.context
    run.reported_prompt_tokens = 0
    run.distillations += 1
    span = EvictedSpan(
        run_id=run.run_id, agent=run.agent, mode=run.mode.name,
        distillation_seq=event.seq, messages=tuple(reduction.evicted),
    )
    await notify(run, span)
    return True


async def notify(run: RunState, span: EvictedSpan) -> None:
    """Hand ``span`` to every callback; one that raises is recorded, never fatal."""
    for callback in list(run.callbacks):
        try:
            out = callback(span)
            if inspect.isawaitable(out):
                await out
        except Exception as exc:  # noqa: BLE001 - optional parts never fail a run
            run.record("callback_error", {
                "callback": getattr(callback, "__qualname__", repr(callback)),
                "error": f"{type(exc).__name__}: {exc}",
                "distillation_seq": span.distillation_seq,
            })
