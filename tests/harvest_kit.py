"""Helpers for the harvest tests: an agent that banks, a chat that evicts, spans banked directly."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from loomrt import Runtime
from loomrt.harvest.bank import Bank
from loomrt.harvest.db import harvest_db
from loomrt.messages import EvictedSpan, Message
from loomrt.providers.scripted import ScriptedProvider
from loomrt.record.sqlite import SQLiteStore
from loomrt.spec import AgentSpec


def harvest_agent(**context: Any) -> AgentSpec:
    """A recap agent with recall and harvest on, evicting every few turns."""
    ctx = {"mode": "recap", "budget_tokens": 600, "keep_last_n": 2, "recall": True, "harvest_to_memory": True,
           "memory_scopes": ["user"], **context}
    return AgentSpec.model_validate({"model": "scripted/harvest", "context": ctx})


def chat(store: SQLiteStore, spec: AgentSpec, inputs: list[str], *, user: str | None = "alice",
         replies: list[str] | None = None, finish: bool = True, **kw: Any) -> tuple[Runtime, str]:
    """Play ``inputs`` as one interactive run; the runtime and the run id."""
    provider = ScriptedProvider(turns=replies or [f"noted {i}. " + "ok " * 30 for i in range(len(inputs))],
                                summaries=[{"extractive": 300}])
    rt = Runtime(store, providers=lambda s, m: provider, embedder="hash", user=user, **kw)

    async def play() -> str:
        run = await rt.astart(spec, interactive=True)
        for text in inputs:
            await rt.send(run, text)
        if finish:
            await rt.afinish(run)
        return run.run_id

    return rt, asyncio.run(play())


def padded(text: str, words: int = 45) -> str:
    """``text`` with filler after it, so a few turns fill the budget."""
    return text + " " + " ".join(["filler"] * words)


def bank_spans(path: Path, n: int, *, run_id: str = "r0", scope: str = "user:alice", turns: int = 1,
               start: int = 0) -> list[str]:
    """Bank ``n`` spans directly (no run), each with ``turns`` user lines ``Item K is V``; their texts."""
    db = harvest_db(path)
    bank = Bank(db, run_id=run_id, agent="loader", def_hash="0" * 16, scope=scope, max_tokens=8000,
                private=set, record=lambda kind, data: None)
    texts = []
    for i in range(start, start + n):
        messages = []
        for j in range(turns):
            text = f"Item{i}x{j} is worth {i * 7 + j} credits."
            texts.append(text)
            messages.append(Message(role="user", content=text, seq=2 * (i * turns + j) + 1, ts=1_700_000_000.0 + i))
        bank.bank(EvictedSpan(run_id=run_id, agent="loader", mode="recap", distillation_seq=10 * i + 5,
                              messages=tuple(messages)))
    return texts
