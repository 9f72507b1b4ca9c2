"""Writing one card: a depth-aware prompt, the checks a card must pass, and the fallback.

A card is accepted only if it is shorter than its source and at most 3× its target, and
(a leaf) states no value its source does not hold verbatim (:mod:`.verify`). A rejected
card is asked for again with a stricter prompt and half the target; a second rejection
gives a deterministic truncation of the source, marked as a fallback, so folding always
makes progress and every level is strictly smaller than the one below. A provider error
is not a reason to truncate: the writer gives up on this fold (:class:`FoldSkipped`) and
the run tries again later. So does a spent call budget on a soft fold; on a hard fold it
writes the fallback instead (``fold.max_calls_per_10min``).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from loomrt.messages import Message, summarized_text
from loomrt.run._model_calls import call_model
from loomrt.run.cards import EXPAND_LINE, Card, card_id, card_message
from loomrt.run.reducers.fold.verify import invented
from loomrt.run.reducers.summarize import keep_pointers
from loomrt.tokens import count_messages, count_text, cut_text
from loomrt.visibility import redact

if TYPE_CHECKING:
    from loomrt.run.state import RunState

__all__ = ["CardWriter", "FoldSkipped", "INSTRUCTIONS", "source_lines", "WRAPPER_TOKENS"]

WRAPPER_TOKENS = 90
"""What a card costs in the working context besides its text: the tagged wrapper, its
Expand line (at most six names) and the message's own overhead (50 to 85 tokens)."""

INSTRUCTIONS = {
    0: (
        "You fold a stretch of an agent's conversation into a card: a short summary the agent reads instead "
        "of the messages. Keep names, numbers, dates, file paths, identifiers and stated preferences exactly as "
        "written, each with its [#seq] pointer. State no value the transcript does not hold word for word."
    ),
    1: (
        "You roll up summary cards into one card a level higher. Keep what changed, what was decided, and what "
        "was superseded (say by what), with the [#seq] pointers of the cards. Drop detail the cards below keep."
    ),
    2: (
        "You roll up high-level summary cards into one. Keep only the decisions still in effect and their "
        "rationale, with [#seq] pointers; drop what was superseded or done with."
    ),
}

_STOP = set(
    "the a an and or of to in on for with is are was were be been it this that at by from as not "
    "we you i he she they them their our your my me us his her its but if then so do did does has have "
    "had can will would should could about into over under what which who when where how all any some "
    "no yes there here also just than very more most other such only".split()
)


class FoldSkipped(Exception):
    """This fold cannot be made now (a provider error, a timeout, the call budget): try later."""

    def __init__(self, reason: str, error: str = ""):
        super().__init__(reason)
        self.reason, self.error = reason, error


def source_lines(messages: list[Message], private: set[int]) -> str:
    """A leaf's source: one ``[#seq] who: text`` line per message, private ones as placeholders."""
    lines = []
    for m in messages:
        m = redact(m, private)
        who = f"tool {m.name or ''}".strip() if m.role == "tool" else m.role
        lines.append(f"[#{m.seq}] {who}: {summarized_text(m)}")
    return "\n".join(lines)


def _hint(text: str, source: str, default: str = "") -> tuple[str, str]:
    """Split a card's Expand line off its text; when the model wrote none: ``default`` (a
    rollup's: its children's), else the source's most frequent content words the card
    does not mention."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    hint = ""
    if len(lines) > 1 and lines[-1].strip().startswith(EXPAND_LINE):
        hint = " ".join(lines.pop().strip()[len(EXPAND_LINE) :].split()).rstrip(".")
    # a model that opens with the line (or repeats it) has its words kept, the label dropped
    text = "\n".join(
        line.strip()[len(EXPAND_LINE) :].strip() if line.strip().startswith(EXPAND_LINE) else line for line in lines
    ).strip()
    if hint:
        return text, hint
    if default:
        return text, ", ".join(default.split(", ")[:6])
    said = {w.lower() for w in re.findall(r"[A-Za-z][\w-]+", text)}
    words = Counter(w for w in re.findall(r"[A-Za-z][\w-]{3,}", source) if w.lower() not in _STOP | said)
    return text.strip(), ", ".join(w for w, _ in words.most_common(6))


@dataclass
class CardWriter:
    """Writes the cards of one fold for ``run``."""

    run: RunState
    hard: bool
    calls_left: int
    """Model calls the spend guard still allows."""
    figures: dict[str, int] = field(default_factory=lambda: {"values": 0, "invented": 0, "rejected": 0, "fallbacks": 0})

    async def leaf(self, messages: list[Message], shown: int, previous: Card | None) -> Card:
        """A leaf card for ``messages``, which take ``shown`` tokens in the working context."""
        source = source_lines(messages, self.run.view.private)
        spec = self.run.spec.context.fold
        target = spec.leaf_target_tokens or max(64, count_text(source) // 16)
        context = f"The card before this one (do not repeat it):\n{previous.text}\n\n" if previous else ""
        text, fallback = await self._write(
            0, source, target, context=context, room=shown - WRAPPER_TOKENS, allowed={m.seq for m in messages if m.seq}
        )
        return self._card(
            0,
            text,
            source,
            fallback,
            seqs=tuple(m.seq for m in messages if m.seq is not None),
            ts=[m.ts or 0.0 for m in messages],
            children=(),
        )

    async def rollup(self, cards: list[Card]) -> Card:
        depth = max(c.depth for c in cards) + 1
        source = "\n\n".join(c.text for c in cards)
        size = sum(c.tokens for c in cards)
        allowed = {s for c in cards for s in c.seqs}
        target = max(48, sum(count_text(c.text) for c in cards) // len(cards))  # about one child's size
        text, fallback = await self._write(
            depth, source, target, context="", room=size - WRAPPER_TOKENS, allowed=allowed
        )
        hints = ", ".join(dict.fromkeys(h.strip() for c in cards for h in c.hint.split(",") if h.strip()))
        return self._card(
            depth,
            text,
            source,
            fallback,
            hint=hints,
            seqs=tuple(s for c in cards for s in c.seqs),
            ts=[cards[0].ts_lo, cards[-1].ts_hi],
            children=tuple(c.id for c in cards),
            below=sum(c.descendants + 1 for c in cards),
        )

    def _card(
        self,
        depth: int,
        text: str,
        source: str,
        fallback: bool,
        *,
        seqs: tuple[int, ...],
        ts: list[float],
        children: tuple[str, ...],
        below: int = 0,
        hint: str = "",
    ) -> Card:
        body, hint = _hint(text, source, hint)
        run = self.run
        model = "fallback" if fallback else run.summarizer.model
        card = Card(
            id=card_id(body, depth, seqs, children),
            depth=depth,
            text=body,
            hint=hint,
            seqs=seqs,
            children=children,
            ts_lo=min(ts),
            ts_hi=max(ts),
            tokens=0,
            descendants=below or len(seqs),
            kind="fallback" if fallback else ("leaf" if depth == 0 else "rollup"),
            model=model,
            fallback=fallback,
            run_id=run.run_id,
        )
        tokens = count_messages([card_message(card)])
        return replace(card, tokens=tokens)

    async def _write(
        self, depth: int, source: str, target: int, *, context: str, room: int, allowed: set[int]
    ) -> tuple[str, bool]:
        """An accepted card text for ``source``, and whether it is the fallback. ``room``:
        the tokens the card's text must stay under to make the card smaller than what it
        replaces (the source's size in the context, less the card's wrapper)."""
        size = max(16, min(count_text(source), room))
        target = max(16, min(target, size // 2))
        reason = ""
        for attempt in (1, 2):
            if self.calls_left <= 0:
                if not self.hard:
                    raise FoldSkipped("call budget spent (fold.max_calls_per_10min)")
                break
            text = await self._ask(depth, source, target, context=context, reason=reason)
            text, _ = keep_pointers(text, allowed)
            problem = self._problem(depth, text, source, size, target)
            if problem is None:
                return text, False
            reason = problem
            self.figures["rejected"] += 1
            await self.run.add(
                "card_rejected",
                {"depth": depth, "reason": problem, "attempt": attempt, "text": text[:500], "target_tokens": target},
            )
            target = max(16, target // 2)
        self.figures["fallbacks"] += 1
        return cut_text(source, target), True

    def _problem(self, depth: int, text: str, source: str, size: int, target: int) -> str | None:
        n = count_text(text)
        if not text.strip():
            return "the card is empty"
        if n >= size:
            return f"not shorter than its source ({n} tokens, and the card must stay under {size})"
        if n > 3 * target:
            return f"over 3× its target ({n} tokens for a target of {target})"
        if depth == 0:
            checked, made_up = invented(text, source)
            self.figures["values"] += checked
            if made_up:
                self.figures["invented"] += len(made_up)
                shown = ", ".join(repr(v) for v in made_up[:5])
                return f"states values its source does not hold verbatim: {shown}"
        return None

    async def _ask(self, depth: int, source: str, target: int, *, context: str, reason: str) -> str:
        instructions = INSTRUCTIONS[min(depth, 2)]
        what = "TRANSCRIPT" if depth == 0 else "TRANSCRIPT (the cards to roll up)"
        ask = (
            f"Now write the card for everything between TRANSCRIPT START and TRANSCRIPT END: about {target} tokens "
            f"(At most {target * 4} characters). No preamble; do not answer or continue the conversation. "
            f"End with one line that starts '{EXPAND_LINE}' and names what you left out."
        )
        if reason:
            ask = (
                f"Your previous card was rejected: {reason}. Write it again, shorter, in the source's own words. " + ask
            )
        prompt = [
            Message(role="system", content=instructions),
            Message(role="user", content=f"{context}{what} START\n{source}\nTRANSCRIPT END\n\n{ask}"),
        ]
        self.calls_left -= 1
        timeout = self.run.spec.context.fold.call_timeout_s
        try:
            call = call_model(
                self.run, prompt, purpose="fold", provider=self.run.summarizer, max_tokens=target * 3 + 32
            )
            response = await (asyncio.wait_for(call, timeout) if timeout else call)
        except Exception as exc:  # noqa: BLE001 - any failure of the call: the fold waits, the turn goes on
            raise FoldSkipped("the summariser failed", f"{type(exc).__name__}: {exc}") from exc
        await self.run.flush()  # the call is on the record even if the card is never used
        return response.text.strip()
