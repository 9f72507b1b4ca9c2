"""Events: the rows of the record.

An event is a value, not a log line: the record stores it, the CLI renders it, and
(in a later issue) MCP streams it. Each event has a ``kind`` from :data:`EVENT_KINDS`
and a JSON ``data`` payload whose shape :mod:`loomrt.payloads` defines (one typed model
per kind, published as ``docs/events.schema.json``).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from loomrt.messages import Message
from loomrt.payloads import PAYLOADS

__all__ = ["EventKind", "EVENT_KINDS", "LIFECYCLE_KINDS", "Event", "RunInfo", "run_status", "message_of"]

EVENT_KINDS: tuple[str, ...] = tuple(p.model_fields["kind"].annotation.__args__[0] for p in PAYLOADS)  # type: ignore[union-attr]
"""Every kind of event, in the order :data:`loomrt.payloads.PAYLOADS` lists their payloads."""
EventKind = Literal[EVENT_KINDS]  # type: ignore[valid-type]


class Event(BaseModel):
    """One row of the record."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    """The run this event belongs to."""
    seq: int
    """Monotonically increasing per run, starting at 1."""
    kind: EventKind
    """What happened."""
    ts: float = Field(default_factory=time.time)
    """Unix time when it was recorded."""
    data: dict[str, Any] = Field(default_factory=dict)
    """The payload; its keys depend on ``kind``."""
    hash: str | None = None
    """The ledger hash, chained to the previous event of the run (:mod:`loomrt.record.ledger`)."""

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class RunInfo(BaseModel):
    """What the record knows about a run as a whole (written once, when it starts)."""

    run_id: str
    agent: str
    def_hash: str
    mode: str
    model: str
    interactive: bool = False
    agents_file: str | None = None
    parent_run_id: str | None = None
    """The run that spawned this one (a sub-agent), if any."""
    root_run_id: str | None = None
    """The run at the top of the spawn tree (this one's own id, or None, for a top-level run)."""
    forked_from: str | None = None
    """The run this one was forked from (``loomrt runs fork``): it shares that run's history
    up to ``fork_seq``, and its own seqs continue after it."""
    fork_seq: int | None = None
    chain: str | None = None
    """The run's ledger scheme (:mod:`loomrt.record.ledger`): ``v1`` plain, ``v2`` keyed; None
    on a run not written yet (the store chooses: v2 while it has a ledger key)."""
    created_at: float = Field(default_factory=time.time)
    status: str = "active"
    """Derived from the last event: active, parked, done, failed."""
    last_seq: int = 0


LIFECYCLE_KINDS: tuple[str, ...] = (
    "run_started",
    "resumed",
    "user_input",
    "parked",
    "final",
    "error",
    "cancelled",
    "run_queued",
)
"""The kinds a run's status derives from. Every other event (a notice, a retry, a
callback error, later a pin) is out of band: it never changes the status."""


def run_status(last_kind: str | None) -> str:
    """A run's status, derived from the kind of its last lifecycle event (the record is
    never updated): done, failed, parked, cancelled, queued (waiting for a worker), else active."""
    return {
        "final": "done",
        "error": "failed",
        "parked": "parked",
        "cancelled": "cancelled",
        "run_queued": "queued",
    }.get(last_kind or "", "active")


def message_of(event: Event) -> Message | None:
    """The one reader: the working-context message an event adds, verbatim, or None.

    ``run_started`` adds the system message, ``user_input`` a user message (the view pins
    the first one when ``keep_first`` is on), ``assistant_message`` and ``tool_result`` theirs. The projection and
    the recall rebuild both read the record through this function.
    """
    d = event.data
    if event.kind == "run_started":
        system = d.get("system")
        return Message(role="system", content=system, seq=event.seq, ts=event.ts) if system else None
    if event.kind == "user_input":
        said = d.get("said_at")  # an imported history: when its words were said, not recorded
        return Message(
            role="user", content=d.get("content") or "", seq=event.seq, ts=event.ts if said is None else said
        )
    if event.kind == "assistant_message":
        return Message.from_dict({**d["message"], "seq": event.seq, "ts": event.ts})
    if event.kind == "tool_result":
        return Message(
            role="tool",
            content=d.get("content") or "",
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
            seq=event.seq,
            ts=event.ts,
        )
    return None
