"""Private stays private in every reader (issue 39): over generated runs with a private tool
and an operator's mark, in every retention mode, forks included, no reader other than an
explicit ``include_private`` returns the private text or the model's repetition of it. The
model quotes what it read and copies it into Σ, and the summariser copies its whole input,
so a reader that leaks shows it."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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

MODES = ["append", "recap", "compaction", "stateful", "fold"]


class Echo:
    """A model that calls the vault when asked, quotes the secrets it read when asked to
    repeat, copies them into Σ (stateful), and a summariser that copies its whole input."""

    def __init__(self, secrets: list[str]):
        self.secrets = secrets

    def __call__(self, request: ModelRequest) -> ModelResponse:
        text = [str(m.get("content") or "") for m in request.messages]
        if request.purpose != "turn":
            return ModelResponse(text="The span: " + "\n".join(text)[:1500])
        last_user = max((i for i, m in enumerate(request.messages) if m.get("role") == "user"), default=0)
        asked = "vault" in text[last_user] and not any(m.get("role") == "tool" for m in request.messages[last_user:])
        if not any(t.name == "emit_state" for t in request.tools):
            if "Repeat" in text[last_user]:  # the model quotes what it read: derived private
                return ModelResponse(
                    text="You said: " + " and ".join(s for s in self.secrets if any(s in t for t in text))
                )
            if asked:
                return ModelResponse(text="", tool_calls=[ToolCall(id=f"v{len(text)}", name="vault", arguments={})])
            return ModelResponse(text="Noted.")
        seen = [s for s in self.secrets if any(s in t for t in text)]
        step: dict[str, Any] = {"reasoning": "step", "patch": {"seen": len(text)}}
        if asked and "Last observation" not in "".join(text[last_user:]):
            step["action"] = {"tool": "vault", "arguments": {}}
        else:
            step.update(done=True, final="ok", patch={"copied": seen} if seen else {"seen": len(text)})
        return ModelResponse(text="", tool_calls=[ToolCall(id=f"s{len(text)}", name="emit_state", arguments=step)])


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


def play(mode: str, folder: str, *, before: int, after: int, fork: bool, forked_turns: int, n: int) -> Any:
    """A chat in ``mode`` that fetches the private vault token, says a PIN an operator then
    marks private, and talks on (forked, and the fork talks on, when ``fork``):
    (store, runtime, run ids, the two secrets)."""
    secret, said = f"VAULT-{n}-QX", f"PIN-{n}-ZW"
    echo = Echo([secret, said])
    vault = Tool("vault", "The token.", {"type": "object", "properties": {}}, lambda: secret, private=True)
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


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(MODES),
    before=st.integers(0, 3),
    after=st.integers(1, 8),
    fork=st.booleans(),
    forked_turns=st.integers(0, 3),
    n=st.integers(1000, 9999),
)
def test_no_reader_returns_private_text_without_asking(
    mode: str, before: int, after: int, fork: bool, forked_turns: int, n: int
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store, rt, runs, secrets = play(
            mode, folder, before=before, after=after, fork=fork, forked_turns=forked_turns, n=n
        )
        raw = json.dumps([e.to_json_dict() for e in reader_events(store, runs[0], include_private=True)])
        assert all(s in raw for s in secrets), "the record keeps it whole, and an explicit ask reads it"
        service = RunService(AgentsFile(agents={}), runtime=rt)
        assert [where for run_id in runs for where in leaks(store, run_id, service, secrets)] == []
        store.close()


def test_sabotage_with_redaction_made_the_identity_every_reader_leaks(tmp_path: Path, monkeypatch: Any) -> None:
    """The property can fail: with the one redaction function the identity, the readers of a
    stateful run and of its fork return the secrets."""
    import loomrt.visibility as visibility

    store, rt, runs, secrets = play("stateful", str(tmp_path), before=1, after=4, fork=True, forked_turns=1, n=1234)
    monkeypatch.setattr(visibility, "_redacted", lambda e, private: e)
    service = RunService(AgentsFile(agents={}), runtime=rt)
    found = [where for run_id in runs for where in leaks(store, run_id, service, secrets)]
    assert {w.split(" of ")[0] for w in found} == {"events", "get_run", "get_events", "export", "as_of"}
    assert any(runs[1] in w for w in found), "the fork's readers leak the parent's Σ keys"
