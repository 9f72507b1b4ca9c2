"""The boundary: check pressure, run the mode's reducer, record the distillation, hand the
evicted span to the callbacks. A result that is not smaller is declined, and the run goes on."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import replace

from loomrt.activity import Activity
from loomrt.crashpoints import reached
from loomrt.messages import EvictedSpan
from loomrt.run.pins import keep_pins
from loomrt.run.projection import context_refs
from loomrt.run.reducers.base import Declined, Reduction
from loomrt.run.state import RunState
from loomrt.tokens import count_messages

__all__ = ["maybe_distil", "notify"]


async def maybe_distil(
    run: RunState,
    *,
    force: bool = False,
    reduce: Callable[[RunState], Awaitable[Reduction | Declined | None]] | None = None,
    require_smaller: bool = True,
) -> bool:
    """Distil if the mode says pressure calls for it (or now, with ``force``: a client's
    ``compact_run``). True if the context was reduced. ``reduce`` stands in for the mode's
    reducer (``runs refold``), and a rewrite that is not smaller may stand when
    ``require_smaller`` is off."""
    if not (force or run.mode.should_distil(run)):
        return False
    before, pressure = run.estimate(), run.pressure()  # the size counts the tool schemas sent with every call
    run.show(Activity(run.run_id, "distilling", mode=run.mode.name, messages=len(run.context)))
    reduction = await (reduce or run.mode.reduce)(run)
    changed = isinstance(reduction, Reduction) and (bool(reduction.evicted) or reduction.context != run.context)
    if isinstance(reduction, Reduction) and changed:  # whatever the mode kept, the pins stay verbatim
        reduction = replace(reduction, context=keep_pins(run.view, reduction.context))
    after = before
    if isinstance(reduction, Reduction):  # the same tools go with the smaller context
        after = before - count_messages(run.context) + count_messages(reduction.context)
    if not isinstance(reduction, Reduction) or not changed or (after >= before and require_smaller):
        if isinstance(reduction, Declined):
            paid, reason = reduction.paid, reduction.reason
        else:  # a distillation call was made for nothing when a span was evicted but the result is not smaller
            paid = changed
            reason = "result not smaller" if paid else "nothing to evict"
        await run.add(
            "distillation_declined",
            {
                "mode": run.mode.name,
                "tokens_before": before,
                "tokens_after": after,
                "pressure": pressure,
                "paid": paid,
                "reason": reason,
            },
        )
        return False
    evicted = tuple(run.view.original(m) for m in reduction.evicted)  # full text, as the record holds it
    reached("in_distillation")
    event = await run.add(
        "distillation",
        {
            "mode": run.mode.name,
            "span_seqs": [m.seq for m in evicted if m.seq is not None],
            "tokens_before": before,
            "tokens_after": after,
            "pressure": pressure,
            "budget": run.budget,
            **reduction.payload,
            "context": context_refs(reduction.context),
        },
    )
    span = EvictedSpan(
        run_id=run.run_id,
        agent=run.agent,
        mode=run.mode.name,
        distillation_seq=event.seq,
        messages=evicted,
    )
    reached("after_distillation")
    if span.messages:  # a fold that only rolled cards up evicted nothing
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
            await run.add(
                "callback_error",
                {
                    "callback": getattr(callback, "__qualname__", repr(callback)),
                    "error": f"{type(exc).__name__}: {exc}",
                    "distillation_seq": span.distillation_seq,
                },
            )
