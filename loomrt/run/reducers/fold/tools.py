"""The tools every fold run gets: Describe, Expand and Grep over its cards and its record.

They read the run's view (its cards, and every record message by seq, whole), so they
answer from the exact words however deep the history is folded. A private message (see
:mod:`loomrt.visibility`) is shown and searched as its placeholder: a card, a page or a
grep hit never carries it back.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from loomrt.events import Event, message_of
from loomrt.messages import Message
from loomrt.run.cards import Card, render
from loomrt.tokens import count_text, cut_text
from loomrt.visibility import redact

if TYPE_CHECKING:
    from loomrt.run.state import RunState
    from loomrt.tools import Tool

__all__ = ["fold_tools", "PAGE_TOKENS", "GREP_LIMIT", "GREP_MAX", "GREP_TOKENS"]

PAGE_TOKENS = 4000
"""The most tokens one Expand call returns (less where ``context.message_max_tokens`` is
lower, so a page is never externalised itself); longer material comes in pages."""
GREP_LIMIT, GREP_MAX = 50, 200
GREP_TOKENS = 1500
"""The most tokens of hits one Grep call returns; the rest are counted, not shown."""


def _when(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds") if ts else None


def _seq_of(ref: object) -> int | None:
    text = str(ref).strip().lstrip("#")
    return int(text) if text.isdigit() else None


class _Reader:
    """What the tools read: the run's cards and its record messages, whole; in a fork, the
    shared history up to the fork point too (its private messages as placeholders), and the
    cards of its catalog lineage (:meth:`~loomrt.run.family.Family.lineage`), no others."""

    def __init__(self, run: RunState):
        self.run = run
        self._lineage: dict[str, Card] | None = None

    @property
    def cards(self) -> dict[str, Card]:
        return self.run.view.cards

    def card(self, card_id: str) -> Card | None:
        view = self.run.view
        card = view.cards.get(card_id)
        if card is None and view.family is not None:
            if self._lineage is None:  # the shared history is immutable; the fork's own cards are view.cards
                self._lineage = view.family.lineage(view.cards)
            card = self._lineage.get(card_id)
        return card

    def message(self, seq: int) -> Message | None:
        view = self.run.view
        m = view.messages.get(seq)
        if m is not None:
            return redact(view.originals.get(seq, m), view.private)
        if view.family is not None and seq <= view.fork_seq:
            shared = view.family.events_at([seq]).get(seq)
            return self._shared(shared) if shared is not None else None
        return None

    def _shared(self, e: Event) -> Message | None:
        m = message_of(e)
        private = e.seq in self.run.view.private or (e.kind == "tool_result" and e.data.get("private"))
        return None if m is None or m.role == "system" else redact(m, {e.seq} if private else set())

    def messages(self) -> Iterator[Message]:
        """Every message of the history this run sees, oldest first, less the model's own
        searches and their results (searching its searches is noise)."""
        view = self.run.view
        if view.family is not None:
            for e in view.family.events(kinds=["user_input", "assistant_message", "tool_result"]):
                m = self._shared(e)
                if m is not None and not _own(m):
                    yield m
        for seq in sorted(view.messages):
            if seq > view.fork_seq and (m := self.message(seq)) is not None and m.role != "system" and not _own(m):
                yield m

    def line(self, m: Message) -> str:
        who = f"tool {m.name}" if m.role == "tool" and m.name else m.role
        return f"[#{m.seq}] {who} ({_when(m.ts)}): {m.text_for_search()}"

    def parents(self, card_id: str) -> list[str]:
        return [c.id for c in self.cards.values() if card_id in c.children]

    def covering(self, seq: int) -> list[str]:
        """The cards that cover record message ``seq``, deepest last."""
        return [c.id for c in sorted(self.cards.values(), key=lambda c: c.depth) if seq in c.seqs]


def _own(m: Message) -> bool:
    """A search of the history (:data:`~loomrt.messages.SEARCH_TOOLS`: Recall's or these tools'),
    with nothing else said, or its result."""
    return not m.searched_text().strip()


def _number(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _pages(lines: list[str], limit: int) -> list[str]:
    """``lines`` in pages of at most ``limit`` tokens (a longer line spans pages)."""
    pages: list[list[str]] = []
    page: list[str] = []
    size = 0
    for line in lines:
        while count_text(line) > limit:
            head = cut_text(line, limit - 8) or line[:limit]
            if page:
                pages.append(page)
                page, size = [], 0
            pages.append([head])
            line = line[len(head) :]
        n = count_text(line)
        if page and size + n > limit:
            pages.append(page)
            page, size = [], 0
        page.append(line)
        size += n
    if page:
        pages.append(page)
    return ["\n".join(p) for p in pages] or [""]


def fold_tools(run: RunState) -> list[Tool]:
    """Describe, Expand and Grep for ``run``."""
    from loomrt.tools import Tool

    reader = _Reader(run)
    room = max(200, run.view.max_message_tokens - 100) if run.view.max_message_tokens else PAGE_TOKENS
    page_tokens, grep_tokens = min(PAGE_TOKENS, room), min(GREP_TOKENS, room)

    def describe(id: str) -> dict[str, Any] | str:
        card = reader.card(str(id).strip())
        if card is not None:
            return {
                "id": card.id,
                "depth": card.depth,
                "kind": card.kind,
                "model": card.model,
                "fallback": card.fallback,
                "from": _when(card.ts_lo),
                "to": _when(card.ts_hi),
                "seqs": f"#{card.seq_lo}–#{card.seq_hi}",
                "messages": len(card.seqs),
                "children": list(card.children),
                "parents": reader.parents(card.id),
                "tokens": card.tokens,
                "descendants": card.descendants,
                "text": card.text,
                "left_out": card.hint,
            }
        seq = _seq_of(id)
        m = reader.message(seq) if seq is not None else None
        if m is None:
            return (
                f"Error: no card or record message {id!r} in this run (card ids look like c1a2b3c4d5e; seqs like #12)."
            )
        return {
            "seq": m.seq,
            "role": m.role,
            "name": m.name,
            "time": _when(m.ts),
            "tokens": count_text(m.content),
            "in_cards": reader.covering(m.seq or 0),
        }

    def expand(id: str, page: int = 1) -> str:
        card = reader.card(str(id).strip())
        if card is not None and card.children:
            lines = [render(child) for c in card.children if (child := reader.card(c)) is not None]
            what = f"card {card.id}: its {len(card.children)} cards one level down"
        elif card is not None:
            lines = [reader.line(m) for s in card.seqs if (m := reader.message(s)) is not None]
            what = f"card {card.id}: its {len(card.seqs)} messages, verbatim"
        else:
            seq = _seq_of(id)
            m = reader.message(seq) if seq is not None else None
            if m is None:
                return f"Error: no card or record message {id!r} in this run (card ids look like c1a2b3c4d5e; seqs like #12)."
            lines, what = reader.line(m).splitlines(), f"message #{m.seq}, verbatim"
        pages = _pages(lines, page_tokens)
        page = _number(page, 0)
        if not 1 <= page <= len(pages):
            return f"Error: page {page} does not exist; {what} has {len(pages)} page(s)."
        more = f" Next: Expand({str(id)!r}, page={page + 1})." if page < len(pages) else ""
        return f"[{what} · page {page} of {len(pages)}.{more}]\n{pages[page - 1]}"

    def grep(
        pattern: str,
        mode: str = "regex",
        scope: str = "both",
        since: Any = None,
        before: Any = None,
        limit: int = GREP_LIMIT,
    ) -> dict[str, Any] | str:
        found = _grep(pattern, mode, scope, since, before, limit)
        if isinstance(found, str):
            return found
        shown: list[dict[str, Any]] = []
        size = 0
        for h in found:
            size += count_text(json.dumps(h, ensure_ascii=False))
            if shown and size > grep_tokens:
                break
            shown.append(h)
        out: dict[str, Any] = {"hits": shown}
        if len(shown) < len(found):
            out["not_shown"] = len(found) - len(shown)
            out["note"] = "more hits than fit one reply: narrow the pattern, or page with since/before (a seq)"
        return out

    def _grep(
        pattern: str, mode: str, scope: str, since: object, before: object, limit: int
    ) -> list[dict[str, Any]] | str:
        if mode not in ("regex", "text") or scope not in ("messages", "cards", "both"):
            return "Error: mode is regex or text; scope is messages, cards or both."
        if not pattern or len(pattern) > 500:
            return "Error: give a pattern of 1 to 500 characters."
        try:
            rx = re.compile(pattern if mode == "regex" else re.escape(pattern), re.IGNORECASE)
        except re.error as exc:
            return f"Error: not a valid regular expression ({exc}); use mode='text' for a literal string."
        lo, hi = _bound(since), _bound(before)
        limit = max(1, min(_number(limit, GREP_LIMIT), GREP_MAX))
        hits: list[dict[str, Any]] = []

        def inside(seq: int | None, ts: float | None) -> bool:
            for bound, after in ((lo, True), (hi, False)):
                if bound is None:
                    continue
                value = seq if isinstance(bound, int) else ts
                if value is None or (value < bound if after else value >= bound):
                    return False
            return True

        def hit(text: str, **where: Any) -> None:
            m = rx.search(text)
            if m:
                a, b = max(0, m.start() - 80), min(len(text), m.end() + 80)
                hits.append(
                    {
                        **where,
                        "snippet": ("…" if a else "") + text[a:b].replace("\n", " ") + ("…" if b < len(text) else ""),
                    }
                )

        if scope in ("messages", "both"):
            for m in reader.messages():
                if inside(m.seq, m.ts):
                    hit(m.searched_text(), id=f"#{m.seq}", kind="message", seq=m.seq, time=_when(m.ts))
                if len(hits) >= limit:
                    return hits
        if scope in ("cards", "both"):
            for card in reader.cards.values():
                if inside(card.seq_hi, card.ts_hi):
                    hit(
                        f"{card.text}\n{card.hint}",
                        id=card.id,
                        kind=f"card depth {card.depth}",
                        seq=card.seq_lo,
                        time=_when(card.ts_lo),
                    )
                if len(hits) >= limit:
                    break
        return hits

    ident = {"type": "string", "description": "A card id (c…) or a record seq (#12)."}
    bound = {"type": ["integer", "string"]}
    return [
        Tool(
            "Describe",
            "A card's text, depth, time range, covered seqs, parents and children.",
            {"type": "object", "properties": {"id": ident}, "required": ["id"]},
            describe,
        ),
        Tool(
            "Expand",
            f"A card one level down (its cards, or its messages verbatim), or one message whole; "
            f"{page_tokens} tokens a page.",
            {
                "type": "object",
                "properties": {"id": ident, "page": {"type": "integer", "minimum": 1}},
                "required": ["id"],
            },
            expand,
        ),
        Tool(
            "Grep",
            "Search the exact words of this run's history and cards. since/before: a seq or ISO time.",
            {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "mode": {"enum": ["regex", "text"]},
                    "scope": {"enum": ["messages", "cards", "both"]},
                    "since": bound,
                    "before": bound,
                    "limit": {"type": "integer", "maximum": GREP_MAX},
                },
                "required": ["pattern"],
            },
            grep,
        ),
    ]


def _bound(value: object) -> int | float | None:
    """A Grep bound: a seq (int or "#12") or an ISO date/time (as a Unix time)."""
    if value is None or value == "":
        return None
    seq = _seq_of(value)
    if seq is not None:
        return seq
    try:
        when = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()
