"""Pins: what survives every distillation verbatim, in every retention mode.

Pinned are:

- the task (the first user input, with ``keep_first``), which sits in the context's head;
- the current user request after the task, until it is answered (a ``parked`` or ``final``
  answers it);
- a record message an operator pinned (``loomrt runs pin RUN_ID SEQ``) or the model did
  (the ``Pin`` tool, with ``context.model_pins``), and a text the model pinned;
- the definition's ``context.pins``, which go into the system prompt (never summarised).

A pin is a ``pin`` event on the record and an ``unpin`` ends it; neither changes the run's
status. After every distillation, whatever mode wrote it, :func:`keep_pins` puts each pin
that left the working context back as a verbatim block (``synthetic="pin"``) right after
the head, so the agent works from the exact words. Pins share a token budget
(``context.pins_max_tokens``); :func:`check_pin` refuses one that would exceed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loomrt.errors import SpecError
from loomrt.messages import Message
from loomrt.tokens import count_text

if TYPE_CHECKING:
    from loomrt.run.projection import RunView

__all__ = [
    "Pin",
    "PinError",
    "PIN_BLOCK",
    "keep_pins",
    "check_pin",
    "pin_payload",
    "definition_pins_text",
    "pin_tool",
]

PIN_BLOCK = "pin"
"""The ``synthetic`` tag of a pinned block in the working context."""


class PinError(SpecError):
    """A pin that cannot be made (an unknown seq, a pin over the budget): a caller's mistake,
    so the CLI exits 2 with it."""


@dataclass(frozen=True)
class Pin:
    """One pin: a record message (``seq``) or a text, with why it was pinned."""

    id: str
    """``#SEQ`` for a record message, ``text-N`` for a pinned text."""
    seq: int | None
    text: str
    """The verbatim text kept (a message's full content)."""
    note: str = ""
    by: str = "operator"
    """operator, model or runtime (the current request)."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "seq": self.seq, "note": self.note, "by": self.by, "tokens": count_text(self.text)}


def _label(message: Message | None) -> str:
    if message is None:
        return "text"
    if message.role == "tool":
        return f"tool result of {message.name}" if message.name else "tool result"
    return message.role


def _block(pin: Pin, message: Message | None) -> Message:
    why = f" · {pin.note}" if pin.note else ""
    return Message(role="user", content=f"[pinned {pin.id} · {_label(message)}{why}]\n{pin.text}", synthetic=PIN_BLOCK)


def keep_pins(view: RunView, context: list[Message]) -> list[Message]:
    """``context`` (a distillation's new working context) with every pin present: a pinned
    record message that is not in it verbatim comes back as a block after the head."""
    context = [m for m in context if m.synthetic != PIN_BLOCK]
    present = {m.seq for m in context if m.seq is not None and m.synthetic is None}
    pins = list(view.pins.values())
    request = view.request_seq  # the task is keep_first's to keep (or, with keep_first: false, to let go)
    if request is not None and request != view.task_seq and request not in {p.seq for p in pins}:
        message = view.original(view.messages[request]) if request in view.messages else None
        if message is not None:
            pins.append(
                Pin(f"#{request}", request, message.content, "the current request, until it is answered", "runtime")
            )
    blocks = []
    for pin in pins:
        if pin.seq is not None and pin.seq in present:
            continue
        message = view.original(view.messages[pin.seq]) if pin.seq is not None and pin.seq in view.messages else None
        blocks.append(_block(pin, message))
    if not blocks:
        return context
    head = 0
    while head < len(context) and (context[head].role == "system" or context[head].pinned):
        head += 1
    return [*context[:head], *blocks, *context[head:]]


def check_pin(view: RunView, *, seq: int | None, text: str | None, limit: int, run_id: str) -> Pin:
    """The pin that ``seq`` (a record message) or ``text`` would make, or PinError saying why not."""
    if (seq is None) == (text is None or not text.strip()):
        raise PinError("pin either a record message (its seq) or a text, not both and not neither")
    if seq is not None:
        if seq not in view.messages:
            raise PinError(
                f"run {run_id} has no message at #{seq}: pin a user input, an assistant message or a "
                "tool result (`loomrt runs events RUN_ID` lists their seqs)"
            )
        if view.messages[seq].role == "system":
            raise PinError("the system prompt is never summarised: it needs no pin")
        pin_id = f"#{seq}"
        if pin_id in view.pins:
            raise PinError(f"#{seq} is pinned already")
        body = view.original(view.messages[seq]).content
    else:
        assert text is not None
        pin_id, body = f"text-{view.pin_count + 1}", text
    used = sum(count_text(p.text) for p in view.pins.values())
    size = count_text(body)
    if used + size > limit:
        raise PinError(
            f"pinning {pin_id} ({size} tokens) would take the pins to {used + size} tokens, over "
            f"context.pins_max_tokens ({limit}; {used} in use). Unpin something "
            "(`loomrt runs unpin RUN_ID SEQ`), pin a shorter message, or raise context.pins_max_tokens."
        )
    return Pin(pin_id, seq, body)


def pin_payload(pin: Pin, *, note: str, by: str) -> dict[str, Any]:
    """The ``pin`` event's data for ``pin`` (a message pin keeps its seq, a text pin its text)."""
    data: dict[str, Any] = {"pin": pin.id, "note": note, "by": by}
    if pin.seq is not None:
        data["seq"] = pin.seq
    else:
        data["text"] = pin.text
    return data


def definition_pins_text(pins: list[str]) -> str:
    """The definition's ``context.pins`` as they go into the system prompt."""
    if not pins:
        return ""
    lines = "\n".join(f"- {p}" for p in pins)
    return f"Pinned (standing instructions and parameters of the task; they always hold):\n{lines}"


def pin_tool(run: Any) -> Any:
    """The ``Pin`` tool of ``run`` (granted by ``context.model_pins``)."""
    from loomrt.tools import Tool

    async def pin(seq: int | None = None, text: str | None = None, reason: str = "") -> str:
        made = check_pin(run.view, seq=seq, text=text, limit=run.spec.context.pins_max_tokens, run_id=run.run_id)
        await run.add("pin", pin_payload(made, note=reason, by="model"))
        return f"pinned {made.id}: it stays in your working context, word for word, through every distillation"

    return Tool(
        name="Pin",
        description=(
            "Keep something in your working context word for word, through every summary: a record message by its "
            "seq (the [#seq] in summaries and Recall results) or a short text. Pin what must not be paraphrased: "
            "decisions the user made, exact values, open questions you still owe. Pins share a small token budget."
        ),
        parameters={
            "type": "object",
            "properties": {
                "seq": {"type": "integer", "description": "The record seq of a message to pin."},
                "text": {"type": "string", "description": "A text to pin (instead of a seq)."},
                "reason": {"type": "string", "description": "Why it must stay verbatim."},
            },
        },
        fn=pin,
    )
