"""The event grammar: the orders of events the runtime can write, checked by ``runs verify``.

A hash chain shows that a record was not changed after it was written; it cannot show that
it was written by the runtime. A writer who appends well-chained events by hand (a forged
answer and a ``final``) passes the chain. The rules below are what every run the runtime
plays obeys, so a record that breaks one was written by something else:

- a run's record opens with one ``run_started`` (a fork's, after the seq it was forked at);
- an ``assistant_message`` follows a ``model_call`` made since the previous one;
- a ``tool_call`` and a ``tool_result`` name a call an earlier ``assistant_message`` asked
  for (in the run, or in the shared history of a fork), and each call has one result;
- after ``final``, ``error`` or ``cancelled``, nothing of a turn is written until a
  ``resumed`` opens one (``runs resume`` and ``runs continue`` write it); after ``parked``,
  a ``user_input`` or a ``resumed`` opens the next turn, or a ``final`` ends the chat (and
  a chat's failed turn parks after its ``error``). Out-of-band events (pins, marks,
  folds between turns, harvest, notices) may come at any time.
"""

from __future__ import annotations

from collections.abc import Iterable

from loomrt.events import Event

__all__ = ["grammar_problems", "TURN_KINDS", "CLOSING_KINDS"]

CLOSING_KINDS = ("final", "error", "cancelled", "parked")
"""The kinds that end a turn: what follows them belongs to the next turn, or to no turn."""
TURN_KINDS = frozenset(
    {
        "assistant_message",
        "tool_call",
        "tool_result",
        "recall_injected",
        "spawn_child_started",
        "spawn_child_result",
        "final",
        "parked",
    }
)
"""The kinds written only inside a turn (a ``model_call`` is not one: a turn cancelled while
the model thought still records what the call cost, after ``cancelled``)."""


def _calls(event: Event) -> list[str]:
    message = event.data.get("message") or {}
    return [str(c.get("id")) for c in message.get("tool_calls") or () if isinstance(c, dict) and c.get("id")]


def grammar_problems(events: Iterable[Event], shared: Iterable[Event] = ()) -> list[str]:
    """One line per event the runtime could not have written where it stands; empty when
    the record reads as a run the runtime played. ``shared``: a fork's history up to its
    fork point (the calls asked for there may be answered in the fork)."""
    asked: set[str] = set()
    answered: set[str] = set()
    for e in shared:
        if e.kind == "assistant_message":
            asked.update(_calls(e))
        elif e.kind == "tool_result" and e.data.get("tool_call_id"):
            answered.add(str(e.data["tool_call_id"]))
    problems: list[str] = []
    closed: str | None = None  # the kind that ended the last turn, while no new one is open
    called = False  # a model call since the last assistant message
    for i, e in enumerate(events):
        where = f"#{e.seq} ({e.kind})"
        if (i == 0) != (e.kind == "run_started"):
            problems.append(
                f"{where}: a record opens with run_started, once"
                if e.kind == "run_started"
                else f"{where}: the record does not open with run_started"
            )
        # `loomrt chat` ends a parked run; a chat's failed turn records error, then parks for the next input
        ends_chat = (e.kind == "final" and closed == "parked") or (e.kind == "parked" and closed == "error")
        if e.kind == "resumed" or (e.kind == "user_input" and closed in (None, "parked")):
            closed = None
        elif e.kind == "user_input" or (e.kind in TURN_KINDS and closed is not None and not ends_chat):
            problems.append(f"{where}: written after the turn ended with {closed}, and no resumed opened a new one")
        if e.kind == "model_call":
            called = True
        elif e.kind == "assistant_message":
            if not called:
                problems.append(f"{where}: an answer with no model call before it")
            called = False
            asked.update(_calls(e))
        elif e.kind in ("tool_call", "tool_result"):
            call = str(e.data.get("id") if e.kind == "tool_call" else e.data.get("tool_call_id") or "")
            if call and call not in asked:
                problems.append(f"{where}: names tool call {call!r}, which no answer before it asked for")
            if e.kind == "tool_result" and call:
                if call in answered:
                    problems.append(f"{where}: a second result for tool call {call!r}")
                answered.add(call)
        if e.kind in CLOSING_KINDS:
            closed = e.kind
    return problems
