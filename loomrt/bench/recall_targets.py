"""Recall's measured targets, for ``loomrt bench`` (benchmarks, not timed tests).

- :func:`recall_latency`: Recall p50/p95 on a full index, query embedding included
  (target: p95 ≤ 20 ms on a 4,096-entry index, 2 cores);
- :func:`needles_run`: a 200-turn scripted agentic run in which exact values (paths,
  error codes, numbers, names, commands) are stated early and evicted; Recall must
  return each one verbatim in its top 5 (target: all of them).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import threading
import time
from typing import TYPE_CHECKING, Any

from loomrt.bench.model import Needle
from loomrt.messages import EvictedSpan, Message
from loomrt.recall.embedders import EmbedderChoice

if TYPE_CHECKING:
    from loomrt.recall.run_recall import RunRecall

__all__ = ["QueryEmbedder", "recall_latency", "needles_run", "make_needles", "agentic_filler"]

_TOPICS = ["deploy", "billing", "search", "auth", "cache", "queue", "metrics", "backup", "frontend", "mailer"]
_VERBS = ["restarted", "rolled back", "patched", "profiled", "migrated", "rebuilt", "reviewed", "retried"]


def agentic_filler(rng: random.Random, i: int) -> str:
    """One plausible line of agent work, with ids, paths and numbers that are not needles."""
    topic, verb = rng.choice(_TOPICS), rng.choice(_VERBS)
    return (
        f"Step {i}: {verb} the {topic} service on node-{rng.randint(1, 40)}; "
        f"log at /var/log/{topic}/{topic}-{rng.randint(100, 999)}.log shows {rng.randint(2, 900)} requests, "
        f"p99 {rng.randint(20, 900)} ms, exit code {rng.choice([0, 0, 1, 2, 137])}, build {rng.randint(1000, 9999)}."
    )


def make_needles(seed: int = 7) -> list[Needle]:
    """Sixteen needles of several kinds, their values drawn from ``seed``."""
    r = random.Random(seed)
    hexid = "".join(r.choice("0123456789abcdef") for _ in range(8))
    first = r.choice(["Priya", "Mateo", "Ingrid", "Kwame", "Yuki", "Tomasz"])
    last = r.choice(["Okafor", "Lindqvist", "Haddad", "Moreau", "Tanaka", "Novak"])
    table = [
        (
            "path",
            "The deploy lock file lives at {v}.",
            "where is the deploy lock file",
            "Where on disk is the lock we take for a release?",
            f"/srv/deploy/locks/release-{r.randint(10, 99)}.lock",
        ),
        (
            "error",
            "The nightly import failed with error code {v}.",
            "nightly import error code",
            "What code did last night's import job fail with?",
            f"E{r.randint(1000, 9999)}-IMPORT",
        ),
        (
            "port",
            "The staging database listens on port {v}.",
            "staging database port",
            "Which port does the DB for staging answer on?",
            str(r.randint(20000, 29999)),
        ),
        (
            "number",
            "The cache must hold at most {v} entries.",
            "maximum cache entries",
            "How many items may the cache keep at most?",
            str(r.randint(10000, 99999)),
        ),
        (
            "name",
            "The on-call engineer this week is {v}.",
            "who is the on-call engineer this week",
            "Which engineer carries the pager this week?",
            f"{first} {last}",
        ),
        (
            "command",
            "To rotate the signing keys run `{v}`.",
            "command to rotate the signing keys",
            "How do I roll over the signing keys?",
            f"loomctl keys rotate --kid {hexid} --grace 48h",
        ),
        (
            "timestamp",
            "The outage started at {v}.",
            "when did the outage start",
            "At what time did the outage begin?",
            f"2026-03-{r.randint(10, 28)}T0{r.randint(1, 9)}:{r.randint(10, 59)}:00Z",
        ),
        (
            "config",
            "In postgresql.conf we set {v}.",
            "postgresql max_connections setting",
            "How many connections does our Postgres allow?",
            f"max_connections = {r.randint(150, 950)}",
        ),
        (
            "url",
            "The webhook endpoint is {v}.",
            "webhook endpoint url",
            "Where do our webhooks get delivered?",
            f"https://hooks.example.net/v2/{hexid}/ingest",
        ),
        (
            "ip",
            "The bastion host is at {v}.",
            "bastion host ip address",
            "What is the bastion's address?",
            f"10.{r.randint(1, 254)}.{r.randint(1, 254)}.{r.randint(1, 254)}",
        ),
        (
            "version",
            "Pin the client library to version {v}.",
            "which client library version to pin",
            "Which release of the client lib should we lock to?",
            f"4.{r.randint(10, 40)}.{r.randint(0, 9)}",
        ),
        (
            "ticket",
            "The customer escalation is tracked as {v}.",
            "customer escalation ticket",
            "Which ticket tracks the customer's escalation?",
            f"SUP-{r.randint(10000, 99999)}",
        ),
        (
            "env",
            "The feature flag is controlled by the variable {v}.",
            "feature flag environment variable",
            "Which environment variable turns the feature on?",
            f"LOOM_FLAG_{r.choice(['ALPHA', 'BRAVO', 'DELTA'])}_{r.randint(10, 99)}",
        ),
        (
            "budget",
            "The monthly cloud budget is capped at {v}.",
            "monthly cloud budget cap",
            "How much may we spend on cloud each month?",
            f"${r.randint(10, 99)},{r.randint(100, 999)}",
        ),
        (
            "branch",
            "The hotfix lives on branch {v}.",
            "which branch has the hotfix",
            "Where is the hotfix being developed?",
            f"hotfix/{hexid[:4]}-ledger-rounding",
        ),
        (
            "checksum",
            "The release tarball's sha256 starts with {v}.",
            "release tarball sha256",
            "What is the tarball's checksum prefix?",
            "".join(r.choice("0123456789abcdef") for _ in range(16)),
        ),
    ]
    return [
        Needle(key=q, value=v, query=q, statement=s.format(v=v), kind=kind, question=asked)
        for kind, s, q, asked, v in table
    ]


AFTER_EVICTION_GAP_MS = 50.0
"""What a run does between a boundary and its next Recall: its next model call (a fast
local model's first token; the scripted bench model answers at once)."""


class QueryEmbedder:
    """For latency at scale: the index's entries get cheap deterministic vectors (the hash
    embedder, at the query embedder's dimension) and every single-text call (a query) the
    real embedder. The dense side is a flat inner-product index, whose search costs the
    same whatever the vectors hold; the lexical side reads the real texts."""

    def __init__(self, inner: Any = None):
        from loomrt.recall.embedders import HashEmbedder, resolve_embedder

        resolved = resolve_embedder(inner)
        if resolved is None:
            raise ValueError("QueryEmbedder needs an embedder for the queries")
        self.inner = resolved
        self.name, self.dim = f"{resolved.name}+hash-entries", resolved.dim
        self._cheap = HashEmbedder(dim=self.dim)

    def embed(self, texts: list[str]) -> Any:
        return self.inner.embed(texts) if len(texts) == 1 else self._cheap.embed(texts)


def recall_latency(
    entries: int = 4096,
    queries: int = 200,
    *,
    embedder: EmbedderChoice = None,
    seed: int = 1,
    gap_ms: float = AFTER_EVICTION_GAP_MS,
) -> dict[str, Any]:
    """Recall p50/p95 in ms over ``queries`` queries on an index of ``entries`` entries
    (dense + BM25 + fusion + the tool's token cap; query embedding included), warm and as
    the first query after a new eviction (``after_eviction_*``, :func:`_after_evictions`:
    inside a running event loop, ``gap_ms`` after the boundary, with the entries that query
    indexed itself).

    Building the index embeds every entry (MiniLM: about a minute for 4,096 entries on 2 cores).
    """
    from loomrt.recall.run_recall import RunRecall
    from loomrt.spec import ContextSpec

    rng = random.Random(seed)
    recall = RunRecall(
        run_id="bench", embedder=embedder, context=ContextSpec(recall=True, recall_max_entries=max(4096, entries))
    )
    needles = make_needles(seed)
    batch = 256
    seq = 1
    started = time.perf_counter()
    while recall.size() < entries:
        msgs = []
        for _ in range(min(batch, entries - recall.size())):
            text = needles[seq % len(needles)].statement if seq % 97 == 0 else agentic_filler(rng, seq)
            msgs.append(
                Message(
                    role="user" if seq % 3 else "tool",
                    name=None if seq % 3 else "shell",
                    content=text,
                    seq=seq,
                    ts=time.time(),
                )
            )
            seq += 1
        recall.on_evicted(EvictedSpan("bench", "bench", "compaction", seq, tuple(msgs)))
    build_s = time.perf_counter() - started
    qs = [n.query for n in needles] + [f"{rng.choice(_VERBS)} {rng.choice(_TOPICS)} service logs" for _ in range(20)]
    recall.tool.fn(query="warm up", top_k=5)
    times = []
    for i in range(queries):
        t0 = time.perf_counter()
        recall.tool.fn(query=qs[i % len(qs)], top_k=5)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    size = recall.size()
    # the first query after each new eviction, as a run meets it (:func:`_after_evictions`)
    after, inline, waited = asyncio.run(_after_evictions(recall, rng, seq, qs, max(1, queries // 4), gap_ms / 1000))
    after.sort()
    return {
        "entries": size,
        "queries": queries,
        "dense": recall.index.dense,
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(_p95(times), 2),
        "after_eviction_p50_ms": round(statistics.median(after), 2),
        "after_eviction_p95_ms": round(_p95(after), 2),
        "after_eviction_gap_ms": gap_ms,
        "after_eviction_inline_entries": round(statistics.mean(inline), 2),
        "after_eviction_inline_share": round(sum(n > 0 for n in inline) / len(inline), 3),
        "after_eviction_waited_entries": round(statistics.mean(waited), 2),
        "build_s": round(build_s, 1),
    }


async def _after_evictions(
    recall: RunRecall, rng: random.Random, seq: int, qs: list[str], n: int, gap_s: float
) -> tuple[list[float], list[int], list[int]]:
    """The first query after each of ``n`` new evictions, as a run meets it: inside the
    running event loop, where the evicted span goes to the background index, ``gap_s``
    after the boundary (the run's next model call). The query meets whatever is indexed,
    waits for the slice the background thread is embedding, and embeds the rest itself: its
    time, the span's entries it embedded inside the timed call (counted work: entries handed
    to the index's embedding on the loop's thread), and the entries it waited for."""
    times: list[float] = []
    inline: list[int] = []
    waited: list[int] = []
    index, loop_thread, embedded = recall.index, threading.get_ident(), [0]
    embed = index.embed

    def counted(drafts: Any) -> Any:
        if threading.get_ident() == loop_thread:
            embedded[0] += len(drafts)
        return embed(drafts)

    index.embed = counted  # type: ignore[method-assign]
    try:
        for i in range(n):
            span = tuple(
                Message(role="user", content=agentic_filler(rng, seq + j), seq=seq + j, ts=time.time())
                for j in range(8)
            )
            seq += 8
            recall.on_evicted(EvictedSpan("bench", "bench", "compaction", seq, span))
            await asyncio.sleep(gap_s)
            waiting, before = recall.backlog, embedded[0]
            t0 = time.perf_counter()
            recall.tool.fn(query=qs[i % len(qs)], top_k=5)
            times.append((time.perf_counter() - t0) * 1000)
            taken = waiting - recall.backlog  # entries the call indexed, its own vectors or the thread's
            own = embedded[0] - before if index.dense else taken
            inline.append(own)
            waited.append(taken - own)
    finally:
        del index.embed  # the class's method again
    return times, inline, waited


def _p95(sorted_times: list[float]) -> float:
    return sorted_times[min(len(sorted_times) - 1, int(0.95 * len(sorted_times)))]


def needles_run(
    turns: int = 200,
    *,
    embedder: EmbedderChoice = None,
    seed: int = 7,
    top_k: int = 5,
    tool_lines: tuple[int, int] = (20, 60),
    paraphrased: bool = True,
) -> dict[str, Any]:
    """Play a ``turns``-turn scripted agentic run (compaction, recall on) in which the
    needles are stated in the first turns (some in user inputs, some inside long tool
    results of ``tool_lines`` lines) and evicted; in its last turns each needle is asked
    for, in other words than its statement's (``paraphrased``; else by the harness's key
    words, the easy way it was measured before), and the model calls Recall with the
    question as it was asked.

    Returns ``{"needles", "found_top5", "missed": [...], "distillations", "entries", "seconds"}``.
    """
    return asyncio.run(
        _needles_run(turns, embedder=embedder, seed=seed, top_k=top_k, tool_lines=tool_lines, paraphrased=paraphrased)
    )


async def _needles_run(
    turns: int, *, embedder: EmbedderChoice, seed: int, top_k: int, tool_lines: tuple[int, int], paraphrased: bool
) -> dict[str, Any]:
    from loomrt.spec import AgentSpec
    from loomrt.testing import ScriptedProvider, scripted_runtime
    from loomrt.tools import Tool

    started = time.perf_counter()
    rng = random.Random(seed)
    needles = make_needles(seed)
    if turns < 2 * len(needles) + 10:
        raise ValueError(f"needles_run needs at least {2 * len(needles) + 10} turns")
    outputs: dict[str, str] = {}

    def shell(command: str) -> str:
        return outputs.get(command, f"$ {command}\n(no output)")

    inputs: list[str] = ["You operate our platform. Work through the steps I give you, one at a time."]
    script: list[dict[str, Any]] = [{"text": "Ready."}]
    ask_from = turns - len(needles)
    for t in range(turns):
        if t < len(needles) and t % 2 == 0:  # stated by the user
            inputs.append(f"Note for later: {needles[t].statement}")
            script.append({"text": "Noted."})
        elif t < len(needles):  # buried in a long tool result
            command = f"cat /etc/runbook/section-{t}.txt"
            lines = [agentic_filler(rng, 1000 * t + j) for j in range(rng.randint(*tool_lines))]
            lines.insert(rng.randint(3, len(lines) - 3), needles[t].statement)
            outputs[command] = "\n".join(lines)
            inputs.append(f"Read runbook section {t}.")
            script += [{"tool_call": {"name": "shell", "arguments": {"command": command}}}, {"text": "Read it."}]
        elif t < ask_from:  # ordinary work: tool calls with results of varied size
            command = f"tail -n {rng.randint(1, 40)} /var/log/step-{t}.log"
            outputs[command] = "\n".join(
                agentic_filler(rng, 100 * t + j) for j in range(rng.randint(1, tool_lines[1] * 2 // 3))
            )
            inputs.append(f"Step {t}: {agentic_filler(rng, t)} Check the log.")
            script += [
                {"tool_call": {"name": "shell", "arguments": {"command": command}}},
                {"text": f"Step {t} checked."},
            ]
        else:
            needle = needles[t - ask_from]
            # asked in other words than the statement's; the reader searches by the question
            # as it was put, as the workloads' reader does (never by the harness's key words)
            asked = needle.question if paraphrased else f"{needle.query}?"
            inputs.append(f"Question: {asked}")
            script += [
                {"tool_call": {"name": "Recall", "arguments": {"query": asked, "top_k": top_k}}},
                {"text": "Answered from Recall."},
            ]
    provider = ScriptedProvider(turns=list[Any](script), summaries=[{"extractive": 600, "words": 4}])
    shell_tool = Tool(
        "shell",
        "Run a shell command.",
        {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        shell,
    )
    rt = scripted_runtime(provider, embedder=embedder, tools=[shell_tool])
    spec = AgentSpec(
        model="scripted/needles",
        tools=["shell"],
        max_iterations=4,
        context={"mode": "compaction", "budget_tokens": 4096, "keep_last_n": 6, "recall": True},
    )
    run = rt.start(spec, interactive=True, name="needles")
    in_context: list[str] = []
    for i, text in enumerate(inputs):
        if i == ask_from + 1:  # before the first question: which needles were never evicted?
            in_context = [n.kind for n in needles if any(n.value in m.content for m in run.context)]
        result = await rt.send(run, text)
        if result.status == "failed":
            raise RuntimeError(f"the needles run failed: {result.error}")
    answers = [
        json.loads(e.data["content"])
        for e in rt.store.events(run.run_id, kinds=["tool_result"])
        if e.data.get("name") == "Recall"
    ]
    missed = [
        n.kind
        for n, a in zip(needles, answers, strict=True)
        if not any(n.value in r["text"] for r in a["results"][:top_k])
    ]
    return {
        "needles": len(needles),
        "found_top5": len(needles) - len(missed),
        "missed": missed,
        "still_in_context": in_context,
        "distillations": run.distillations,
        "entries": run.toolset.recall.size(),
        "dense": run.toolset.recall.index.dense,
        "seconds": round(time.perf_counter() - started, 1),
    }
