"""A record for the UI's tests and screenshots: runs the runtime itself plays, with no real
model. A recap chat that distils, reads a private tool and is forked (the model reports the
prompt's estimated tokens as its usage, so the chart has a line); the scripted fold demo; the
scripted fan-out (a stateful parent and its two children). Nothing here stands in for loomrt."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from loomrt import Runtime, SQLiteStore, load_agents
from loomrt.bench.leak_measure import Echo
from loomrt.providers.base import ModelRequest, ModelResponse, Usage
from loomrt.spec import AgentSpec
from loomrt.tokens import count_dicts
from loomrt.tools import Tool

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class UiRecord:
    store: SQLiteStore
    path: Path
    recap: str
    fork: str
    grandfork: str
    """A fork of the fork."""
    fold: str
    fold_fork: str
    """A fork of the fold run at its last seq: its catalog is its parent's, its cards the family's."""
    fanout: str
    secret: str


def _with_usage(echo: Echo):  # type: ignore[no-untyped-def]
    from loomrt.testing import extractive_summary

    def answer(request: ModelRequest) -> ModelResponse:
        if request.purpose != "turn":  # a recap that reads like one: the leading words of each message
            out = ModelResponse(text=extractive_summary(request, max_chars=600, words_per_line=12))
        else:
            out = echo(request)
        usage = Usage(input_tokens=count_dicts(request.messages), output_tokens=max(1, len(out.text) // 4))
        return ModelResponse(text=out.text, tool_calls=out.tool_calls, usage=usage)

    return answer


def ui_record(folder: Path) -> UiRecord:
    from loomrt.testing import FunctionProvider

    secret = "VAULT-7731-QX"
    vault = Tool("vault", "The token.", {"type": "object", "properties": {}}, lambda: secret, private=True)
    path = folder / "record.sqlite"
    store = SQLiteStore(path)
    provider = FunctionProvider(_with_usage(Echo([secret])), local=False)
    rt = Runtime(store, providers=lambda spec, model: provider, tools=[vault])
    spec = AgentSpec(
        model="function/inline",
        system_prompt="You keep the user's notes.",
        tools=["vault"],
        context={"mode": "recap", "budget_tokens": 500, "keep_last_n": 2, "autorecap_at_pct": 60},
    )

    def filler(i: int) -> str:
        return f"Note {i}: " + "the venue team sent another long update about chairs, lights and parking. " * 3

    async def chat() -> tuple[str, str, str]:
        run = await rt.astart(spec, interactive=True, name="notes")
        await rt.send(run, "Fetch the vault token.")
        for i in range(12):
            await rt.send(run, filler(i))
        forked = await rt.fork(run.run_id)
        await rt.send(forked, filler(50))  # the fork distils its own turns (Recall's source "run")
        await rt.send(forked, filler(51))
        grand = await rt.fork(forked.run_id)
        return run.run_id, forked.run_id, grand.run_id

    recap, fork, grandfork = asyncio.run(chat())
    agents_path = REPO / "agents.yaml"
    agents = load_agents(agents_path)
    demos = Runtime(store)
    fold = demos.run_sync("demo-fold", "Migrate the staging database.", agents=agents, agents_file=str(agents_path))
    fold_fork = asyncio.run(demos.fork(fold.run_id)).run_id
    fanout = demos.run_sync("demo-fanout", "Check the stations.", agents=agents, agents_file=str(agents_path))
    return UiRecord(store, path, recap, fork, grandfork, fold.run_id, fold_fork, fanout.run_id, secret)
