"""Messages of the working context, and evicted spans.

A :class:`Message` is immutable. Each one that comes from the record carries the
``seq`` of its event, so a working context can always be traced back to the record
(a synthetic message, such as a recap block, has ``seq=None`` and ``synthetic`` set).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

__all__ = ["Role", "ToolCall", "Message", "EvictedSpan", "EvictedSpanCallback", "SEARCH_TOOLS", "summarized_text"]

Role = Literal["system", "user", "assistant", "tool"]

SEARCH_TOOLS = frozenset({"Recall", "Describe", "Expand", "Grep"})
"""The tools that search a run's own history. A call to one is a query, not something said,
and its result is a copy of what it searched, so Recall and Grep leave both out
(:meth:`Message.searched_text`): searching the searches finds old queries before the facts."""


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for."""

    id: str
    name: str
    arguments: dict[str, Any]

    def to_litellm(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        """A call as a record holds it. A malformed one (arguments that are not an object,
        which an older version could record) reads as a call whose arguments say so: the
        record is never rewritten, and it can still be shown, verified and resumed."""
        args = d.get("arguments")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            args = {"malformed_arguments": f"{args!r:.200}"}
        return cls(id=str(d.get("id") or ""), name=str(d.get("name") or "?"), arguments=dict(args))


@dataclass(frozen=True)
class Message:
    """One message of the working context.

    ``synthetic`` names what made a message that is not in the record verbatim: a mode's
    block (``"recap"``, ``"summary"``, ``"state"``, ``"observation"``, ``"feedback"``, ``"card"``),
    the pins (``"pin"``), a reference to an externalised message (``"external"``), or the
    recalled passages put into one prompt (``"recall"``, never in the working context).
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    seq: int | None = None
    ts: float | None = None
    synthetic: str | None = None
    pinned: bool = False
    ref: str | None = None
    """What a synthetic message stands for: a card's id (``synthetic="card"``)."""

    def to_litellm(self) -> dict[str, Any]:
        """The message as litellm / OpenAI chat format (a fresh dict each call; the message
        is immutable, so the work is done once)."""
        return dict(self._wire)

    @cached_property
    def _wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content or ""}
        if self.tool_calls:
            out["tool_calls"] = [tc.to_litellm() for tc in self.tool_calls]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id or ""
            if self.name:
                out["name"] = self.name
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [tc.to_dict() for tc in self.tool_calls]
        for key in ("tool_call_id", "name", "seq", "ts", "synthetic", "ref"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        if self.pinned:
            d["pinned"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        return cls(
            role=d["role"],
            content=d.get("content") or "",
            tool_calls=tuple(ToolCall.from_dict(tc) for tc in d.get("tool_calls") or ()),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
            seq=d.get("seq"),
            ts=d.get("ts"),
            synthetic=d.get("synthetic"),
            ref=d.get("ref"),
            pinned=bool(d.get("pinned", False)),
        )

    def with_(self, **changes: Any) -> Message:
        return replace(self, **changes)

    def text_for_search(self) -> str:
        """Everything searchable in this message: text, tool names and their arguments."""
        parts = [self.content] if self.content else []
        for tc in self.tool_calls:
            parts.append(f"{tc.name}({json.dumps(tc.arguments, ensure_ascii=False)})")
        return "\n".join(parts)

    def searched_text(self) -> str:
        """What Recall indexes and Grep searches in this message: :meth:`text_for_search`
        less the calls to :data:`SEARCH_TOOLS`, and nothing of such a tool's result."""
        if self.role == "tool":
            return "" if self.name in SEARCH_TOOLS else self.content
        calls = tuple(tc for tc in self.tool_calls if tc.name not in SEARCH_TOOLS)
        return (
            self.text_for_search()
            if len(calls) == len(self.tool_calls)
            else replace(self, tool_calls=calls).text_for_search()
        )


def summarized_text(m: Message) -> str:
    """What a summariser is shown of ``m``: its :meth:`~Message.searched_text`, or for a
    search of the history a mark that one was made (its query and its copies of older
    messages are no news to summarise; the record keeps them)."""
    if m.role == "tool" and m.name in SEARCH_TOOLS:
        return "(search results)"
    said = m.searched_text()
    return said if said or not m.tool_calls else "(searched the history)"


@dataclass(frozen=True)
class EvictedSpan:
    """The messages one distillation removed from the working context.

    They stay in the record; the evicted-span callbacks (recall index, harvest bank)
    receive this value at the last moment the messages exist in the working context.
    """

    run_id: str
    agent: str
    mode: str
    distillation_seq: int
    messages: tuple[Message, ...]
    """The evicted messages with their full text (a message cut at ``message_max_tokens``
    in the working context arrives here whole, as the record holds it)."""

    @property
    def seqs(self) -> list[int]:
        return [m.seq for m in self.messages if m.seq is not None]


EvictedSpanCallback = Callable[[EvictedSpan], Awaitable[None] | None]
"""Receives every evicted span; one that raises is recorded as a callback_error event."""
