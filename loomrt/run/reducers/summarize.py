"""What recap and compaction share: splice the context, have a model write prose about
the middle, and put that prose between the head and the tail."""

from __future__ import annotations

from loomrt.messages import Message
from loomrt.run.model_calls import call_model
from loomrt.run.reducers.base import Reduction
from loomrt.run.splice import splice
from loomrt.run.state import RunState

__all__ = ["transcript", "distil_with_prose"]

_MAX_TRANSCRIPT_CHARS = 24000


def transcript(messages: list[Message], *, limit: int = _MAX_TRANSCRIPT_CHARS) -> str:
    """The messages as plain text, each line marked with its record pointer ``[#seq]``."""
    lines = []
    for m in messages:
        ref = f"[#{m.seq}] " if m.seq is not None else ""
        who = m.name or m.role
        body = m.text_for_search()
        if m.role == "tool":
            who = f"tool {m.name or ''}".strip()
        lines.append(f"{ref}{who}: {body}")
    text = "\n".join(lines)
    if len(text) > limit:  # keep the end: it is what the next step builds on
        text = "[... earlier lines are in the record]\n" + text[-limit:]
    return text


async def distil_with_prose(
    run: RunState, *, purpose: str, synthetic: str, instructions: str, label: str, max_chars: int | None
) -> Reduction | None:
    """Replace the middle of the context with a model-written block (a recap or a summary).

    An earlier block of the same kind sits in the middle and is folded into the new one.
    """
    cut = splice(run.context, run.spec.context.keep_last_n)
    span = [m for m in cut.middle if m.synthetic is None]
    if not span:
        return None
    previous = [m.content for m in cut.middle if m.synthetic == synthetic]
    parts = []
    if previous:
        parts.append("Your earlier account (fold it into the new one):\n" + "\n\n".join(previous))
    parts.append("The part of the conversation to distil:\n" + transcript(span))
    task = next((m.content for m in cut.head if m.role == "user"), "")
    if task:
        parts.insert(0, f"The task: {task}")
    prompt = [
        Message(role="system", content=instructions),
        Message(role="user", content="\n\n".join(parts)),
    ]
    response = await call_model(
        run, prompt, purpose=purpose, provider=run.summarizer,  # type: ignore[arg-type]
        max_tokens=max(256, (max_chars or 4000) // 3),
    )
    text = response.text.strip()
    if max_chars and len(text) > max_chars:
        text = text[: max_chars - 1].rstrip() + "…"
    block = Message(role="user", content=f"{label}\n{text}", synthetic=synthetic)
    return Reduction(context=[*cut.head, block, *cut.tail], evicted=span, summary=text)
