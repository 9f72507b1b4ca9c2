"""Recall injection: the runtime recalls for the model before each call.

A small model does not ask for what it forgot (DESIGN, principle 9). Between the boundary
check and the model call, :func:`inject_recall` searches the run's evicted history (a fork's
shared history, durable memory) with the turn's input and records the best passages as a
``recall_injected`` event. The call sends them with the working context (right before the
user's input, or after the newest tool result: :meth:`~loomrt.run.projection.RunView.injected_at`), in that prompt
only (:func:`loomrt.injection.block_message` renders the block from the event); they never
enter the working context, so they are never summarised, banked or evicted again.

What is injected:

- the query is what the turn's user input asks (its questions, when it has any; else the
  whole input); on a later call of the turn, it adds the rarest words of the newest tool
  result (:data:`QUERY_RARE_TOKENS`); a query of fewer than two tokens injects nothing;
- a hit is kept when the run may see it (:func:`loomrt.visibility.visible_to`), it is not
  in the working context already (by seq, or its words contained there), and it was not
  injected this turn or the previous one;
- a passage is injected only if it is relevant on its own raw scores (:func:`relevant`:
  fused scores are scaled per query, so the best is always near 1 and says nothing);
- passages go best first, while the block fits ``context.recall_inject_tokens``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from loomrt.activity import Activity
from loomrt.crashpoints import reached
from loomrt.injection import BLOCK_FOOTER, BLOCK_HEADER, block_message, passage_line, said_on
from loomrt.messages import Message
from loomrt.recall.index import tokenize
from loomrt.recall.tool import RecallHit
from loomrt.run.state import RunState
from loomrt.tokens import count_messages, count_text
from loomrt.visibility import visible_to

__all__ = [
    "Injected",
    "inject_recall",
    "injection_query",
    "COSINE_FLOOR",
    "COSINE_MARGIN",
    "BM25_FLOOR",
    "MEMORY_FLOOR",
    "relevant",
    "TOP_K",
    "QUERY_RARE_TOKENS",
    "asked",
    "SHORT_WORDS",
    "BEFORE_WORDS",
]

TOP_K = 10
"""The most passages one block holds."""
COSINE_FLOOR = 0.35
"""The raw cosine (all-MiniLM-L6-v2) a passage must reach to be injected."""
COSINE_MARGIN = 0.15
"""How far below the best candidate's cosine a passage may be and still be injected: a weak
passage stays out beside a strong one (near misses that ride along mislead a small model:
docs/recall.md), and goes in when nothing scores higher (a question asked in other words
often finds its evidence at 0.35 to 0.5)."""
BM25_FLOOR = 2.0
"""The raw BM25 score (of the entry alone; of a durable-memory passage's window, the line said
before it and its own, as memory matches passages) a passage may reach instead: a rare word shared."""
QUERY_RARE_TOKENS = 8
"""On a later call of a turn, how many of the newest tool result's rarest tokens join the query."""
SHORT_WORDS = 12
"""A passage shorter than this many words carries the end of the message before it."""
BEFORE_WORDS = 30


@dataclass(frozen=True)
class Injected:
    """A recorded block: the ``recall_injected`` event's seq, its message and estimated tokens."""

    seq: int
    message: Message
    tokens: int


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


_SENTENCE = re.compile(r"[^.!?\n]*\?")


def asked(text: str) -> str:
    """What ``text`` asks: its questions (sentences ending in ``?``, each with the clause that
    leads into it, such as "Remind me:"), or the whole text when it asks none. A long input
    that asks one thing among paragraphs of context is searched for that thing."""
    questions = [q.strip() for q in _SENTENCE.findall(text) if len(q.split()) >= 2]
    return " ".join(questions) if questions else text


def injection_query(run: RunState) -> str | None:
    """What to search for before the next call: what the turn's user input asks (its
    questions, else all of it), and after a tool result that result's rarest words; None
    when there is no input to search with."""
    found = _query(run)
    return found[0] if found is not None else None


def _query(run: RunState) -> tuple[str, list[int]] | None:
    """The query and the record seqs its words came from (a reader redacts the query when
    one of them is private)."""
    view = run.view
    if view.input_seq is None or view.input_seq not in view.messages:
        return None
    query, seqs = asked(view.original(view.messages[view.input_seq]).content), [view.input_seq]
    last = view.context[-1] if view.context else None
    recall = run.toolset.recall
    if last is not None and last.role == "tool" and recall is not None and last.seq not in view.private:
        rare = recall.rarest(view.original(last).content, QUERY_RARE_TOKENS)
        if rare:
            query = f"{query} {' '.join(rare)}"
            seqs += [last.seq] if last.seq is not None else []
    return query, seqs


def _before(run: RunState, seq: int) -> tuple[int, str] | None:
    """The message before record message ``seq`` (seq and its last words), if near."""
    view = run.view
    for s in range(seq - 1, max(0, seq - 8), -1):
        m = view.messages.get(s)
        if m is not None and m.role != "system":
            words = view.original(m).content.split()
            return s, " ".join(words[-BEFORE_WORDS:])
    return None


def _passage(run: RunState, hit: RecallHit) -> dict[str, Any]:
    passage: dict[str, Any] = {
        "source": hit.source,
        "score": round(hit.score, 4),
        **({"seq": hit.seq} if hit.seq is not None else {"id": hit.extra.get("id")}),
        **({"cosine": round(hit.cosine, 4)} if hit.cosine is not None else {}),
        "bm25": round(hit.bm25, 3),
        "role": hit.role,
        "speaker": hit.speaker or (f"tool {hit.tools[0]} result" if hit.role == "tool" and hit.tools else hit.role),
        "date": said_on(hit.ts),
        "text": hit.text,
    }
    if hit.seq is not None and len(hit.text.split()) < SHORT_WORDS:
        before = _before(run, hit.seq)
        if before is not None and not (before[0] in run.view.private and hit.source == "family"):
            passage["before_seq"], passage["before"] = before
    passage["tokens"] = count_text(passage_line(passage))
    return passage


MEMORY_FLOOR = 0.5
"""The score a durable-memory hit needs to be injected when its source reports no raw score
(a source of the caller's own); loomrt's durable memory reports them, and its hits are judged
as the run's own are (:func:`relevant`)."""


def _raw_scored(hit: RecallHit) -> bool:
    """Whether a hit carries its raw scores (a fused score, scaled per query, says nothing)."""
    return hit.cosine is not None or hit.bm25 > 0


def _choose(run: RunState, hits: list[RecallHit], room: int) -> list[dict[str, Any]]:
    """The passages to inject, best first, within ``room`` tokens: the hits the run may see,
    not in its working context and not injected this turn or the previous one, each relevant
    on its own raw score (:func:`relevant`)."""
    view = run.view
    visible = visible_to(view)
    in_context = {m.seq for m in view.context if m.seq is not None}
    context_text = _normal("\n".join(m.content for m in view.context))
    fresh: list[RecallHit] = []
    seen: set[Any] = set()
    for hit in hits:
        key = hit.seq if hit.seq is not None else hit.extra.get("id")
        if key in seen or (hit.source, key) in view.injected or not visible(hit):
            continue
        if hit.source == "memory" and not _raw_scored(hit) and hit.score < MEMORY_FLOOR:
            continue
        if hit.seq is not None and hit.source == "run" and hit.seq in in_context:
            continue
        if _normal(hit.text) in context_text:
            continue
        seen.add(key)
        fresh.append(hit)
    used = count_text(BLOCK_HEADER) + count_text(BLOCK_FOOTER) + 8
    chosen: list[dict[str, Any]] = []
    best = max((h.cosine for h in fresh if h.cosine is not None), default=None)
    for hit in fresh:
        if (hit.source != "memory" or _raw_scored(hit)) and not relevant(hit, best):
            continue
        passage = _passage(run, hit)
        if used + passage["tokens"] > room:
            continue  # a shorter one further down may still fit
        chosen.append(passage)
        used += passage["tokens"]
    return chosen


def relevant(hit: RecallHit, best: float | None = None) -> bool:
    """Whether a passage of history is relevant enough to inject, on its raw scores (a fused
    score is scaled per query, so the best hit is always near 1 and says nothing): a rare
    word shared, or a cosine at least :data:`COSINE_FLOOR` and within :data:`COSINE_MARGIN`
    of the ``best`` candidate's."""
    if hit.bm25 >= BM25_FLOOR:
        return True
    if hit.cosine is None:
        return False
    return hit.cosine >= max(COSINE_FLOOR, (best if best is not None else 0.0) - COSINE_MARGIN)


def _room(run: RunState) -> int:
    """The tokens the block may take: the reserve, or what is left of budget_tokens when the
    context is over the budget less the reserve (a declined distillation), in the runtime's
    tokens (the provider's count is larger by the run's tokenizer scale)."""
    whole = run.budget + run.inject_reserve
    left = min(run.inject_reserve, whole - run.pressure())
    return int(left / run.tokenizer_scale())


async def inject_recall(run: RunState) -> Injected | None:
    """Record the passages to put into the next call's prompt, or None (injection off,
    nothing relevant, nothing new). A block recorded and not yet sent (a run resumed
    between the event and its call) is sent as it is: nothing is searched again."""
    recall = run.toolset.recall
    if recall is None or run.inject_reserve <= 0:
        return None
    if run.view.injection is not None:
        seq, block, _ = run.view.injection
        return Injected(seq, block, count_messages([block]))
    found = _query(run)
    if found is None or len(tokenize(found[0])) < 2:
        return None
    query, query_seqs = found
    room = _room(run)
    if room < 64:
        return None
    run.show(Activity(run.run_id, "recalling"))
    try:  # optional, as recall is: a search that fails sends the call without a block
        await recall.caught_up()
        hits = await recall.asearch(query, top_k=TOP_K, catch_up=False)
        passages = _choose(run, hits, room)
    except Exception as exc:  # noqa: BLE001 - recall never fails a run
        await run.add("callback_error", {"callback": "recall.inject", "error": f"{type(exc).__name__}: {exc}"})
        return None
    if not passages:
        return None
    sources = sorted(
        {"run", *(["family"] if run.view.family is not None else []), *(["memory"] if recall.memory else [])}
    )
    data = {"query": query, "query_seqs": query_seqs, "passages": passages, "sources": sources}
    block = block_message(data)
    tokens = count_messages([block])
    event = await run.add("recall_injected", {**data, "tokens": tokens})
    reached("after_recall_injected")
    return Injected(event.seq, block, tokens)
