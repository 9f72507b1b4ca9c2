"""The LoCoMo evidence benchmark: does Recall find the turns a question is about?

Each conversation of a LoCoMo-format file is replayed turn by turn through a real run:
a recall-enabled, interactive compaction run on a tiny budget, answered by a
:class:`~loomrt.testing.FunctionProvider`, so that nearly every turn is evicted and
reaches the index through the evicted-span callback, as in any run. Each turn is one
user input, ``[session date] Speaker: text`` (a shared photo adds its caption). Then
every question of categories 1-4 (5 is adversarial: no answer exists) is put to the
run's Recall tool, and a question counts as found at k when any of its evidence
``dia_id`` is among the top k results (``recall_at``), or all of them (``recall_all_at``);
and apart from evidence ids, whether the top k results' texts state the gold answer
(``states``: they hold at least :data:`~loomrt.bench.qa.grade.STATES_AT_LEAST` of its
content words; questions whose answer has none are left out of it).
A conversation is replayed as an observer (no replies) or as a chat (a short fixed
acknowledgement after each turn, which changes what sits beside each turn in the index).

The file is read from the path given; nothing of it is copied anywhere.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loomrt.bench.tally import Tally, rates, within
from loomrt.errors import SpecError
from loomrt.recall.embedders import EmbedderChoice

__all__ = [
    "Turn",
    "rates",
    "load_locomo",
    "turns_of",
    "render_turn",
    "said_at",
    "evidence_ids",
    "replay",
    "evaluate_locomo",
    "evaluate_locomo_async",
    "ANSWERABLE",
    "sample_id",
    "grep_ranked",
    "fused",
    "with_grep",
]

ANSWERABLE = (1, 2, 3, 4)
"""Question categories with an answer in the conversation (1 multi-hop, 2 temporal,
3 open-domain, 4 single-hop); 5 is adversarial."""

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}

Progress = Callable[[int, int, str], None]
"""``progress(done, total, what)``: units are replayed turns plus asked questions."""

_DIA = re.compile(r"D\d+:\d+")


@dataclass(frozen=True)
class Turn:
    """One turn of a LoCoMo conversation."""

    dia_id: str
    speaker: str
    text: str
    date: str
    session: int
    caption: str | None = None


def load_locomo(path: str | Path) -> list[dict[str, Any]]:
    """Read and check a LoCoMo-format file; :class:`SpecError` with the path when it is
    missing or not in the format."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"no LoCoMo file at {p}", where=str(p))
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"not valid JSON: {exc}", where=str(p)) from None
    if not isinstance(data, list) or not data:
        raise SpecError("a LoCoMo file is a non-empty JSON array of samples", where=str(p))
    for i, sample in enumerate(data):
        if (
            not isinstance(sample, dict)
            or not isinstance(sample.get("conversation"), dict)
            or not isinstance(sample.get("qa"), list)
        ):
            raise SpecError(f"sample {i} needs 'conversation' (an object) and 'qa' (a list)", where=str(p))
    return data


def sample_id(sample: dict[str, Any], i: int) -> str:
    return str(sample.get("sample_id") or f"sample-{i}")


def turns_of(sample: dict[str, Any]) -> list[Turn]:
    """The conversation's turns in order (sessions by number; dated sessions without
    turns are skipped)."""
    conv = sample["conversation"]
    numbers = sorted(int(m.group(1)) for k in conv if (m := re.fullmatch(r"session_(\d+)", k)))
    out: list[Turn] = []
    for n in numbers:
        date = str(conv.get(f"session_{n}_date_time") or "")
        for t in conv.get(f"session_{n}") or []:
            out.append(
                Turn(
                    dia_id=str(t.get("dia_id", "")),
                    speaker=str(t.get("speaker", "")),
                    text=str(t.get("text", "")),
                    date=date,
                    session=n,
                    caption=t.get("blip_caption"),
                )
            )
    return out


def said_at(turn: Turn) -> float | None:
    """When the turn was said, from its session's date (``1:56 pm on 8 May, 2023``, read as
    UTC), in epoch seconds; None for a date in another form."""
    try:
        when = _dt.datetime.strptime(turn.date.strip(), "%I:%M %p on %d %B, %Y")
    except ValueError:
        return None
    return when.replace(tzinfo=_dt.UTC).timestamp()


def render_turn(turn: Turn) -> str:
    """The user input a turn becomes: ``[date] Speaker: text [shares a photo: caption]``."""
    text = f"[{turn.date}] {turn.speaker}: {turn.text}" if turn.date else f"{turn.speaker}: {turn.text}"
    if turn.caption:
        text += f" [shares a photo: {turn.caption}]"
    return text


def evidence_ids(evidence: Any) -> set[str]:
    """Every ``D<session>:<turn>`` in a question's evidence, parsed leniently
    (``["D8:6; D9:17"]``, ``"D1:3"``, nested lists)."""
    if isinstance(evidence, str):
        return set(_DIA.findall(evidence))
    if isinstance(evidence, Iterable):
        out: set[str] = set()
        for item in evidence:
            out |= evidence_ids(item)
        return out
    return set()


ACKNOWLEDGEMENT = "I see, thanks for telling me."
"""The reply after each turn in a ``chat`` replay (an ``observer`` replay gives none)."""


async def replay(
    sample: dict[str, Any],
    *,
    embedder: EmbedderChoice = None,
    on_turn: Callable[[], None] | None = None,
    budget_tokens: int = 512,
    replies: bool = False,
    mode: str = "compaction",
) -> tuple[Any, Any, dict[int, str]]:
    """Replay one conversation through a recall-enabled run: as an observer (empty replies,
    which are not indexed), or with ``replies`` as a chat (:data:`ACKNOWLEDGEMENT` after each
    turn, indexed like any assistant message, so it sits between the turns).

    Returns ``(runtime, run, seq_to_dia)``: the run's record seq of each turn's user
    input, mapped to its ``dia_id``. ``mode`` is compaction, or fold (its tools' schemas
    take room: it plays on a budget of 2,048).
    """
    from loomrt.providers.base import ModelRequest, ModelResponse, Usage
    from loomrt.spec import AgentSpec
    from loomrt.testing import FunctionProvider, extractive_summary, scripted_runtime
    from loomrt.tokens import count_dicts, count_text

    turns = turns_of(sample)
    force = {"next": False}

    def reply(request: ModelRequest) -> ModelResponse:
        if request.purpose != "turn":
            text = extractive_summary(request, max_chars=300, words_per_line=6)  # knows no question
            return ModelResponse(text=text, usage=Usage(count_dicts(request.messages), count_text(text)))
        # The prompt tokens as reported; the last turn reports a full window, so the
        # closing input makes one more boundary and the last turns are evicted too.
        reported = budget_tokens if force["next"] else count_dicts(request.messages)
        return ModelResponse(text=ACKNOWLEDGEMENT if replies else "", usage=Usage(reported, 1))

    rt = scripted_runtime(FunctionProvider(reply, name="function/locomo-replay"), embedder=embedder)
    if mode == "fold":  # its tool schemas (Describe, Expand, Grep, Recall) alone take ~450 tokens
        budget_tokens = max(budget_tokens, 2048)
    spec = AgentSpec(
        model="function/locomo-replay",
        system_prompt="You are listening to a long conversation between two people.",
        max_iterations=2,
        context={
            "mode": mode,
            "budget_tokens": budget_tokens,
            "keep_last_n": 2,
            "keep_first": False,
            "recall": True,
            "recall_max_entries": max(4096, 2 * len(turns) + 16),
            "fold": {"keep_recent": 4, "leaf_min_messages": 4, "max_calls_per_10min": 10**6},
        },
    )
    run = rt.start(spec, interactive=True, name=sample_id(sample, 0))
    for i, turn in enumerate(turns):
        force["next"] = i == len(turns) - 1
        result = await rt.send(run, render_turn(turn), said_at=said_at(turn))
        if result.status == "failed":
            raise RuntimeError(f"the replay run failed at {turn.dia_id}: {result.error}")
        if on_turn:
            on_turn()
    force["next"] = False
    await rt.send(run, "[the conversation ends here]")
    inputs = [e.seq for e in rt.store.events(run.run_id, kinds=["user_input"])]
    return rt, run, {seq: t.dia_id for seq, t in zip(inputs, turns, strict=False)}


def grep_ranked(tool: Any, question: str) -> tuple[list[int], bool]:
    """The seqs a reader finds with Grep for ``question``, and whether they hold every word
    searched: a message holding all three of its longest words that are not stop words,
    else any of them; hits holding more of the words first (then oldest first). One or two
    Grep calls, as an agent would make them."""
    from loomrt.bench.reader import STOP_WORDS

    words = sorted(
        {w for w in re.findall(r"[A-Za-z0-9']{4,}", question) if w.lower() not in STOP_WORDS}, key=len, reverse=True
    )[:3]
    if not words:
        return [], False

    def grep(pattern: str) -> list[dict[str, Any]]:
        out = tool.fn(pattern=pattern, mode="regex", scope="messages", limit=200)
        return out.get("hits", []) if isinstance(out, dict) else []

    hits = grep("(?s)" + "".join(f"(?=.*{re.escape(w)})" for w in words))
    every = bool(hits)
    if not hits:
        hits = grep("|".join(map(re.escape, words)))
    said = [sum(w.lower() in str(h.get("snippet", "")).lower() for w in words) for h in hits]
    order = sorted(range(len(hits)), key=lambda i: (-said[i], hits[i]["seq"]))
    return [int(hits[i]["seq"]) for i in order], every


def with_grep(recalled: list[int], grepped: list[int], every_word: bool) -> list[int]:
    """What a reader holding both tools ranks: Recall's list fused with Grep's by reciprocal
    rank when Grep found messages holding every word it searched, else Recall's alone (a
    message holding any one of three words is weak evidence beside Recall's own ranking,
    which already weighs each word by how rare it is)."""
    return fused(recalled, grepped) if every_word else recalled


def fused(*ranked: list[int], k: int = 60) -> list[int]:
    """Reciprocal-rank fusion of ranked seq lists."""
    score: dict[int, float] = {}
    for seqs in ranked:
        for rank, seq in enumerate(seqs):
            score[seq] = score.get(seq, 0.0) + 1 / (k + rank + 1)
    return sorted(score, key=lambda s: -score[s])


BUDGET_DEPTH = 80
"""Hits searched for the accuracy-against-tokens curve: more than 2,000 tokens of turns."""


async def evaluate_locomo_async(
    path: str | Path,
    *,
    conversations: Sequence[str] | None = None,
    ks: Sequence[int] = (1, 3, 5, 10),
    embedder: EmbedderChoice = None,
    progress: Progress | None = None,
    replies: bool = False,
    mode: str = "compaction",
    budgets: Sequence[int] = (),
) -> dict[str, Any]:
    """:func:`evaluate_locomo` for code that is already async. With ``budgets`` (tokens of
    retrieved text), it also reports the raw turns' accuracy against tokens
    (``states_budgets``): whether the best-first hits that fit each budget state the answer."""
    from loomrt.bench.qa.grade import answer_words, gold_answer, states_answer  # qa imports this module

    started = time.perf_counter()
    samples = load_locomo(path)
    ids = [sample_id(s, i) for i, s in enumerate(samples)]
    if conversations:
        unknown = [c for c in conversations if c not in ids]
        if unknown:
            raise SpecError(
                f"no conversation {', '.join(unknown)} in the file; it has {', '.join(ids)}", where=str(path)
            )
        chosen = [(i, s) for i, s in zip(ids, samples, strict=True) if i in set(conversations)]
    else:
        chosen = list(zip(ids, samples, strict=True))
    ks = sorted({int(k) for k in ks})
    questions = {
        cid: [q for q in s["qa"] if q.get("category") in ANSWERABLE and evidence_ids(q.get("evidence"))]
        for cid, s in chosen
    }
    total = sum(len(turns_of(s)) + len(questions[cid]) for cid, s in chosen)
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, what)

    hits = {k: 0 for k in ks}
    hits_all = {k: 0 for k in ks}
    grep_hits = {k: 0 for k in ks}
    fused_hits = {k: 0 for k in ks}
    states_hits = {k: 0 for k in ks}
    n_states = 0
    curve = Tally(budgets)
    by_cat: dict[int, dict[str, Any]] = {}
    per_conv: dict[str, dict[str, Any]] = {}
    n = 0
    for cid, sample in chosen:
        _, run, seq_to_dia = await replay(
            sample, embedder=embedder, on_turn=functools.partial(tick, f"{cid}: replay"), replies=replies, mode=mode
        )
        tool = run.toolset.tools["Recall"]
        grep = run.toolset.tools.get("Grep")
        conv_hits = {k: 0 for k in ks}
        for q in questions[cid]:
            answer = tool.fn(query=str(q["question"]), top_k=max(ks))
            run_hits = [r for r in answer["results"] if r.get("source") == "run" and r.get("seq") is not None]
            recalled = [int(r["seq"]) for r in run_hits]
            found = [seq_to_dia.get(s) for s in recalled]
            cat = by_cat.setdefault(
                int(q["category"]),
                {"questions": 0, "hits": {k: 0 for k in ks}, "states": 0, "states_hits": {k: 0 for k in ks}},
            )
            if answer_words(gold_answer(q), int(q["category"])):
                n_states += 1
                cat["states"] += 1
                for k in ks:
                    said = " ".join(str(r.get("text", "")) for r in run_hits[:k])
                    stated = states_answer(said, gold_answer(q), int(q["category"]))
                    states_hits[k] += stated
                    cat["states_hits"][k] += stated
                if budgets:  # as much as each budget holds, best first, as memory's tiers are measured
                    deep = run.toolset.recall.search(str(q["question"]), top_k=BUDGET_DEPTH, source="run")
                    texts = [h.text for h in deep]  # (the tool returns at most 20, cut to its token cap)
                    truth = gold_answer(q)
                    curve.add(
                        int(q["category"]),
                        [states_answer(within(texts, b), truth, int(q["category"])) for b in budgets],
                    )
            gold = evidence_ids(q["evidence"])
            if grep is not None:
                grepped, every_word = grep_ranked(grep, str(q["question"]))
                both = with_grep(recalled, grepped, every_word)
                for k in ks:
                    grep_hits[k] += bool(gold & {seq_to_dia.get(s) for s in grepped[:k]})
                    fused_hits[k] += bool(gold & {seq_to_dia.get(s) for s in both[:k]})
            cat["questions"] += 1
            for k in ks:
                if gold & set(found[:k]):
                    hits[k] += 1
                    conv_hits[k] += 1
                    cat["hits"][k] += 1
                if gold <= set(found[:k]):
                    hits_all[k] += 1
            n += 1
            tick(f"{cid}: questions")
        per_conv[cid] = {
            "questions": len(questions[cid]),
            "turns": len(seq_to_dia),
            "entries": run.toolset.recall.size(),
            "distillations": run.distillations,
            "recall_at": rates(conv_hits, len(questions[cid])),
        }
    out_grep = {"grep_at": rates(grep_hits, n), "recall_and_grep_at": rates(fused_hits, n)} if mode == "fold" else {}
    return {
        "replay": "chat" if replies else "observer",
        "mode": mode,
        "questions": n,
        "recall_at": rates(hits, n),
        "recall_all_at": rates(hits_all, n),
        "states": {
            "questions": n_states,
            "at": rates(states_hits, n_states),
            "by_category": {
                str(c): {
                    "name": CATEGORY_NAMES.get(c, str(c)),
                    "questions": v["states"],
                    "recall_at": rates(v["states_hits"], v["states"]),
                }
                for c, v in sorted(by_cat.items())
            },
        },
        **out_grep,
        **({"states_budgets": curve.figures(CATEGORY_NAMES)} if budgets else {}),
        "by_category": {
            str(c): {
                "name": CATEGORY_NAMES.get(c, str(c)),
                "questions": v["questions"],
                "recall_at": rates(v["hits"], v["questions"]),
            }
            for c, v in sorted(by_cat.items())
        },
        "conversations": per_conv,
        "seconds": round(time.perf_counter() - started, 2),
    }


def evaluate_locomo(
    path: str | Path,
    *,
    conversations: Sequence[str] | None = None,
    ks: Sequence[int] = (1, 3, 5, 10),
    embedder: EmbedderChoice = None,
    progress: Progress | None = None,
    replies: bool = False,
    mode: str = "compaction",
) -> dict[str, Any]:
    """Replay each conversation of the LoCoMo file at ``path`` through a recall-enabled
    run, ask Recall every answerable question, and measure evidence recall@k.

    ``conversations`` picks sample ids (default all); ``embedder`` as for
    :class:`~loomrt.recall.RunRecall` (None: MiniLM; False: lexical-only); ``replies``
    replays as a chat (a short acknowledgement after each turn) instead of an observer.
    ``mode`` fold replays into a fold run and also asks its Grep (:func:`grep_ranked`):
    ``grep_at`` and ``recall_and_grep_at`` (:func:`with_grep`: the two lists fused by
    reciprocal rank where Grep matched every word it searched) beside
    Recall's own ``recall_at`` on that run.
    Returns ``{"replay", "mode", "questions", "recall_at": {"1": x, ...}`` (any evidence turn in
    the top k), ``"recall_all_at"`` (every evidence turn in the top k), ``"by_category",
    "conversations", "seconds"}``.
    """
    return asyncio.run(
        evaluate_locomo_async(
            path, conversations=conversations, ks=ks, embedder=embedder, progress=progress, replies=replies, mode=mode
        )
    )
