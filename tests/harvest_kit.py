"""Helpers for the harvest tests: a record on each backend, an agent that banks, a chat that
evicts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loomrt import Runtime
from loomrt.providers.scripted import ScriptedProvider
from loomrt.record.sqlite import SQLiteStore
from loomrt.spec import AgentSpec


def harvest_record(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    """The body of the harvest tests' ``store`` fixture: a record on the backend
    ``request.param`` names; harvest's tables live beside it (the SQLite file, or the
    PostgreSQL database), and are let go after the test."""
    from loomrt.harvest.wiring import release
    from loomrt.record.sqlite import default_store

    record = (
        SQLiteStore(tmp_path / "record.sqlite")
        if request.param == "sqlite"
        else default_store(request.getfixturevalue("postgres_url"))
    )
    yield record
    release(record)
    record.close()


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


TALK = [padded(f"My colleague Rosa{i} works on the billing service and prefers tabs over spaces.") for i in range(6)]
"""Six turns that each name a colleague: enough for a few distillations to bank."""
