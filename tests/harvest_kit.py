"""Helpers for the harvest tests: an agent that banks, a chat that evicts."""

from __future__ import annotations

import asyncio
from typing import Any

from loomrt import Runtime
from loomrt.providers.scripted import ScriptedProvider
from loomrt.record.sqlite import SQLiteStore
from loomrt.spec import AgentSpec


def harvest_agent(**context: Any) -> AgentSpec:
    """A recap agent with recall and harvest on, evicting every few turns."""
    ctx = {
        "mode": "recap",
        "budget_tokens": 600,
        "keep_last_n": 2,
        "recall": True,
        "harvest_to_memory": True,
        "memory_scopes": ["user"],
        **context,
    }
    return AgentSpec.model_validate({"model": "scripted/harvest", "context": ctx})


def chat(
    store: SQLiteStore,
    spec: AgentSpec,
    inputs: list[str],
    *,
    user: str | None = "alice",
    replies: list[str] | None = None,
    finish: bool = True,
    **kw: Any,
) -> tuple[Runtime, str]:
    """Play ``inputs`` as one interactive run; the runtime and the run id."""
    provider = ScriptedProvider(
        turns=replies or [f"noted {i}. " + "ok " * 30 for i in range(len(inputs))], summaries=[{"extractive": 300}]
    )
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
