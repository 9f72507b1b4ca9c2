"""A run as inspection shows it: `loomrt runs show --json` and MCP's ``get_run`` print this."""

from __future__ import annotations

from typing import Any

from loomrt.events import Event, RunInfo
from loomrt.record.coordination import Coordination
from loomrt.record.store import Store
from loomrt.run.projection import project

__all__ = ["run_summary"]


def run_summary(info: RunInfo, events: list[Event], store: Store | None = None) -> dict[str, Any]:
    """What the record says about one run: its row, usage, distillations, output and Σ; with
    ``store``, the runs it spawned, and its usage gains ``children`` (theirs, rolled up)."""
    view = project(events, store=store)
    started = events[0].data if events else {}
    usage: dict[str, Any] = {**view.usage.to_dict(), "model_calls": view.model_calls}
    children: list[str] = []
    if store is not None:
        children = [c.run_id for c in store.children(info.run_id)]
        rolled = {"input_tokens": 0, "output_tokens": 0, "model_calls": 0}
        last = {e.data["run_id"]: e.data.get("usage") or {} for e in events if e.kind == "spawn_child_result"}
        for u in last.values():
            for key in rolled:
                rolled[key] += int(u.get(key, 0))
        usage["children"] = rolled
    summary = {
        **info.model_dump(mode="json"),
        "requested_mode": started.get("requested_mode"),
        "tools": started.get("tools", []),
        "usage": usage,
        "distillations": view.distillations,
        "declined": view.declines,
        "summaries_rejected": view.rejections,
        "errors": [e.data.get("message") for e in events if e.kind == "error"],
        "output": view.output,
        "state": view.state,
        "working_context_messages": len(view.context),
    }
    mode_state = view.mode.status(view)
    if mode_state is not None:  # fold: pending, running, failures, last success, last failure, cards
        if isinstance(store, Coordination):  # who distils it now: the run's distillation lease
            mode_state["running"] = store.lease_holder(f"distil:{info.run_id}") is not None
        summary["mode_state"] = mode_state
    if store is not None:
        summary["children"] = children
    return summary
