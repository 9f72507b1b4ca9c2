"""Private material: what only its own run may see.

A message is private by provenance, never by matching its text: a tool declared
``private`` (or a private MCP server's tool), a tool result returned as
:class:`loomrt.tools.Private`, or a seq an operator marked (``loomrt runs private RUN_ID
SEQ``, a ``mark_private`` event). The record keeps it whole, and its own run works with it
(the working context, Recall in that run, pins). Everywhere else it is a placeholder:

- a summariser, recap or compaction prompt gets the placeholder (:func:`redact`), so no
  summary can repeat it, whatever the summariser does with its input;
- in stateful mode the model reads a private observation (it is its own run) and may write
  it into Σ: the keys a step's patch set while the step's prompt held private material are
  Σ's private keys, and Σ as the run hands it out (its result, a sub-agent's Σ to its
  parent, MCP) leaves them out and names them in ``state_withheld`` (:func:`withhold`);
- what leaves the run for a reader (``runs export``, MCP ``get_events`` and resources, an
  MCP client's ``recall``) has it replaced (:func:`redact_events`) unless the reader asks
  for it explicitly (``--include-private``, ``include_private: true``).

``runs show`` is the operator's view of the record: it shows private material, marked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from loomrt.events import Event
from loomrt.messages import Message
from loomrt.record.store import Store

if TYPE_CHECKING:
    from loomrt.recall.tool import RecallHit
    from loomrt.run.projection import RunView

__all__ = [
    "placeholder",
    "private_seqs",
    "redact",
    "redact_events",
    "mark_private_in_record",
    "withhold",
    "visible_to",
]


def placeholder(seq: int | None, role: str = "tool") -> str:
    """The words that stand for private message ``seq`` outside its run."""
    what = "tool result" if role == "tool" else "message"
    return f"[private {what} #{seq}: withheld from summaries, memory and other runs]"


def private_seqs(events: Iterable[Event]) -> set[int]:
    """The seqs of the record's private messages."""
    out: set[int] = set()
    for e in events:
        if e.kind == "tool_result" and e.data.get("private"):
            out.add(e.seq)
        elif e.kind == "mark_private":
            out.add(int(e.data["seq"]))
    return out


def visible_to(view: RunView) -> Callable[[RecallHit], bool]:
    """Whether run ``view`` (a :class:`~loomrt.run.projection.RunView`) may see a recalled hit
    (a :class:`~loomrt.recall.tool.RecallHit`): its own evicted messages, private ones
    included (it saw them), durable memory (scoped, and never private), and a fork's
    shared history except the parent's private messages. Recall and recall injection both
    ask it, as it is when they ask (a message marked private later is private from then on)."""

    def visible(hit: RecallHit) -> bool:
        if getattr(hit, "source", None) != "family":
            return True
        return hit.seq is None or hit.seq not in view.private

    return visible


def redact(message: Message, private: set[int]) -> Message:
    """``message``, or its placeholder when it is private."""
    if message.seq is None or message.seq not in private:
        return message
    return message.with_(content=placeholder(message.seq, message.role), tool_calls=[])


def _redacted(e: Event, private: set[int]) -> Event:
    d: dict[str, Any] = dict(e.data)
    if e.kind in ("tool_result", "user_input") and e.seq in private:
        d["content"] = placeholder(e.seq, "tool" if e.kind == "tool_result" else "user")
    elif e.kind == "assistant_message" and e.seq in private:
        d["message"] = {**d.get("message", {}), "content": placeholder(e.seq, "assistant"), "tool_calls": []}
    elif e.kind == "recall_injected" and (
        any(p.get("seq") in private or p.get("before_seq") in private for p in d.get("passages") or ())
        or any(s in private for s in d.get("query_seqs") or ())
    ):
        d["passages"] = [_redacted_passage(p, private) for p in d.get("passages") or ()]
        quoted = [s for s in d.get("query_seqs") or () if s in private]
        if quoted:
            d["query"] = f"[query withheld: it quotes private message #{quoted[0]}]"
    else:
        return e
    d["redacted"] = True
    return e.model_copy(update={"data": d})


def _redacted_passage(passage: dict[str, Any], private: set[int]) -> dict[str, Any]:
    """A recalled passage with its private text (or the private message it quotes before it) withheld."""
    out = dict(passage)
    if out.get("seq") in private:
        out["text"] = placeholder(out["seq"], str(out.get("role") or "tool"))
    if out.get("before_seq") in private:
        out.pop("before", None)
    return out


def redact_events(events: Iterable[Event], private: set[int] | None = None) -> list[Event]:
    """``events`` with every private message replaced by its placeholder (``redacted: true``);
    ``private`` is the record's private seqs (by default, those ``events`` name)."""
    events = list(events)
    private = private_seqs(events) if private is None else private
    return [_redacted(e, private) for e in events] if private else events


def withhold(state: dict[str, Any] | None, keys: set[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """Σ without its private keys, and which keys were left out."""
    if state is None or not keys:
        return state, []
    withheld = sorted(k for k in keys if k in state)
    return {k: v for k, v in state.items() if k not in keys}, withheld


def mark_private_in_record(store: Store, run_id: str, seq: int) -> None:
    """An operator's ``loomrt runs private RUN_ID SEQ``: the message at ``seq`` is private from now on."""
    from loomrt.errors import NotFoundError
    from loomrt.events import message_of

    event = next((e for e in store.events(run_id) if e.seq == seq), None)
    message = message_of(event) if event is not None else None
    if message is None or message.role == "system":
        raise NotFoundError(
            f"run {run_id} has no message at #{seq} to mark private (a user input, an assistant "
            "message or a tool result; `loomrt runs events RUN_ID` lists their seqs)"
        )
    store.append(run_id, "mark_private", {"seq": seq, "by": "operator"})
