"""The bank: an evicted-span callback that puts each span on the consolidator's queue.

It sits beside the recall index (:func:`loomrt.toolset.resolve_toolset` registers both).
It fires only for a distillation that was applied (the run calls callbacks for nothing
else), never while a run is resumed or its recall index rebuilt (those read the record,
they do not evict), and it never calls a model. A row is keyed by (run id, distillation
seq, scope), so banking the same span twice writes one row.

What is banked is the conversation: user inputs and assistant replies verbatim, tool
results as short labelled excerpts, secrets redacted, private material left out. A span
with nothing conversational in it (only tool traffic) is counted and not banked; a span
over ``context.harvest_max_tokens`` is refused with an event, never truncated. Every
outcome is a ``harvest_banked`` event on the run; a failure is a ``callback_error`` and
the run goes on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from loomrt.crashpoints import reached
from loomrt.driving import inline_wanted
from loomrt.harvest.db import Tables
from loomrt.harvest.redact import redact_secrets
from loomrt.messages import EvictedSpan, Message
from loomrt.tokens import count_text

__all__ = ["Bank", "conversation_turns", "TOOL_EXCERPT_CHARS", "COPY_TOOLS"]

TOOL_EXCERPT_CHARS = 200
"""A tool result is banked as a labelled excerpt of at most this many characters."""

COPY_TOOLS = frozenset({"Recall", "Describe", "Expand", "Grep"})
"""Tools whose results are copies of what is banked or remembered already: never banked again."""


def conversation_turns(messages: Sequence[Message], private: set[int]) -> tuple[list[dict[str, Any]], int]:
    """The conversational turns of ``messages`` (dicts of seq, role, speaker, ts, text) and
    how many secrets were redacted. Private messages, synthetic blocks, the system prompt,
    tool-call arguments and copies (Recall, fold's tools) are left out."""
    turns: list[dict[str, Any]] = []
    redacted = 0
    for m in messages:
        if m.synthetic is not None or m.role == "system" or (m.seq is not None and m.seq in private):
            continue
        if m.role == "tool":
            if m.name in COPY_TOOLS or not m.content.strip():
                continue
            excerpt = " ".join(m.content.split())
            text = excerpt[:TOOL_EXCERPT_CHARS] + (" …" if len(excerpt) > TOOL_EXCERPT_CHARS else "")
        else:
            text = m.content.strip()  # an assistant's tool calls (their JSON) are not conversation
        if not text:
            continue
        text, n = redact_secrets(text)
        redacted += n
        turns.append(
            {
                "seq": m.seq,
                "role": m.role,
                "speaker": m.name if m.role != "tool" else None,
                "tool": m.name if m.role == "tool" else None,
                "ts": m.ts,
                "text": text,
            }
        )
    return turns, redacted


class Bank:
    """Banks run ``run_id``'s evicted spans into ``db`` for scope ``scope``.

    ``private()`` gives the run's private seqs at the moment of eviction;
    ``record(kind, data)`` writes an event on the run.
    """

    def __init__(
        self,
        db: Tables,
        *,
        run_id: str,
        agent: str,
        def_hash: str,
        scope: str,
        max_tokens: int,
        private: Callable[[], set[int]],
        record: Callable[[str, dict[str, Any]], Any],
    ):
        self.db = db
        self.run_id, self.agent, self.def_hash, self.scope = run_id, agent, def_hash, scope
        self.max_tokens = max_tokens
        self._private = private
        self._record = record
        self.counts = {"banked": 0, "empty": 0, "refused": 0}

    def on_evicted(self, span: EvictedSpan) -> Awaitable[None] | None:
        """The callback: bank ``span``. Never raises (a failure is a ``callback_error`` event).
        On PostgreSQL (a network database, whose write may wait on a lock or the pool) it
        returns a coroutine that writes on a worker thread, so the event loop other runs play
        on is never blocked; on SQLite it banks inline (a local file)."""
        if span.run_id != self.run_id:
            return None
        if self.db.dialect == "postgres" and not inline_wanted():
            return self._bank_off_loop(span)
        try:
            self._record("harvest_banked", self.bank(span))
        except Exception as exc:  # noqa: BLE001 - banking never fails a run
            self._failed(span, exc)
        return None

    async def _bank_off_loop(self, span: EvictedSpan) -> None:
        private = self._private()  # the run's view is read here, on its own loop
        try:
            self._record("harvest_banked", await asyncio.to_thread(self.bank, span, private))
        except Exception as exc:  # noqa: BLE001 - banking never fails a run
            self._failed(span, exc)

    def _failed(self, span: EvictedSpan, exc: Exception) -> None:
        self._record(
            "callback_error",
            {
                "callback": "harvest.bank",
                "error": f"{type(exc).__name__}: {exc}",
                "distillation_seq": span.distillation_seq,
            },
        )

    def tail_seq(self) -> int:
        """The last seq of this run's tail banked already (0: none): a settled run's tail is
        banked before it is evicted (:func:`loomrt.harvest.sweep.tail_spans`), and what it
        held is not banked again when a later distillation evicts it."""
        rows = self.db.rows(
            "SELECT max(seq_hi) FROM harvest_spans WHERE run_id = ? AND scope = ? AND distillation_seq = seq_hi",
            (self.run_id, self.scope),
        )
        return int(rows[0][0] or 0) if rows else 0

    def bank(self, span: EvictedSpan, private: set[int] | None = None) -> dict[str, Any]:
        """Put ``span`` on the queue; what happened, as the ``harvest_banked`` payload. The
        messages a banked tail held already are left out. ``private``: the run's private seqs
        (read now when not given)."""
        tail = self.tail_seq()
        if tail:
            span = replace(span, messages=tuple(m for m in span.messages if m.seq is None or m.seq > tail))
        turns, redacted = conversation_turns(span.messages, self._private() if private is None else private)
        seqs = [m.seq for m in span.messages if m.seq is not None]
        out: dict[str, Any] = {
            "distillation_seq": span.distillation_seq,
            "scope": self.scope,
            "turns": len(turns),
            "redacted": redacted,
        }
        if not any(t["role"] in ("user", "assistant") for t in turns):
            self.counts["empty"] += 1
            return {**out, "outcome": "empty", "reason": "no conversational content (only tool traffic)"}
        tokens = count_text("\n".join(t["text"] for t in turns))
        out["tokens"] = tokens
        if tokens > self.max_tokens:
            self.counts["refused"] += 1
            return {
                **out,
                "outcome": "refused",
                "reason": f"{tokens} tokens, over context.harvest_max_tokens ({self.max_tokens}): not banked",
            }
        stamps = [t["ts"] for t in turns if t["ts"] is not None]
        reached("in_harvest_bank")
        with self.db.write() as conn:
            cur = conn.execute(
                "INSERT INTO harvest_spans (run_id, distillation_seq, scope, agent, def_hash, seq_lo, seq_hi, "
                "ts_lo, ts_hi, banked_at, tokens, turns, redacted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (
                    self.run_id,
                    span.distillation_seq,
                    self.scope,
                    self.agent,
                    self.def_hash,
                    min(seqs),
                    max(seqs),
                    min(stamps) if stamps else None,
                    max(stamps) if stamps else None,
                    time.time(),
                    tokens,
                    json.dumps(turns, ensure_ascii=False),
                    redacted,
                ),
            )
        self.counts["banked"] += 1
        return {**out, "outcome": "banked" if cur.rowcount else "already_banked"}
