"""Rebuild a run's working context, Σ and totals from its record alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loomrt.events import Event
from loomrt.messages import Message
from loomrt.providers.base import Usage

__all__ = ["Projection", "project"]


@dataclass
class Projection:
    context: list[Message] = field(default_factory=list)
    state: dict[str, Any] | None = None
    usage: Usage = field(default_factory=Usage)
    model_calls: int = 0
    turn_calls: int = 0
    summary_calls: int = 0
    distillations: int = 0
    output: str | None = None
    last_kind: str | None = None
    last_seq: int = 0
    reported_prompt_tokens: int = 0
    patch_failures: int = 0
    declined_at: int = -1
    declined_tokens: int = -1


def project(events: list[Event], *, keep_first: bool = True) -> Projection:
    """Replay ``events`` (one run's, in seq order) into a :class:`Projection`."""
    p = Projection()
    by_seq: dict[int, Message] = {}
    seen_user = False

    def add(m: Message) -> None:
        by_seq[m.seq] = m  # type: ignore[index]
        p.context.append(m)

    for e in events:
        d = e.data
        p.last_kind, p.last_seq = e.kind, e.seq
        if e.kind == "run_started":
            if d.get("system"):
                add(Message(role="system", content=d["system"], seq=e.seq, ts=e.ts))
        elif e.kind == "user_input":
            add(Message(role="user", content=d["content"], seq=e.seq, ts=e.ts, pinned=keep_first and not seen_user))
            seen_user = True
        elif e.kind == "assistant_message":
            add(Message.from_dict({**d["message"], "seq": e.seq, "ts": e.ts}))
        elif e.kind == "tool_result":
            add(Message(role="tool", content=d["content"], tool_call_id=d.get("tool_call_id"), name=d.get("name"), seq=e.seq, ts=e.ts))
        elif e.kind == "distillation":
            p.context = [
                by_seq[r["seq"]].with_(pinned=bool(r.get("pinned"))) if "seq" in r else Message.from_dict(r["message"])
                for r in d["context"]
            ]
            p.distillations += 1
            p.reported_prompt_tokens = 0
        elif e.kind == "state_update":
            p.state = d["state"]
            p.patch_failures = 0
        elif e.kind == "patch_rejected":
            p.patch_failures = d.get("attempt", p.patch_failures + 1)
            if d.get("feedback"):
                p.context.append(Message(role="user", content=d["feedback"], synthetic="feedback"))
        elif e.kind == "distillation_declined":
            p.declined_at = len(p.context)
            if d.get("reason") == "result not smaller":
                p.declined_tokens = d.get("tokens_before", -1)
        elif e.kind == "model_call":
            u = d.get("usage") or {}
            p.usage = p.usage + Usage(u.get("input_tokens", 0), u.get("output_tokens", 0), u.get("cached_tokens", 0))
            p.model_calls += 1
            if d.get("purpose") == "turn":
                p.turn_calls += 1
                p.reported_prompt_tokens = u.get("input_tokens", 0)
            else:
                p.summary_calls += 1
        elif e.kind in ("final", "parked"):
            p.output = d.get("output")
    return p
