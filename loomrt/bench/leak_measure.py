"""The readers' leaks: what every reader of a run returns of private material, on chats built
to leak if a reader can. Shared by ``loomrt bench run audit`` (its ``readers`` rows) and the
property test of tests/test_private_readers.py.

The chat fetches a private vault token, the user says a PIN an operator then marks private,
and the user asks the model to repeat both; the model (:class:`Echo`) quotes what it read and
copies it into Σ (stateful), and the summariser copies its whole input. The run is forked and
the fork talks on. Every reader then reads the parent and the fork: the record's events
(``runs events``, ``runs export --json``), MCP ``get_run`` and ``get_events``, the markdown
export, and the working context as of the end. The control plays the same chat with an
ordinary tool and no mark: every reader must show the secrets, or the chat tests nothing.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from loomrt.audit import context_as_of, to_markdown, transcript
from loomrt.mcp.service import RunService
from loomrt.messages import ToolCall
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.record.sqlite import SQLiteStore
from loomrt.runtime import Runtime
from loomrt.spec import AgentsFile, AgentSpec
from loomrt.testing import FunctionProvider
from loomrt.tools import Tool
from loomrt.visibility import mark_private_in_record, reader_events

__all__ = ["MODES", "Echo", "leaks", "play", "reader_leaks", "READERS"]

READERS = ("events", "get_run", "get_events", "export", "as_of")
"""The readers :func:`leaks` reads."""

MODES = ["append", "recap", "compaction", "stateful", "fold"]


class Echo:
    """A model that calls the vault when asked, quotes the secrets it read when asked to
    repeat, copies them into Σ (stateful), and a summariser that copies its whole input, the
    lines that hold a secret first."""

    def __init__(self, secrets: list[str]):
        self.secrets = secrets

    def __call__(self, request: ModelRequest) -> ModelResponse:
        text = [str(m.get("content") or "") for m in request.messages]
        if request.purpose != "turn":  # the lines holding a secret first, so a short limit keeps them
            lines = "\n".join(text).splitlines()
            first = [line for line in lines if any(s in line for s in self.secrets)]
            return ModelResponse(text="The span: " + "\n".join([*first, *lines])[:1500])
        last_user = max((i for i, m in enumerate(request.messages) if m.get("role") == "user"), default=0)
        asked = "vault" in text[last_user] and not any(m.get("role") == "tool" for m in request.messages[last_user:])
        if not any(t.name == "emit_state" for t in request.tools):
            if "Repeat" in text[last_user]:  # the model quotes what it read: derived private
                return ModelResponse(
                    text="You said: " + " and ".join(s for s in self.secrets if any(s in t for t in text))
                )
            if asked:
                return ModelResponse(text="", tool_calls=(ToolCall(id=f"v{len(text)}", name="vault", arguments={}),))
            return ModelResponse(text="Noted.")
        seen = [s for s in self.secrets if any(s in t for t in text)]
        step: dict[str, Any] = {"reasoning": "step", "patch": {"seen": len(text)}}
        if asked and "Last observation" not in "".join(text[last_user:]):
            step["action"] = {"tool": "vault", "arguments": {}}
        else:
            step.update(done=True, final="ok", patch={"copied": seen} if seen else {"seen": len(text)})
        return ModelResponse(text="", tool_calls=(ToolCall(id=f"s{len(text)}", name="emit_state", arguments=step),))


def leaks(store: SQLiteStore, run_id: str, service: RunService, secrets: list[str]) -> list[str]:
    """The readers of run ``run_id`` that returned a secret."""
    events = reader_events(store, run_id)
    read = {
        "events": json.dumps([e.to_json_dict() for e in events]),
        "get_run": json.dumps(service.get_run(run_id)),
        "get_events": json.dumps(service.get_events(run_id, 0, 1000)),
        "export": to_markdown(run_id, transcript(events)),
        "as_of": json.dumps([m.to_dict() for m in context_as_of(events, events[-1].seq, store)]),
    }
    return [f"{where} of {run_id}" for where, text in read.items() if any(s in text for s in secrets)]


def play(
    mode: str,
    folder: str,
    *,
    before: int,
    after: int,
    fork: bool,
    forked_turns: int,
    n: int,
    private: bool = True,
) -> Any:
    """A chat in ``mode`` that fetches the private vault token, says a PIN an operator then
    marks private, and talks on (forked, and the fork talks on, when ``fork``):
    (store, runtime, run ids, the two secrets). ``private=False``, the control: the vault is an
    ordinary tool and nobody marks the PIN, so every reader shows both."""
    secret, said = f"VAULT-{n}-QX", f"PIN-{n}-ZW"
    echo = Echo([secret, said])
    vault = Tool("vault", "The token.", {"type": "object", "properties": {}}, lambda: secret, private=private)
    store = SQLiteStore(Path(folder) / "record.sqlite")
    rt = Runtime(store, providers=lambda spec, model: FunctionProvider(echo, local=False), tools=[vault])
    context: dict[str, Any] = {"mode": mode, "budget_tokens": 500, "keep_last_n": 2, "autocompact_at_pct": 60}
    context |= {"state_schema": {"type": "object", "properties": {}}} if mode == "stateful" else {}
    context |= {"fold": {"max_calls_per_10min": 10_000}} if mode == "fold" else {}
    context |= {"backstop": True} if mode == "append" else {}
    spec = AgentSpec(model="function/inline", tools=["vault"], context=context)

    def filler(i: int) -> str:
        return f"Note {i}: " + "the venue team sent another long update about chairs, lights and parking. " * 4

    async def go() -> list[str]:
        run = await rt.astart(spec, interactive=True)
        for i in range(before):
            await rt.send(run, filler(i))
        await rt.send(run, "Fetch the vault token.")
        await rt.send(run, f"My PIN is {said}.")
        (mine,) = [e for e in store.events(run.run_id, kinds=["user_input"]) if said in e.data["content"]]
        if private:
            mark_private_in_record(store, run.run_id, mine.seq)
        await rt.send(run, "Repeat the token and the PIN.")
        for i in range(after):
            await rt.send(run, filler(100 + i))
        runs = [run.run_id]
        if fork:
            forked = await rt.fork(run.run_id)
            for i in range(forked_turns):
                await rt.send(forked, filler(200 + i))
            runs.append(forked.run_id)
        return runs

    return store, rt, asyncio.run(go()), [secret, said]


def reader_leaks(folder: Path, mode: str, *, private: bool) -> dict[str, Any]:
    """One chat of :func:`play` in ``mode`` (forked): the readers that returned a secret, of the
    parent and of the fork, and whether the record itself keeps both (it must: nothing is lost)."""
    folder.mkdir(parents=True, exist_ok=True)
    store, rt, runs, secrets = play(
        mode, str(folder), before=1, after=4, fork=True, forked_turns=2, n=4242, private=private
    )
    raw = json.dumps([e.to_json_dict() for e in reader_events(store, runs[0], include_private=True)])
    service = RunService(AgentsFile(agents={}), runtime=rt)
    found = [where for run_id in runs for where in leaks(store, run_id, service, secrets)]
    store.close()
    return {
        "mode": mode,
        "private": private,
        "readers": len(READERS) * len(runs),
        "leaking": len(found),
        "where": sorted({w.split(" of ")[0] for w in found}),
        "kept": all(s in raw for s in secrets),
    }
