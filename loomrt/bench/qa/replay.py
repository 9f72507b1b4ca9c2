"""Replaying a LoCoMo conversation through a real run, and asking a question of a fork of it.

:func:`replay_mode` plays every turn of a conversation into an interactive run of the
given retention mode on the real model: each turn is one user input (``[date] Speaker:
text``), acknowledged without a model call (:class:`~loomrt.bench.qa.parts.Acknowledging`),
and every boundary is distilled by the real model through the real code paths (summary,
recap, prose check, recall indexing). The run lives in the output folder's record, so an
interrupted benchmark picks the finished replay up again.

:func:`ask` copies the replayed run into a throwaway record (a fork: same events, a new run
id, ``parent_run_id`` set), opens it, and sends the question: every question meets the
same final working context, with Recall available where the mode has it, and the model
decides whether to use it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loomrt.bench.locomo_recall import render_turn, said_at, turns_of
from loomrt.bench.qa.parts import QUESTION_PREFIX
from loomrt.events import RunInfo
from loomrt.providers.base import ModelProvider
from loomrt.recall.embedders import EmbedderChoice
from loomrt.record.sqlite import SQLiteStore
from loomrt.run.between_turns import between_turns
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.tokens import count_messages

__all__ = [
    "QA_INSTRUCTION",
    "QA_SYSTEM",
    "qa_spec",
    "replay_mode",
    "queued_distillation",
    "settle_replay",
    "ask",
    "Asked",
]

QA_INSTRUCTION = (
    "Answer with a short phrase (a few words: a name, a date, a place, a number), not a "
    "sentence. Give dates as absolute dates, using the dates of the conversation. If the "
    "conversation does not say, answer exactly: No information available."
)
QA_SYSTEM = (
    "You are listening to a long conversation between two people, turn by turn. Later you "
    "will be asked questions about it. " + QA_INSTRUCTION
)


def qa_spec(
    model: str,
    mode: str,
    *,
    budget_tokens: int,
    recall: bool,
    window: int | None,
    one_call_turns: bool | None = None,
) -> AgentSpec:
    """The agent of a replay: ``mode`` on ``budget_tokens``, Recall on or off; on the embedded
    model, ``one_call_turns`` decides and answers in one generation where a tool is offered
    (or, False, in two calls; None: the model's default)."""
    capabilities: dict[str, Any] = {"context_window": window} if window else {}
    if one_call_turns is not None:
        capabilities["one_call_turns"] = one_call_turns
    return AgentSpec(
        model=model,
        system_prompt=QA_SYSTEM,
        max_tokens=64,
        temperature=0,
        max_iterations=4,
        capabilities=capabilities,
        context={
            "mode": mode,
            "budget_tokens": budget_tokens,
            "keep_last_n": 4,
            "recall": recall,
            "recall_max_entries": 8192,
            # a replay's turns are acknowledged without a model call: nothing to recall for
            "recall_inject": "off",
        },
    )


async def replay_mode(
    store: SQLiteStore,
    sample: dict[str, Any],
    spec: AgentSpec,
    provider: ModelProvider,
    *,
    name: str,
    embedder: EmbedderChoice,
    on_turn: Callable[[], None] | None = None,
    user: str | None = None,
) -> str:
    """Replay ``sample`` into a run of ``spec`` in ``store`` (for ``user``: whose memory it
    banks to); its run id. An unfinished replay of the same name in ``store`` (an
    interrupted benchmark) is continued from its last turn."""
    runtime = Runtime(store, providers=lambda s, m: provider, embedder=embedder, user=user)
    unfinished = store.list_runs(limit=1, agent=name)
    turns = turns_of(sample)
    if unfinished:
        run = await runtime.aopen(unfinished[0].run_id)
        if run.view.status != "parked" or run.view.parked_after_error:
            await runtime.resume(run.run_id)  # the turn it stopped in is played to its end
            run = await runtime.aopen(run.run_id)
        turns = turns[len(store.events(run.run_id, kinds=["user_input"])) :]
    else:
        run = await runtime.astart(spec, name=name, interactive=True)
    for turn in turns:
        result = await runtime.send(run, render_turn(turn), said_at=said_at(turn))
        if result.status == "failed":
            raise RuntimeError(f"the replay of {name} failed at {turn.dia_id}: {result.error}")
        if on_turn is not None:
            on_turn()
    await between_turns(run, runtime.coordination)  # the conversation is over: see settle_replay
    return run.run_id


def queued_distillation(store: SQLiteStore, run_id: str) -> bool:
    """Whether the run has queued work for between turns that nothing has done yet (a recap
    or compaction its last turn queued, or a fold), as ``loomrt worker`` finds it."""
    from loomrt.worker import DISTILLATION_QUEUED, DISTILLATION_SETTLED, QUEUED, SETTLED

    return any(
        run_id in store.pending(k, s) for k, s in ((QUEUED, SETTLED), (DISTILLATION_QUEUED, DISTILLATION_SETTLED))
    )


async def settle_replay(store: SQLiteStore, run_id: str, provider: ModelProvider, *, embedder: EmbedderChoice) -> bool:
    """Write the distillation a finished replay's last turn queued (a recap, a compaction, a
    fold), once, as `loomrt worker` writes a closed chat's: otherwise every question's fork
    wrote the same one before it answered (on the embedded model, minutes a question). True
    if one was written."""
    if not queued_distillation(store, run_id):
        return False
    runtime = Runtime(store, providers=lambda s, m: provider, embedder=embedder)
    return await between_turns(await runtime.aopen(run_id), runtime.coordination)


@dataclass
class Asked:
    """One question put to a fork of a replayed run."""

    answer: str
    status: str
    """``done`` (the fork answered and parked for the next input) or ``failed``."""
    context_tokens: int
    """The working context the question met (estimated tokens, before the question)."""
    recall_calls: int
    error: str | None = None
    context_text: str = ""
    """The working context the question met, as text (for the analysis of what it kept)."""
    recall_queries: tuple[str, ...] = ()
    recall_results: tuple[str, ...] = ()
    injected_seqs: tuple[int, ...] = ()
    """The record seqs of the passages injected into the question's prompts."""
    injected_text: str = ""
    injections: int = 0
    """How many blocks the question's calls got (0: injection off, or nothing relevant)."""
    injected_dias: tuple[str, ...] = ()
    """The conversation's turns (dia ids) among the memory passages injected (``memory`` rows)."""


def _asked_as(data: dict[str, Any], *, recall: bool, tool: bool, inject_tokens: int) -> dict[str, Any]:
    """A ``run_started`` payload whose definition is the fork's: Recall on or off, the tool
    offered or not (its system line with it), injection on (``inject_tokens`` > 0, reserved
    on top of the replay's budget, so the question meets the same working context) or off."""
    from loomrt.recall import RECALL_PROMPT

    context = {**data["definition"]["context"], "recall": recall, "recall_tool": tool}
    context["recall_inject"] = "on" if recall and inject_tokens else "off"
    if recall and inject_tokens:
        context["recall_inject_tokens"] = inject_tokens
        context["budget_tokens"] = int(context["budget_tokens"]) + inject_tokens
    definition = {**data["definition"], "context": context}
    system, tools = str(data.get("system", "")), list(data.get("tools", []))
    if not (recall and tool):
        system = system.replace(f"\n\n{RECALL_PROMPT}", "").replace(RECALL_PROMPT, "")
        tools = [t for t in tools if t != "Recall"]
    return {**data, "definition": definition, "system": system, "tools": tools}


async def ask(
    source: SQLiteStore,
    run_id: str,
    question: str,
    provider: ModelProvider,
    *,
    embedder: EmbedderChoice,
    recall: bool = True,
    tool: bool = True,
    inject_tokens: int = 0,
) -> Asked:
    """Fork ``run_id`` into a throwaway record and send ``question`` to the fork. With
    ``recall`` off the fork's definition turns Recall off: the question meets the same
    working context with nothing but what the distillations kept. ``tool`` offers the Recall
    tool; ``inject_tokens`` turns recall injection on with that reserve."""
    fork = SQLiteStore(":memory:")
    info = source.get_run(run_id)
    fork_id = f"{run_id}-{uuid.uuid4().hex[:6]}"
    await fork.write_run(
        RunInfo(**{**info.model_dump(), "run_id": fork_id, "parent_run_id": run_id, "status": "active"})
    )
    for e in source.events(run_id):
        data = (
            _asked_as(e.data, recall=recall, tool=tool, inject_tokens=inject_tokens)
            if e.kind == "run_started"
            else e.data
        )
        await fork.write(fork_id, e.kind, data)
    runtime = Runtime(fork, providers=lambda s, m: provider, embedder=embedder)
    run = await runtime.aopen(fork_id)
    start, context = run.last_seq, count_messages(run.context)
    text = "\n".join(str(m.content or "") for m in run.context)
    result = await runtime.send(run, f"{QUESTION_PREFIX}{question}")
    after = [e for e in fork.events(fork_id) if e.seq > start]
    queries = tuple(
        str(e.data.get("arguments", {}).get("query", ""))
        for e in after
        if e.kind == "tool_call" and e.data.get("name") == "Recall"
    )
    results = tuple(
        str(e.data.get("content", "")) for e in after if e.kind == "tool_result" and e.data.get("name") == "Recall"
    )
    injected = [e.data for e in after if e.kind == "recall_injected"]
    fork.close()
    status = "failed" if result.status == "failed" else "done"
    return Asked(
        result.output or "",
        status,
        context,
        len(queries),
        result.error,
        text,
        queries,
        results,
        injected_seqs=tuple(p["seq"] for d in injected for p in d["passages"] if p.get("seq") is not None),
        injected_text="\n".join(p.get("text", "") for d in injected for p in d["passages"]),
        injections=len(injected),
    )
