"""Rendering events for people: one short line per event, as the run records them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from loomrt.cli._common import plural
from loomrt.events import Event

__all__ = ["describe", "EventPrinter", "events_table", "model_label", "short"]


def model_label(model: Any) -> str:
    """A model string for people. ``scripted/PATH`` is recorded with PATH absolute; it shows
    relative to the working folder where it lies under it, else as ``scripted:/abs/path``
    (never ``scripted//abs/path``)."""
    text = str(model or "")
    if not text.startswith("scripted/"):
        return text
    script = Path(text.removeprefix("scripted/"))
    if not script.is_absolute():
        return text
    try:
        return f"scripted/{script.relative_to(Path.cwd()).as_posix()}"
    except ValueError:
        return f"scripted:{script.as_posix()}"


def short(value: Any, width: int = 100) -> str:
    """``value`` on one line, cut to ``width`` characters with an ellipsis."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def describe(e: Event) -> str:
    """A one-line, plain-text description of an event."""
    d = e.data
    match e.kind:
        case "run_started":
            return f"run {e.run_id} · agent {d.get('agent')} · mode {d.get('mode')} (asked {d.get('requested_mode')}) · {model_label(d.get('model'))}"
        case "user_input":
            return f"user: {short(d.get('content'))}"
        case "model_call":
            u = d.get("usage") or {}
            cached = int(u.get("cached_tokens", 0) or 0)
            share = f" ({cached * 100 // max(1, int(u.get('input_tokens', 0) or 0))}% cached)" if cached else ""
            return (
                f"model call ({d.get('purpose')}): {u.get('input_tokens', 0)} in{share} / "
                f"{u.get('output_tokens', 0)} out · {d.get('seconds')}s"
            )
        case "assistant_message":
            m = d.get("message") or {}
            calls = ", ".join(c["name"] for c in m.get("tool_calls") or [])
            if not (m.get("content") or "").strip():  # a tool-only step, or (rarely) an empty reply
                return f"assistant → calls {calls}" if calls else "assistant: (an empty reply: no text, no tool calls)"
            return f"assistant: {short(m['content'])}" + (f" → {calls}" if calls else "")
        case "tool_call":
            return f"tool call {d.get('name')}({short(d.get('arguments'), 80)})"
        case "tool_result":
            flag = "error" if d.get("is_error") else "result"
            return f"tool {flag} {d.get('name')}: {short(d.get('content'))}"
        case "state_update":
            return f"Σ ← {short(d.get('patch'), 80)}" + (" · done" if d.get("done") else "")
        case "patch_rejected":
            return f"patch rejected (attempt {d.get('attempt')}): {short(d.get('error'))}"
        case "distillation":
            return (
                f"distillation ({d.get('mode')}): {d.get('tokens_before')} → {d.get('tokens_after')} tokens, "
                f"{plural(len(d.get('span_seqs') or []), 'message')} evicted"
            )
        case "distillation_declined":
            return f"distillation declined ({d.get('mode')}): {d.get('reason')} ({d.get('tokens_before')} → {d.get('tokens_after')})"
        case "summary_rejected":
            return f"{d.get('purpose')} rejected (attempt {d.get('attempt')}): {d.get('reason')}"
        case "retry":
            return f"retry {d.get('attempt')} in {d.get('delay_s')}s: {short(d.get('error'))}"
        case "callback_error":
            return f"callback failed ({d.get('callback')}): {short(d.get('error'))}"
        case "error":
            return f"error: {d.get('message')}"
        case "final" | "parked":
            return f"{e.kind}: {short(d.get('output') or '')}"
        case _:
            return _more(e)


def _more(e: Event) -> str:
    """The rarer events, each as a line a person reads (never a payload dumped whole)."""
    d = e.data
    match e.kind:
        case "resumed":
            return f"resumed after #{d.get('from_seq')}" + (" with a new input" if d.get("input") else "")
        case "cancelled":
            return f"cancelled: {short(d.get('reason') or '')}"
        case "notice":
            return f"notice ({d.get('source')}): {short(d.get('message'))}"
        case "recall_injected":
            passages = plural(len(d.get("passages") or []), "passage")
            return f"recalled {passages} ({d.get('tokens')} tokens) for “{short(d.get('query'), 60)}”"
        case "tool_source_error":
            return f"tool source {d.get('server')} failed ({d.get('phase')}): {short(d.get('error'))}"
        case "spawn_child_started":
            return f"sub-agent {d.get('agent')} started: run {d.get('run_id')}"
        case "spawn_child_result":
            said = d.get("output") if d.get("ok") else d.get("error")
            return f"sub-agent {d.get('agent')} (run {d.get('run_id')}) {d.get('status')}: {short(said or '')}"
        case "pin" | "unpin":
            what = f"#{d['seq']}" if d.get("seq") is not None else short(d.get("text") or d.get("pin") or "", 60)
            return f"{'pinned' if e.kind == 'pin' else 'unpinned'} {what} (by {d.get('by')})"
        case "mark_private" | "declassify":
            done = "marked private" if e.kind == "mark_private" else "declassified"
            source = f", repeating #{d['derived_from']}" if d.get("derived_from") is not None else ""
            return f"#{d.get('seq')} {done} (by {d.get('by')}{source})"
        case "card_rejected":
            return f"card rejected (depth {d.get('depth')}, attempt {d.get('attempt')}): {d.get('reason')}"
        case "fold_queued" | "distillation_queued":
            queued = "fold" if e.kind == "fold_queued" else d.get("mode")
            return f"{queued} queued for between turns (pressure {d.get('pressure')} of {d.get('budget')})"
        case "fold_skipped":
            return f"fold skipped: {short(d.get('reason') or d.get('error') or '')}"
        case "harvest_banked":
            return f"span of #{d.get('distillation_seq')} {d.get('outcome')} for {d.get('scope') or 'memory'}"
        case "harvest_error":
            return f"harvest failed: {short(d.get('message'))}"
        case "run_queued":
            return f"queued for any `loomrt worker` (by {d.get('by')})"
        case "schema_proposed":
            return f"state schema proposed: {short(d.get('note') or '')}"
        case _:  # a kind added later: its fields, one after another
            return f"{e.kind}: " + " · ".join(f"{k} {short(v, 40)}" for k, v in d.items())


_STYLE = {
    "error": "red",
    "callback_error": "red",
    "patch_rejected": "yellow",
    "retry": "yellow",
    "summary_rejected": "yellow",
    "distillation": "cyan",
    "distillation_declined": "cyan",
    "final": "green",
    "parked": "green",
}


class EventPrinter:
    """A run listener that prints each event as it is recorded (to stderr)."""

    def __init__(self, console: Console):
        self.console = console

    def __call__(self, e: Event) -> None:
        style = _STYLE.get(e.kind, "dim")
        self.console.print(f"[{style}]#{e.seq:<4} {escape(describe(e))}[/{style}]", highlight=False)


def events_table(events: list[Event]) -> Table:
    table = Table("seq", "kind", "what", box=None, pad_edge=False)
    for e in events:
        table.add_row(str(e.seq), e.kind, describe(e))
    return table
