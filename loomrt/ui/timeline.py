"""A run's record as the web page's timeline: one :class:`Item` per event, and the tokens
over time (the chart's series). Pure functions over events a reader already got through
:func:`loomrt.visibility.reader_events` (private material is placeholders by then)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loomrt.audit import Marker, transcript
from loomrt.events import Event

__all__ = ["Item", "item_of", "timeline", "tokens_series", "TIMELINE_PAGE"]

TIMELINE_PAGE = 200
"""Events per page of the timeline (the next page loads when asked)."""


@dataclass(frozen=True)
class Item:
    """One event of the timeline: what it is (``css`` colours it), a title and its text."""

    seq: int
    kind: str
    css: str
    title: str
    text: str = ""
    ts: float = 0.0
    prompt: bool = False
    """A turn's model call: "what the model saw" opens its prompt."""
    span: tuple[int, ...] = ()
    """A distillation's evicted span (seqs)."""
    tokens: tuple[int, int] | None = None
    """A distillation's (or a declined one's) working-context tokens before and after."""
    worked_from: tuple[str, ...] = field(default=())
    """What a distillation put in the working context (recap, summary, Σ, pins)."""
    private: bool = False
    """Private material the reader sees as its placeholder."""
    child: str | None = None
    """A spawned run's id (its page is a link)."""


def _short(value: Any, width: int = 600) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def _usage(d: dict[str, Any]) -> str:
    u = d.get("usage") or {}
    cached = f" ({u['cached_tokens']:,} cached)" if u.get("cached_tokens") else ""
    injected = f" · {d['injected_tokens']:,} recalled tokens injected" if d.get("injected_tokens") else ""
    return f"{int(u.get('input_tokens') or 0):,} in{cached} · {int(u.get('output_tokens') or 0):,} out{injected}"


def item_of(e: Event) -> Item:
    """The timeline's item for event ``e``."""
    d, k = e.data, e.kind
    base: dict[str, Any] = {"seq": e.seq, "kind": k, "ts": e.ts, "private": bool(d.get("redacted"))}
    if k == "run_started":
        fork = f" · fork of {d['forked_from']} at #{d.get('fork_seq')}" if d.get("forked_from") else ""
        return Item(**base, css="start", title=f"run started · {d.get('mode')}{fork}", text=_short(d.get("system", "")))
    if k == "user_input":
        return Item(**base, css="turn", title="user · a turn begins", text=str(d.get("content", "")))
    if k == "model_call":
        turn = d.get("purpose") == "turn"
        return Item(
            **base,
            css="call" if turn else "call distil-call",
            title=f"model call · {d.get('purpose')} · {d.get('model')}",
            text=_usage(d),
            prompt=d.get("prompt_from") == "context",
        )
    if k == "assistant_message":
        m = d.get("message") or {}
        calls = [str(c.get("name")) for c in m.get("tool_calls") or ()]
        title = "assistant" + (f" → {', '.join(calls)}" if calls else "")
        return Item(**base, css="assistant", title=title, text=str(m.get("content") or ""))
    if k == "tool_call":
        return Item(**base, css="tool", title=f"tool call · {d.get('name')}", text=_short(d.get("arguments")))
    if k == "tool_result":
        error = " · error" if d.get("is_error") else ""
        private = " · private" if d.get("private") or d.get("redacted") else ""
        return Item(
            **{**base, "private": bool(private)},
            css="tool",
            title=f"tool result · {d.get('name')}{error}{private}",
            text=_short(d.get("content", "")),
        )
    if k == "distillation":
        marker = transcript([e])[0]
        worked = marker.worked_from if isinstance(marker, Marker) else ()
        span = tuple(int(s) for s in d.get("span_seqs") or ())
        where = f"#{span[0]}–#{span[-1]}" if span else "nothing"
        return Item(
            **base,
            css="distil",
            title=f"distillation · {d.get('mode')} · evicted {where} ({len(span)} messages)",
            span=span,
            tokens=(int(d.get("tokens_before") or 0), int(d.get("tokens_after") or 0)),
            worked_from=tuple(worked),
        )
    if k == "distillation_declined":
        return Item(
            **base,
            css="declined",
            title=f"distillation declined · {d.get('mode')}",
            text=str(d.get("reason", "")),
            tokens=(int(d.get("tokens_before") or 0), int(d.get("tokens_after") or 0)),
        )
    if k == "recall_injected":
        passages = d.get("passages") or []
        seqs = ", ".join(f"#{p.get('seq')}" for p in passages if p.get("seq") is not None)
        return Item(
            **base,
            css="recall",
            title=f"recall injected · {len(passages)} passages · {d.get('tokens', 0)} tokens",
            text=f"query: {d.get('query', '')}" + (f"\npassages from {seqs}" if seqs else ""),
        )
    if k in ("pin", "unpin", "mark_private", "declassify"):
        return Item(**base, css="pin", title=k.replace("_", " "), text=_short(d))
    if k in ("spawn_child_started", "spawn_child_result"):
        status = f" · {d.get('status')}" if k == "spawn_child_result" else ""
        text = _short(d.get("state") or d.get("output") or d.get("error") or "")
        return Item(**base, css="child", title=f"child {d.get('agent')}{status}", text=text, child=str(d.get("run_id")))
    if k in ("error", "callback_error", "tool_source_error", "harvest_error"):
        return Item(**base, css="error", title=k.replace("_", " "), text=_short(d.get("message") or d))
    if k == "state_update":
        return Item(**base, css="state", title="Σ updated", text=_short(d.get("patch")))
    if k in ("final", "parked", "cancelled"):
        return Item(**base, css="end", title=k, text=_short(d.get("output") or d.get("reason") or ""))
    return Item(**base, css="other", title=k.replace("_", " "), text=_short(d))


def timeline(events: Iterable[Event]) -> list[Item]:
    """The timeline of ``events`` (one page of the record, or the whole of it)."""
    return [item_of(e) for e in events]


def tokens_series(calls: Iterable[Event], budget: int | None) -> dict[str, Any]:
    """The chart's data: per model call (x: its seq), the turn calls' input, the distillation
    calls' input apart, the cached share, and the run's budget line (uPlot's column layout)."""
    x: list[int] = []
    turn: list[int | None] = []
    distil: list[int | None] = []
    cached: list[int | None] = []
    for e in calls:
        u = e.data.get("usage") or {}
        tokens = int(u.get("input_tokens") or 0)
        x.append(e.seq)
        is_turn = e.data.get("purpose") == "turn"
        turn.append(tokens if is_turn else None)
        distil.append(None if is_turn else tokens)
        cached.append(int(u.get("cached_tokens") or 0))
    return {"data": [x, turn, distil, cached, [budget] * len(x) if budget else [None] * len(x)], "budget": budget}
