"""Small helpers shared by the spine's tests: YAML files on disk, a runtime over a real
SQLite file, and readers of the record. Nothing here stands in for loomrt itself."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

from loomrt import Event, Runtime, SQLiteStore, load_agents
from loomrt.providers.base import ModelProvider
from loomrt.run.state import RunResult, RunState


def write(folder: Path, name: str, text: str) -> Path:
    """Write dedented ``text`` to ``folder/name`` (parents created) and return the path."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def agents_from(folder: Path, text: str, name: str = "agents.yaml") -> Any:
    """Write an agents file and load it through :func:`loomrt.load_agents`."""
    return load_agents(write(folder, name, text))


def runtime(folder: Path, provider: ModelProvider | None = None, **kw: Any) -> Runtime:
    """A runtime over a real SQLite file in ``folder``; every model is ``provider`` when given,
    else models resolve as in production (``scripted/PATH`` reads the script file)."""
    store = SQLiteStore(folder / "record.sqlite")
    if provider is not None:
        kw["providers"] = lambda spec, model: provider
    return Runtime(store, **kw)


def send(rt: Runtime, run: RunState, text: str) -> RunResult:
    return asyncio.run(rt.send(run, text))


def kinds(rt: Runtime, run_id: str) -> list[str]:
    return [e.kind for e in rt.store.events(run_id)]


def events(rt: Runtime, run_id: str, kind: str) -> list[Event]:
    return rt.store.events(run_id, kinds=[kind])


def context_dicts(run: RunState) -> list[dict[str, Any]]:
    return [m.to_dict() for m in run.context]


def shape(run: RunState) -> list[str]:
    """The working context as short tags: role, or the synthetic kind, plus 'pinned'."""
    out = []
    for m in run.context:
        tag = m.synthetic or m.role
        out.append(f"{tag}*" if m.pinned else tag)
    return out


def tool_call(name: str, usage: int | None = None, **arguments: Any) -> dict[str, Any]:
    """One scripted turn that calls ``name``; ``usage`` simulates reported prompt tokens."""
    turn: dict[str, Any] = {"tool_call": {"name": name, "arguments": arguments}}
    if usage is not None:
        turn["usage"] = {"input_tokens": usage}
    return turn
