"""``loomrt bench qa``'s ``memory`` rows: a later run of the same user answers from durable memory alone.

:func:`remember` replays the conversation into a recap run that banks what it evicts
(``context.harvest_to_memory``, the ``user`` scope), the model writing every recap, and then
drains the harvest queue with a :class:`~loomrt.harvest.Consolidator` whose extractor is the
same model: the facts it extracts, and every banked line kept verbatim as a passage.

:func:`ask_memory` sends each question to a **new run** of the same user in a record of its
own: it has no access to the replayed run's record, only to the user's durable memory,
which reaches it the way it reaches any run, through the runtime's recall injection (the
Recall tool is not offered: the rows measure what memory gives without asking).
``memory/passages-only`` reads the passages alone, so the facts' own contribution shows.

Memory holds what the replay evicted and, once the conversation is over, its tail (the final
working context: :func:`loomrt.harvest.sweep.tail_spans`); the setup reports any turn never
banked (a private one, say).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from loomrt.bench.locomo_recall import render_turn, turns_of
from loomrt.bench.qa.parts import QUESTION_PREFIX, Meter, Metered
from loomrt.bench.qa.replay import QA_INSTRUCTION, Asked, replay_mode
from loomrt.providers.base import ModelProvider
from loomrt.recall.embedders import EmbedderChoice
from loomrt.record.sqlite import SQLiteStore
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec

__all__ = [
    "MEMORY_CONFIGS",
    "MEMORY_SYSTEM",
    "TierMemory",
    "remember",
    "ask_memory",
    "memory_spec",
    "user_of",
    "banked_turns",
]

MEMORY_CONFIGS = ["memory", "memory/passages-only"]
MEMORY_SYSTEM = (
    "You answer questions about an earlier conversation between two people. You do not have "
    "the conversation: what your memory recalls of it comes with each question. " + QA_INSTRUCTION
)


def user_of(cid: str) -> str:
    """The user whose runs heard conversation ``cid`` (the ``user`` scope of its memory)."""
    return f"locomo-{cid}"


class TierMemory:
    """A user's durable memory as a run reads it, limited to ``tiers`` (facts, passages, or
    both fused): a :class:`~loomrt.recall.memory.MemorySource`."""

    def __init__(self, memory: Any, scopes: Sequence[str], tiers: Sequence[str]):
        self.memory, self.scopes, self.tiers = memory, list(scopes), tuple(tiers)

    def search(self, query: str, top_k: int, scopes: Sequence[str] | None = None) -> list[Any]:
        wanted = [s for s in scopes or self.scopes if s in self.scopes]
        return list(self.memory.search(query, top_k, wanted, self.tiers))


def memory_spec(base: AgentSpec, *, inject_tokens: int, harvest: bool) -> AgentSpec:
    """The replay's agent banking what it evicts (``harvest``), or the asking run's: the
    same model and budget, durable memory of the ``user`` scope injected within
    ``inject_tokens``, no Recall tool, and a system prompt that says memory is all it has."""
    context = base.context.model_dump()
    context.update(memory_scopes=["user"])
    if harvest:
        context.update(harvest_to_memory=True)
        return base.model_copy(update={"context": type(base.context).model_validate(context)})
    context.update(
        mode="append",
        recall=True,
        recall_tool=False,
        recall_inject="on",
        recall_inject_tokens=inject_tokens,
        budget_tokens=int(context["budget_tokens"]) + inject_tokens,
    )
    return base.model_copy(
        update={"system_prompt": MEMORY_SYSTEM, "context": type(base.context).model_validate(context)}
    )


async def remember(
    store: SQLiteStore,
    sample: dict[str, Any],
    spec: AgentSpec,
    replayer: ModelProvider,
    extractor: ModelProvider,
    meter: Meter,
    *,
    cid: str,
    embedder: EmbedderChoice,
    on_turn: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Replay ``sample`` into a run that banks what it evicts, then consolidate the bank
    with ``extractor`` until the queue is drained; what it cost and what memory holds."""
    from loomrt.harvest import Consolidator
    from loomrt.harvest.wiring import memory_store

    started, mark = time.perf_counter(), meter.mark()
    runtime_user = user_of(cid)
    run_id = await replay_mode(
        store,
        sample,
        memory_spec(spec, inject_tokens=0, harvest=True),
        replayer,
        name=f"qa-{cid}-memory",
        embedder=embedder,
        on_turn=on_turn,
        user=runtime_user,
    )
    replayed = time.perf_counter()
    memory = memory_store(store, embedder)
    worker = Consolidator(
        store,
        provider=Metered(extractor, meter),
        embedder=embedder,
        settle_s=0,
        tail_after_s=0,  # the conversation is over: its tail (the final working context) is memory too
        memory=memory,
    )
    totals: dict[str, Any] = {"batches": 0, "spans": 0, "facts": {}, "passages": {}, "dropped": {}, "dead_letters": 0}
    while True:
        report = (await worker.arun_once([f"user:{runtime_user}"])).to_dict()
        if not report["batches"]:
            break
        for key in ("batches", "spans", "dead_letters"):
            totals[key] += report[key]
        for key in ("facts", "passages", "dropped"):
            for k, v in report[key].items():
                totals[key][k] = totals[key].get(k, 0) + v
    events = store.events(run_id)
    banked = {
        t.get("seq")
        for (turns,) in worker.db.rows("SELECT turns FROM harvest_spans WHERE run_id = ?", (run_id,))
        for t in json.loads(turns)
    }
    inputs = [e.seq for e in events if e.kind == "user_input"]
    return {
        "run_id": run_id,
        "seconds": round(time.perf_counter() - started, 1),
        "consolidation_seconds": round(time.perf_counter() - replayed, 1),
        "distillations": sum(e.kind == "distillation" for e in events),
        "declined": sum(e.kind == "distillation_declined" for e in events),
        "rejected_summaries": sum(e.kind == "summary_rejected" for e in events),
        "turns_never_banked": sum(s not in banked for s in inputs),
        **totals,
        **{f"distil_{k}": v for k, v in Meter.totals(meter.since(mark)).items()},
    }


async def ask_memory(
    memory: Any,
    cid: str,
    question: str,
    spec: AgentSpec,
    provider: ModelProvider,
    *,
    embedder: EmbedderChoice,
    tiers: Sequence[str],
    turns: dict[str, str],
) -> Asked:
    """Send ``question`` to a new run of the user who heard ``cid``, in a record of its own,
    reading durable memory's ``tiers``. ``turns`` maps a turn's words (as banked) to its dia
    id, so the passages injected can be told apart as evidence or not."""
    store = SQLiteStore(":memory:")
    user = user_of(cid)
    source = TierMemory(memory, [f"user:{user}"], tiers)
    runtime = Runtime(store, providers=lambda s, m: provider, embedder=embedder, memory=source, user=user)
    run = await runtime.astart(spec, name="qa-memory", interactive=True)
    result = await runtime.send(run, f"{QUESTION_PREFIX}{question}")
    injected = [e.data for e in store.events(run.run_id) if e.kind == "recall_injected"]
    store.close()
    texts = [str(p.get("text", "")) for d in injected for p in d["passages"]]
    return Asked(
        result.output or "",
        "failed" if result.status == "failed" else "done",
        0,
        0,
        result.error,
        injected_text="\n".join(texts),
        injections=len(injected),
        injected_dias=tuple(turns[t] for t in texts if t in turns),
    )


def banked_turns(sample: dict[str, Any]) -> dict[str, str]:
    """Each turn's words as a passage keeps them (the replayed user input) → its dia id."""
    return {render_turn(t).strip(): t.dia_id for t in turns_of(sample)}
