"""What recap and compaction share: splice the context, have a model write prose about
the middle, check it, and put it between the head and the tail.

Every part of the span reaches the summariser: a span too large for one call is split on
message boundaries into parts that fit the summariser's own window, each part is
summarised, and the parts' accounts are merged. Each account is checked
(:mod:`loomrt.run.reducers.prose_check`); a rejected one is retried once with a stricter
prompt. If that is rejected too, the block is a **fallback**: an extract of the span (the
first sentence of each message, with its ``[#seq]`` pointer), marked ``fallback: true`` on
the distillation, so the budget holds whatever the summariser does; the words themselves
stay on the record and in Recall.

An earlier block is **carried forward**, not handed back to the model to rewrite: asked to
fold its earlier account into a new one, a 1.5B model writes the earlier account again
(measured: nine of nine rejected tries in a 103-turn chat). :func:`carry_forward` keeps the
earlier block's sentences that state exact values first, then the rest, in order, in at most
half the block, and the model writes only the new span's account in the room that is left.

After :data:`FALLBACK_STREAK` fallbacks in a row the
summariser is not paid again (the spend guard) except on every :data:`FALLBACK_RETRY`-th
distillation, which tries it once more.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from loomrt.exact import values
from loomrt.messages import Message, summarized_text
from loomrt.run._model_calls import call_model
from loomrt.run.reducers.base import Declined, Reduction
from loomrt.run.reducers.prose_check import check_prose
from loomrt.run.splice import splice
from loomrt.tokens import count_text, cut_text
from loomrt.visibility import redact

if TYPE_CHECKING:
    from loomrt.run.state import RunState

__all__ = [
    "block_chars",
    "BLOCK_SHARE",
    "transcript_parts",
    "distil_with_prose",
    "keep_pointers",
    "extract",
    "FALLBACK_STREAK",
    "FALLBACK_RETRY",
    "worked_example",
    "EXAMPLE_SPAN",
    "reply_prefix",
    "carry_forward",
    "CARRY_SHARE",
]

FALLBACK_STREAK = 2
"""Fallbacks in a row after which the summariser is no longer paid for every distillation."""
FALLBACK_RETRY = 4
"""Once the guard is on, every this-many-th distillation pays the summariser again (it may have recovered)."""

_FIRST_SENTENCE = re.compile(r"(.+?[.!?])(\s|$)")

CARRY_SHARE = 0.5
"""The most of a block that what is carried from the earlier block may take."""

_SENTENCE = re.compile(r".+?(?:[.!?](?=\s|$)|$)")


def carry_forward(earlier: str, max_chars: int) -> str:
    """What of an ``earlier`` block's account the next block keeps: its sentences that state
    an exact value (a number, a date, an id with digits, a path, a quoted string) first, then
    the others, each group earliest first, until :data:`CARRY_SHARE` of ``max_chars`` is
    used. Kept sentences stay in their order and on their lines. No model rewrites them."""
    units = [
        (line_no, m.group(0).strip())
        for line_no, line in enumerate(earlier.splitlines())
        for m in _SENTENCE.finditer(line)
        if m.group(0).strip()
    ]
    room = int(max_chars * CARRY_SHARE)
    order = sorted(range(len(units)), key=lambda i: (not values(units[i][1]), i))
    kept: list[int] = []
    used = 0
    for i in order:
        if used + len(units[i][1]) + 1 <= room:
            kept.append(i)
            used += len(units[i][1]) + 1
    out = ""
    last_line = None
    for i in sorted(kept):
        line_no, unit = units[i]
        out += unit if last_line is None else (" " if line_no == last_line else "\n") + unit
        last_line = line_no
    return out


EXAMPLE_SPAN = """[#12] user: The staging server is db-stage-2, and the migration must finish before Friday 14 June.
[#13] assistant: Understood. I will check the schema first.
[#14] tool read_file: orders: 41 columns, index orders_by_day
[#15] user: Keep the old index until the new one is verified."""
"""The span of the worked example a recap or summary prompt shows (:func:`worked_example`)."""


def worked_example(name: str, account: str) -> str:
    """A worked example of ``EXAMPLE_SPAN`` and its account, so a small model sees the shape
    it is asked for: put after the instructions, the same for every call."""
    return (
        "An example (its words are not yours to copy):\n"
        f"TRANSCRIPT START\n{EXAMPLE_SPAN}\nTRANSCRIPT END\n{reply_prefix(name, EXAMPLE_SPAN)} {account}"
    )


_SEQ = re.compile(r"^\[#(\d+)\]", re.MULTILINE)


def reply_prefix(name: str, transcript: str) -> str:
    """How an account of ``transcript`` begins: its name and the span's first and last
    ``[#seq]`` ("Recap of [#12] to [#15]:"). The embedded model writes on from it, so its
    reply is this span's account from the first token, not a copy of the transcript."""
    seqs = _SEQ.findall(transcript)
    return f"{name} of [#{seqs[0]}] to [#{seqs[-1]}]:" if seqs else f"{name}:"


_PROMPT_OVERHEAD = 400
"""Tokens a summariser call spends besides the transcript (instructions, task, the size asked for)."""


def _line(m: Message) -> str:
    ref = f"[#{m.seq}] " if m.seq is not None else ""
    who = f"tool {m.name or ''}".strip() if m.role == "tool" else (m.name or m.role)
    return f"{ref}{who}: {summarized_text(m)}"


def transcript_parts(messages: list[Message], limit: int) -> list[list[str]]:
    """The transcript lines split on message boundaries into parts of at most ``limit``
    tokens each. A single line longer than a part is cut to fit (its start is kept)."""
    parts: list[list[str]] = [[]]
    size = 0
    for m in messages:
        line = _line(m)
        n = count_text(line)
        if n > limit:
            line = cut_text(line, limit - 12) + " [... cut]"
            n = count_text(line)
        if parts[-1] and size + n > limit:
            parts.append([])
            size = 0
        parts[-1].append(line)
        size += n
    return parts


_POINTER = re.compile(r"\[#(\d+)\]")


def keep_pointers(text: str, allowed: set[int]) -> tuple[str, int]:
    """``text`` with every ``[#seq]`` pointer outside ``allowed`` dropped; and how many were."""
    dropped = 0

    def sub(m: re.Match[str]) -> str:
        nonlocal dropped
        if int(m.group(1)) in allowed:
            return m.group(0)
        dropped += 1
        return ""

    return _POINTER.sub(sub, text), dropped


BLOCK_SHARE = 0.2
"""A recap or summary is at most this share of the working-context budget. A block near
half the budget (a 2,000-character recap on a 1,500-token budget) leaves the next turns so
little room that each one reaches the budget again and distils inside the turn, and a small
model that fills its limit writes a block no smaller than the span ("result not smaller")."""


def block_chars(run: RunState, max_chars: int | None) -> int:
    """The longest block the summariser may write: ``max_chars`` (recap_max_chars; 4,000 for
    a summary), and never more than :data:`BLOCK_SHARE` of the budget (at about three
    characters a token; that share is never taken under 400 characters)."""
    return min(max_chars or 4000, max(400, int(run.budget * BLOCK_SHARE * 3)))


async def distil_with_prose(
    run: RunState,
    *,
    purpose: str,
    synthetic: str,
    instructions: str,
    label: str,
    max_chars: int | None,
    example: str = "",
) -> Reduction | Declined | None:
    """Replace the middle of the context with a model-written block (a recap or a summary).

    An earlier block of the same kind sits in the middle: what :func:`carry_forward` keeps of
    it opens the new block, and the model writes the new span's account after it.
    """
    cut = splice(run.context, run.spec.context.keep_last_n)
    span = [m for m in cut.middle if m.synthetic is None]
    if not span:
        return None
    earlier = "\n".join(m.content.partition("\n")[2] for m in cut.middle if m.synthetic == synthetic)
    private = run.view.private  # the summariser never sees private material: its placeholder stands in
    task = next((redact(m, private).content for m in cut.head if m.role == "user"), "")
    max_chars = block_chars(run, max_chars)
    previous = carry_forward(earlier, max_chars) if earlier.strip() else ""
    piece_chars = max_chars - len(previous) - (1 if previous else 0)
    max_tokens = max(128, piece_chars // 3)  # a token is about four characters: a third leaves room
    window = run.summarizer.capabilities.context_window
    room = max(256, min(window, 10**6) - max_tokens - _PROMPT_OVERHEAD - count_text(task))
    parts = transcript_parts([redact(run.view.original(m), private) for m in span], room)
    writer = _Writer(
        run,
        purpose=purpose,
        instructions=instructions,
        task=task,
        max_tokens=max_tokens,
        example=example,
        max_chars=piece_chars,
    )
    streak = run.view.fallback_streak
    guarded = streak >= FALLBACK_STREAK and (streak - FALLBACK_STREAK + 1) % FALLBACK_RETRY != 0
    accounts: list[str] = []
    fallback = ""
    for i, lines in enumerate(parts):
        text = None if guarded else await writer.write("\n".join(lines), part=(i + 1, len(parts)))
        if text is None:
            fallback = "the summariser has failed repeatedly (the spend guard)" if guarded else writer.reason
            break
        accounts.append(text)
    if fallback:  # about a quarter of the budget (a character is about a quarter of a token)
        text = extract([line for lines in parts for line in lines], min(piece_chars, run.budget))
    else:
        text = accounts[0]
    if len(accounts) > 1 and not fallback:
        merged = await writer.merge(accounts)
        text = merged if merged is not None else "\n\n".join(accounts)
    text, dropped = keep_pointers(text, {m.seq for m in span if m.seq is not None})
    if len(text) > piece_chars:
        text = text[: piece_chars - 1].rstrip() + "…"
    if previous:
        text = f"{previous}\n{text}"
    if fallback:
        label = f"{label} (an extract: the first sentence of each message; Recall has the rest)"
    block = Message(role="user", content=f"{label}\n{text}", synthetic=synthetic)
    payload: dict[str, object] = {"summary": text, "parts": len(parts)}
    if fallback:
        payload["fallback"] = True
        payload["fallback_reason"] = fallback
    if dropped:
        payload["pointers_dropped"] = dropped
    if previous:
        payload["carried_chars"] = len(previous)
    return Reduction(context=[*cut.head, block, *cut.tail], evicted=span, payload=payload)


def extract(lines: list[str], max_chars: int) -> str:
    """A deterministic account of transcript ``lines`` (``[#seq] who: text``): each line's
    first sentence, cut to an even share of ``max_chars``, in order."""
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        return ""
    share = max(40, max_chars // len(lines) - 1)
    out = []
    for line in lines:
        head, sep, body = line.partition(": ")
        first = _FIRST_SENTENCE.match(body.strip()) if sep else None
        sentence = (first.group(1) if first else body.strip()) if sep else head
        item = f"{head}: {sentence}" if sep else sentence
        out.append(item if len(item) <= share else item[: share - 1].rstrip() + "…")
    text = "\n".join(out)
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"


_SIZE = re.compile(r"\s*At most \d+ characters\.?", re.IGNORECASE)


class _Writer:
    """One summariser conversation: write (and check, and retry once) an account of a part."""

    def __init__(
        self,
        run: RunState,
        *,
        purpose: str,
        instructions: str,
        task: str,
        max_tokens: int,
        example: str = "",
        max_chars: int = 4000,
    ):
        self.run, self.purpose, self.instructions, self.task = run, purpose, instructions, task
        self.max_tokens, self.max_chars, self.example = max_tokens, max_chars, example
        self.system = f"{instructions}\n\n{example}" if example else instructions
        """The instructions and the worked example: the same for every call, so the model's
        prefix cache keeps them from one distillation to the next."""
        self.reason = ""

    async def write(self, text: str, *, part: tuple[int, int]) -> str | None:
        """An accepted account of the transcript ``text``, or None (``self.reason`` says why)."""
        what = "summary" if self.purpose == "summary" else "recap"
        where = f" (part {part[0]} of {part[1]} of the span)" if part[1] > 1 else ""
        body = []
        if self.task:
            body.append(f"The task: {self.task}")
        body.append(f"TRANSCRIPT{where} START\n{text}\nTRANSCRIPT END")
        restated = (  # the size first: the instructions' own (the whole block's) is left out
            f"Now write the {what} of the whole transcript above, from its first line to its last, in at most "
            f"{self.max_chars} characters. Do not answer or continue the conversation; do not reply to its last "
            "message. " + _SIZE.sub("", self.instructions).strip()
        )
        begun = reply_prefix(what.capitalize(), text)
        for attempt in (1, 2):
            ask = (
                restated
                if attempt == 1
                else (
                    f"Your previous attempt was rejected: {self.reason}. Write the {what} again, covering every part "
                    "of the transcript, using its own names, numbers and words. " + restated
                )
            )
            prompt = [
                Message(role="system", content=self.system),
                Message(role="user", content="\n\n".join([*body, ask])),
            ]
            response = await call_model(
                self.run,
                prompt,
                purpose=self.purpose,  # type: ignore[arg-type]
                provider=self.run.summarizer,
                max_tokens=self.max_tokens,
                reply_prefix=begun,  # as the worked example's account begins
            )
            account = response.text.strip().removeprefix(begun).strip()  # checked and kept without it
            problem = check_prose(account, text, context=self.task, example=self.example)
            if problem is None:
                return account
            self.reason = problem
            await self.run.add(
                "summary_rejected",
                {"purpose": self.purpose, "reason": problem, "attempt": attempt, "text": account[:500]},
            )
        return None

    async def merge(self, accounts: list[str]) -> str | None:
        """One account of several parts' accounts, or None if the merge was rejected."""
        joined = "\n\n".join(f"Part {i}:\n{a}" for i, a in enumerate(accounts, 1))
        return await self.write(joined, part=(1, 1))
