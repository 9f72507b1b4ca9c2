"""The Recall tool: free text in, the original evicted messages verbatim out.

Each result says where it came from (``run`` or ``memory``), its score, its record seq(s)
and timestamp. The whole answer is capped at ``context.recall_max_tokens`` tokens, so a
recall can never blow the working context.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrt.tokens import count_text
from loomrt.tools import Tool

if TYPE_CHECKING:
    from loomrt.recall.run_recall import RunRecall

__all__ = [
    "RecallHit",
    "RECALL_PROMPT",
    "RECALL_DESCRIPTION",
    "make_recall_tool",
    "cap_results",
    "iso",
    "SOURCES",
    "OPERATOR",
]

SOURCES = ("all", "run", "family", "memory", "operator")
"""What Recall (and injection) may search: this run's evicted spans, a fork's shared history
up to the fork point, durable memory, only the durable memory an operator wrote by hand
(``operator``), or all."""
OPERATOR = "operator"
"""A memory hit's ``author`` when an operator wrote it (``loomrt memory add``); else ``run``."""

RECALL_PROMPT = (
    "Recall: summaries and recaps are maps to the details, not the details. Before you answer with an "
    "exact value from earlier in this run (a command, path, timestamp, configuration value or number), "
    "call Recall to get the original words; if Recall does not find it, say that you are not sure."
)
"""The one line recall adds to the system prompt."""

RECALL_DESCRIPTION = (
    "Search everything evicted from your working context in this run (and your durable memory) and get "
    "the original messages back verbatim, best first, each with its source, score, record seq and time. "
    "Query with the words you expect in the original: names, values, paths, error codes."
)

_RESULT_OVERHEAD = 40
"""Tokens one result's fields (source, score, seq, ts, ...) take besides its text."""


def iso(ts: float | None) -> str | None:
    """A Unix time as ISO 8601 UTC (seconds), or None."""
    if ts is None:
        return None
    return _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class RecallHit:
    """One Recall result."""

    text: str
    """The original words, verbatim (a chunk of a long message is a verbatim slice)."""
    score: float
    """Relevance in (0, 1], best 1."""
    source: str
    """``run`` (this run's evicted spans), ``family`` (a fork's shared history, up to the
    fork point) or ``memory`` (durable memory)."""
    seq: int | None = None
    """The record seq of the message (run hits)."""
    seqs: tuple[int, ...] = ()
    """Every record seq the hit came from."""
    ts: float | None = None
    """Unix time the message (or fact) was recorded."""
    role: str | None = None
    speaker: str | None = None
    tools: tuple[str, ...] = ()
    distillation_seq: int | None = None
    """The distillation that evicted it (run hits)."""
    chunk: tuple[int, int] | None = None
    """(i, n): this is chunk i of n of a long message (1-based), else None."""
    extra: dict[str, Any] = field(default_factory=dict)
    cosine: float | None = None
    """The raw cosine of the query with the entry (None without dense search, or from a
    memory source that does not report it)."""
    bm25: float = 0.0
    """The raw BM25 score of the entry alone."""
    before: str = ""
    """The end of the message before this one (an answer often only reads with its question)."""
    run_id: str | None = None
    """The run whose record holds the message (run and family hits)."""

    def to_dict(self) -> dict[str, Any]:
        """The hit as the tool returns it (ts as ISO 8601)."""
        out: dict[str, Any] = {"source": self.source, "score": round(self.score, 4)}
        if self.seq is not None:
            out["seq"] = self.seq
        if len(self.seqs) > 1:
            out["seqs"] = list(self.seqs)
        out["ts"] = iso(self.ts)
        for key in ("role", "speaker", "distillation_seq"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.tools:
            out["tools"] = list(self.tools)
        if self.chunk:
            out["chunk"] = f"{self.chunk[0]}/{self.chunk[1]}"
        out.update(self.extra)
        out["text"] = self.text
        return out


def _truncate(text: str, tokens: int) -> str:
    """The longest prefix of ``text`` within ``tokens`` tokens (binary search on characters)."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_text(text[:mid]) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def cap_results(hits: list[RecallHit], max_tokens: int) -> tuple[list[dict[str, Any]], int]:
    """The hits as dicts within ``max_tokens`` tokens, and how many were left out.

    Hits are kept best first while they fit. The first hit is always returned; if it alone
    is too long, its text is cut and marked, with the seq where the whole message is.
    """
    out: list[dict[str, Any]] = []
    used = 0
    for i, hit in enumerate(hits):
        d = hit.to_dict()
        cost = count_text(hit.text) + _RESULT_OVERHEAD
        if used + cost <= max_tokens:
            out.append(d)
            used += cost
            continue
        if i == 0:
            room = max(16, max_tokens - _RESULT_OVERHEAD - 24)
            where = f"record seq {hit.seq}" if hit.seq is not None else "the source"
            d["text"] = (
                _truncate(hit.text, room) + f" … [truncated to fit the recall budget; the whole text is at {where}]"
            )
            d["truncated"] = True
            out.append(d)
            used = max_tokens
            continue
        break
    return out, len(hits) - len(out)


def make_recall_tool(recall: RunRecall) -> Tool:
    """The ``Recall(query, top_k=5)`` (or ``Recall(seq=N)``) tool over one run's :class:`RunRecall`."""

    def run_recall(
        query: str | None = None, top_k: int = 5, seq: int | None = None, source: str = "all"
    ) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
        top_k = max(1, min(int(top_k), 20))
        if seq is not None:
            hits = recall.at_seq(int(seq))
            results, _ = cap_results(hits, recall.max_tokens)
            found: dict[str, Any] = {"seq": seq, "results": results}
            if not results:
                found["note"] = (
                    f"nothing evicted at #{seq}: the message is in your working context, or #{seq} "
                    "is not a message of this run"
                )
            return found
        if not query or not str(query).strip():
            raise ValueError("Recall needs a query (the words you expect in the original) or a seq ([#seq] pointer)")
        if recall.memory_waits():  # durable memory on a shared database: read off the event loop

            async def answered_later() -> dict[str, Any]:
                return answer(query, await recall.asearch(query, top_k=top_k, source=source))

            return answered_later()  # Tool.call awaits it
        return answer(query, recall.search(query, top_k=top_k, source=source))

    def answer(query: str, hits: list[RecallHit]) -> dict[str, Any]:
        results, left_out = cap_results(hits, recall.max_tokens)
        out: dict[str, Any] = {"query": query, "results": results}
        if left_out:
            out["note"] = (
                f"{left_out} more result(s) left out to stay within {recall.max_tokens} tokens; narrow the query"
            )
        elif not results:
            out["note"] = (
                "nothing matched"
                if recall.size()
                else "nothing has been evicted yet: everything is still in your context"
            )
        return out

    return Tool(
        name="Recall",
        description=RECALL_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for, in the words of the original."},
                "seq": {
                    "type": "integer",
                    "description": "Instead of a query: the record seq of one message "
                    "(a [#seq] pointer in a summary) to get back whole.",
                },
                "source": {
                    "type": "string",
                    "enum": list(SOURCES),
                    "default": "all",
                    "description": "Where to search: this run's evicted history, a fork's shared history "
                    "(up to the fork point), durable memory, only the memory an operator wrote by hand, or all. "
                    "A memory hit's author says which: operator or run.",
                },
                "top_k": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 20,
                    "default": 5,
                    "description": "How many results (best first).",
                },
            },
            "additionalProperties": False,
        },
        fn=run_recall,
    )
