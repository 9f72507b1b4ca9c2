"""A run as inspection shows it: `loomrt runs show --json` and MCP's ``get_run`` print this."""

from __future__ import annotations

from typing import Any

from loomrt.events import Event, RunInfo
from loomrt.run.projection import project

__all__ = ["run_summary"]


def run_summary(info: RunInfo, events: list[Event]) -> dict[str, Any]:
    """What the record says about one run: its row, usage, distillations, output and Σ."""
    view = project(events)
    started = events[0].data if events else {}
    return {
        **info.model_dump(mode="json"),
        "requested_mode": started.get("requested_mode"),
        "tools": started.get("tools", []),
        "usage": {**view.usage.to_dict(), "model_calls": view.model_calls},
        "distillations": view.distillations,
        "declined": view.declines,
        "errors": [e.data.get("message") for e in events if e.kind == "error"],
        "output": view.output,
        "state": view.state,
        "working_context_messages": len(view.context),
    }
