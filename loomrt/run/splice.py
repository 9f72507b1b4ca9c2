"""Cutting a working context into head, middle and tail without splitting tool pairs.

head: the system message and pinned messages (the task), which survive every boundary;
tail: the last ``keep_last_n`` messages, moved earlier so that it never starts with a
tool result whose call sits in the middle; middle: everything between, the candidate
evicted span.
"""

from __future__ import annotations

from dataclasses import dataclass

from loomrt.messages import Message

__all__ = ["Splice", "splice"]


@dataclass(frozen=True)
class Splice:
    head: list[Message]
    middle: list[Message]
    tail: list[Message]


def splice(context: list[Message], keep_last_n: int) -> Splice:
    """Split ``context``; tool-call / tool-result pairs always land on the same side."""
    n_head = 0
    while n_head < len(context) and (context[n_head].role == "system" or context[n_head].pinned):
        n_head += 1
    head, rest = context[:n_head], context[n_head:]
    cut = max(0, len(rest) - keep_last_n)
    while 0 < cut < len(rest) and rest[cut].role == "tool":
        cut -= 1  # include the assistant message that made the calls
    return Splice(head=list(head), middle=list(rest[:cut]), tail=list(rest[cut:]))
