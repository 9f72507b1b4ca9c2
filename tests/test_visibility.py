"""Private material: redacted by provenance before any summariser sees it, and in what
leaves the run (export, MCP get_events and recall), yet whole in its own run."""

from __future__ import annotations

import asyncio
import json

import pytest
from spine_kit import runtime
from typer.testing import CliRunner

from loomrt.events import Event
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.spec import AgentSpec
from loomrt.testing import FunctionProvider
from loomrt.tools import Private, Tool
from loomrt.visibility import mark_private_in_record, placeholder, redact_events

SECRET = "vault-token-7Q9Z-SECRET-MARKER"
FILLER = [f"Note {i}: the venue team sent another long update about chairs, lights and parking." for i in range(12)]


class Copier:
    """A model whose turns call the vault once, and whose summariser copies its whole input
    (the worst summariser there is: whatever it is shown, it repeats)."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.vaulted = False

    def __call__(self, request: ModelRequest) -> ModelResponse:
        from loomrt.messages import ToolCall

        if request.purpose != "turn":
            text = "\n".join(str(m.get("content") or "") for m in request.messages if m.get("role") == "user")
            self.prompts.append(text)
            return ModelResponse(text="The account of the span: " + text[:1500])
        if not self.vaulted and any(t.name == "vault" for t in request.tools):
            self.vaulted = True
            return ModelResponse(text="", tool_calls=[ToolCall(id="v1", name="vault", arguments={})])
        return ModelResponse(text="Noted; the venue update is filed.")


def play(tmp_path, mode: str, vault: Tool, *, between=None):
    copier = Copier()
    rt = runtime(tmp_path, FunctionProvider(copier), tools=[vault], embedder="hash")
    ctx = {"mode": mode, "budget_tokens": 500, "keep_last_n": 2, "autocompact_at_pct": 60, "recall": True}
    if mode == "append":
        ctx["backstop"] = True
    spec = AgentSpec(model="function/inline", system_prompt="You plan events.", tools=["vault"], context=ctx)

    async def go():
        run = await rt.astart(spec, interactive=True, name="planner")
        for i, text in enumerate(["Fetch the vault token, then plan the launch.", *FILLER]):
            await rt.send(run, text)
            if between is not None:
                between(rt, run, i)
        return run

    return rt, asyncio.run(go()), copier


def private_vault() -> Tool:
    return Tool("vault", "The deployment token.", {"type": "object", "properties": {}}, lambda: SECRET, private=True)


def returns_private() -> Tool:
    return Tool("vault", "The deployment token.", {"type": "object", "properties": {}}, lambda: Private(SECRET))


def leaks(rt, run_id: str, copier: Copier) -> list[str]:
    """Every place outside the run's own messages where the secret turned up."""
    found = [f"summariser prompt {i}" for i, p in enumerate(copier.prompts) if SECRET in p]
    for e in rt.store.events(run_id, kinds=["distillation"]):
        if SECRET in json.dumps(e.data.get("summary") or ""):
            found.append(f"summary of distillation #{e.seq}")
    return found


@pytest.mark.parametrize("mode", ["recap", "compaction", "append"])
@pytest.mark.parametrize("vault", [private_vault, returns_private], ids=["private-tool", "Private-result"])
def test_a_private_tool_result_never_reaches_a_summary(tmp_path, mode, vault):
    rt, run, copier = play(tmp_path, mode, vault())
    (result,) = rt.store.events(run.run_id, kinds=["tool_result"])
    assert result.data["private"] is True and result.data["content"] == SECRET  # the record keeps it whole
    distillations = rt.store.events(run.run_id, kinds=["distillation"])
    assert distillations and any(result.seq in d.data["span_seqs"] for d in distillations)
    assert copier.prompts and leaks(rt, run.run_id, copier) == []
    assert any(placeholder(result.seq) in p for p in copier.prompts)  # the summariser saw the placeholder
    own = run.toolset.recall.search("vault token 7Q9Z", top_k=3)  # its own run still recalls it
    assert any(SECRET in h.text for h in own)


def test_without_the_flag_the_copier_leaks_it(tmp_path):
    """The guard can fail: the same run with an ordinary tool puts the secret in a summary."""
    plain = Tool("vault", "The deployment token.", {"type": "object", "properties": {}}, lambda: SECRET)
    rt, run, copier = play(tmp_path, "compaction", plain)
    assert leaks(rt, run.run_id, copier)


def test_an_operator_marks_a_message_private_and_later_summaries_get_the_placeholder(tmp_path):
    plain = Tool("vault", "The deployment token.", {"type": "object", "properties": {}}, lambda: SECRET)

    def between(rt, run, i):
        if i == 0:
            (result,) = rt.store.events(run.run_id, kinds=["tool_result"])
            mark_private_in_record(rt.store, run.run_id, result.seq)

    rt, run, copier = play(tmp_path, "recap", plain, between=between)
    assert rt.store.events(run.run_id, kinds=["mark_private"])
    assert copier.prompts and leaks(rt, run.run_id, copier) == []


def test_export_and_mcp_get_events_and_recall_redact_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path))
    from loomrt.mcp.service import RunService
    from loomrt.record import default_store
    from loomrt.spec import AgentsFile

    rt, run, _ = play(tmp_path, "recap", private_vault())
    rt.store.close()
    store = default_store()
    assert store.path == tmp_path / "record.sqlite"
    cli = CliRunner()
    from loomrt.cli.app import app

    exported = cli.invoke(app, ["runs", "export", run.run_id, "--format", "jsonl"]).output
    assert SECRET not in exported and "withheld from summaries" in exported
    assert SECRET in cli.invoke(app, ["runs", "export", run.run_id, "--include-private"]).output
    assert SECRET not in cli.invoke(app, ["runs", "show", run.run_id, "--full"]).output
    assert SECRET in cli.invoke(app, ["runs", "show", run.run_id, "--full", "--include-private"]).output
    (result,) = store.events(run.run_id, kinds=["tool_result"])
    assert json.loads(cli.invoke(app, ["runs", "show", run.run_id, "--json"]).output)["private"] == [result.seq]

    rt.store = store
    service = RunService(AgentsFile(agents={}), runtime=rt)
    page = service.get_events(run.run_id, 0, 1000)
    assert SECRET not in json.dumps(page) and any(e["data"].get("redacted") for e in page["events"])
    assert SECRET in json.dumps(service.get_events(run.run_id, 0, 1000, include_private=True))
    found = asyncio.run(service.recall(run.run_id, "vault token 7Q9Z", 3))
    assert SECRET not in json.dumps(found) and any("withheld" in h["text"] for h in found["hits"])
    assert SECRET in json.dumps(asyncio.run(service.recall(run.run_id, "vault token 7Q9Z", 3, include_private=True)))


def test_redact_events_replaces_by_provenance_not_by_text():
    """A message that merely contains the same words is not private; the flagged one is."""
    events = [
        Event(run_id="r", seq=1, kind="user_input", ts=0.0, data={"content": f"say {SECRET}"}, hash=""),
        Event(
            run_id="r",
            seq=2,
            kind="tool_result",
            ts=0.0,
            hash="",
            data={"tool_call_id": "c", "name": "vault", "content": SECRET, "is_error": False, "private": True},
        ),
    ]
    out = redact_events(events)
    assert out[0].data["content"] == f"say {SECRET}" and out[1].data["content"] == placeholder(2)


def run_stateful(tmp_path, steps: list[dict]):
    """A one-shot stateful run with the private vault, whose model emits ``steps`` in turn."""
    from loomrt.messages import ToolCall

    emits = iter(steps)

    def stateful(request: ModelRequest) -> ModelResponse:
        return ModelResponse(
            text="", tool_calls=[ToolCall(id=f"s{id(request)}", name="emit_state", arguments=next(emits))]
        )

    rt = runtime(tmp_path, FunctionProvider(stateful, local=False), tools=[private_vault()])
    spec = AgentSpec(
        model="function/inline",
        tools=["vault"],
        context={"mode": "stateful", "state_schema": {"type": "object", "properties": {}}},
    )
    return rt, asyncio.run(rt.run(spec, "Deploy with the vault token."))


def test_a_stateful_run_hands_out_sigma_without_the_keys_it_wrote_from_private_material(tmp_path):
    """The model sees its own private observation and may copy it into Σ; the keys a patch set
    while the prompt held private material (the observation, or Σ's private keys) are left
    out of Σ as the run hands it out. Keys set before the secret arrived are handed out."""
    rt, result = run_stateful(
        tmp_path,
        [
            {"reasoning": "start", "patch": {"owner": "ops"}},
            {"reasoning": "get it", "patch": {"plan": "fetch the token"}, "action": {"tool": "vault", "arguments": {}}},
            {"reasoning": "keep it", "patch": {"token": SECRET, "plan": "deploy"}},
            {"reasoning": "done", "patch": {"status": "deployed"}, "done": True, "final": "deployed"},
        ],
    )
    assert result.status == "done"
    assert result.state == {"owner": "ops"}  # written before the secret arrived
    assert list(result.state_withheld) == ["plan", "status", "token"]  # status was written with Σ's token in view
    assert SECRET not in json.dumps(result.to_json())
    updates = rt.store.events(result.run_id, kinds=["state_update"])
    assert updates[2].data["private_keys"] == ["plan", "token"] and updates[2].data["state"]["token"] == SECRET


def test_a_stateful_childs_private_keys_do_not_reach_its_parent(tmp_path):
    """A child that handled a private result hands its parent Σ without the keys it wrote from it."""
    from spine_kit import agents_from

    from loomrt.messages import ToolCall

    child_steps = iter(
        [
            {"reasoning": "fetch", "patch": {"owner": "ops"}, "action": {"tool": "vault", "arguments": {}}},
            {"reasoning": "keep", "patch": {"token": SECRET}, "done": True, "final": "fetched"},
        ]
    )
    parent_steps = iter(
        [
            {
                "reasoning": "ask",
                "patch": {"step": 1},
                "action": {"tool": "spawn", "arguments": {"agent": "fetcher", "prompt": "Fetch the token."}},
            },
            {"reasoning": "done", "patch": {"step": 2}, "done": True, "final": "ok"},
        ]
    )
    seen: list[str] = []

    def model(request: ModelRequest) -> ModelResponse:
        child = any("Fetch the token." in str(m.get("content")) for m in request.messages)
        if not child:
            seen.append(json.dumps(request.messages))
        step = next(child_steps if child else parent_steps)
        return ModelResponse(
            text="", tool_calls=(ToolCall(id=f"c{len(seen)}{child}", name="emit_state", arguments=step),)
        )

    agents = agents_from(
        tmp_path,
        json.dumps(
            {
                "agents": {
                    "lead": {
                        "model": "function/inline",
                        "tools": ["spawn"],
                        "spawnable": ["fetcher"],
                        "context": {"mode": "stateful", "state_schema": {"type": "object", "properties": {}}},
                    },
                    "fetcher": {
                        "model": "function/inline",
                        "tools": ["vault"],
                        "context": {"mode": "stateful", "state_schema": {"type": "object", "properties": {}}},
                    },
                }
            }
        ),
    )
    rt = runtime(tmp_path, FunctionProvider(model, local=False), tools=[private_vault()])
    result = asyncio.run(rt.run("lead", "Get the token from a fetcher.", agents=agents))
    assert result.status == "done"
    (row,) = [e.data for e in rt.store.events(result.run_id, kinds=["spawn_child_result"])]
    assert row["state"] == {"owner": "ops"} and row["state_withheld"] == ["token"]
    assert not any(SECRET in s for s in seen)  # the parent's model never saw it


@pytest.mark.slow  # `loomrt recall` loads the embedder
@pytest.mark.parametrize("mode", ["recap", "fold"])
def test_a_forks_recall_and_loomrt_recall_show_the_parents_private_result_as_its_placeholder(
    tmp_path, monkeypatch, mode
):
    """The fork's Recall (and recall injection) go through visible_to: the parent's private
    tool result is its placeholder there; `loomrt recall FORK` searches the shared history
    too, and redacts unless --include-private."""
    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path))
    from loomrt.cli.app import app
    from loomrt.record import default_store

    rt, run, _ = play(tmp_path, mode, private_vault())
    fork = asyncio.run(rt.fork(run.run_id))
    hits = fork.toolset.recall.search("vault token 7Q9Z", top_k=5)
    vault_hits = [h for h in hits if h.source == "family" and h.role == "tool"]
    assert vault_hits and all(SECRET not in h.text for h in hits)
    assert "withheld" in vault_hits[0].text
    own = run.toolset.recall.search("vault token 7Q9Z", top_k=5)
    assert any(SECRET in h.text for h in own), "the run that saw it still recalls it"
    rt.store.close()
    assert default_store().path == tmp_path / "record.sqlite"
    cli = CliRunner()
    shown = cli.invoke(app, ["recall", fork.run_id, "vault token 7Q9Z", "--json"]).stdout
    assert json.loads(shown), "the fork's shared history is searched"
    assert SECRET not in shown and "withheld" in shown
    assert SECRET in cli.invoke(app, ["recall", fork.run_id, "vault token 7Q9Z", "--include-private"]).output
    assert SECRET not in cli.invoke(app, ["recall", run.run_id, "vault token 7Q9Z"]).output


def test_an_injected_blocks_query_that_quotes_a_private_result_is_withheld_from_readers() -> None:
    from loomrt.events import Event

    event = Event(
        run_id="r",
        seq=9,
        kind="recall_injected",
        ts=0.0,
        data={"query": f"deploy {SECRET}", "query_seqs": [2, 6], "passages": [], "tokens": 1},
        hash="h",
    )
    (out,) = redact_events([event], {6})
    assert SECRET not in json.dumps(out.data) and "withheld" in out.data["query"]


def stateful_vault_run(tmp_path, monkeypatch):
    """A stateful run that reads the private vault (its observation), copies the token into Σ
    and finishes without ``final`` (its output is Σ), on the default store: (store, run_id)."""
    from loomrt.record import default_store

    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path))
    rt, result = run_stateful(
        tmp_path,
        [
            {"reasoning": "start", "patch": {"owner": "ops"}},
            {"reasoning": "get it", "patch": {"plan": "fetch"}, "action": {"tool": "vault", "arguments": {}}},
            {"reasoning": "keep it", "patch": {"token": SECRET}},
            {"reasoning": "done", "patch": {"status": "deployed"}, "done": True},
        ],
    )
    assert result.status == "done" and SECRET not in json.dumps(result.to_json()), "the output is Σ handed out"
    rt.store.close()
    store = default_store()
    assert store.path == tmp_path / "record.sqlite"
    raw = json.dumps([e.data for e in store.events(result.run_id)])
    kinds = {e.kind for e in store.events(result.run_id) if SECRET in json.dumps(e.data)}
    assert {"tool_result", "distillation", "state_update", "final", "assistant_message"} <= kinds, raw[:300]
    return store, result.run_id


@pytest.mark.slow
def test_every_cli_reader_withholds_a_stateful_runs_private_observation_and_sigma_keys(tmp_path, monkeypatch):
    """Issue 39, items 1 and 4: the observation inline in distillations, Σ's private keys in
    state_update, final, the emit_state arguments and Σ's block: `runs show` (with --seq,
    --as-of and --prompt), `runs events` and `runs export` show none of it unless
    --include-private."""
    from loomrt.cli.app import app

    store, run_id = stateful_vault_run(tmp_path, monkeypatch)
    events = store.events(run_id)
    cli = CliRunner()

    def read(*args: str) -> str:
        done = cli.invoke(app, list(args))
        assert done.exit_code == 0, done.output
        return done.output

    readers = [
        ["runs", "show", run_id, "--full"],
        ["runs", "show", run_id, "--json"],
        ["runs", "events", run_id],
        ["runs", "events", run_id, "--json"],
        ["runs", "events", run_id, "--kind", "distillation", "--json"],  # judged on the whole record
        ["runs", "export", run_id],
        ["runs", "export", run_id, "--format", "jsonl"],
        *(["runs", "show", run_id, "--seq", str(e.seq), "--json"] for e in events),
        *(["runs", "show", run_id, "--as-of", str(e.seq), "--json"] for e in events),
        *(
            ["runs", "show", run_id, "--prompt", str(e.seq), "--json"]
            for e in events
            if e.kind == "model_call" and e.data.get("prompt_from") == "context"
        ),
    ]
    leaked = [" ".join(args[2:]) for args in readers if SECRET in read(*args)]
    assert leaked == []
    assert json.loads(read("runs", "show", run_id, "--json"))["state_withheld"] == ["status", "token"]
    for args in (readers[0], readers[3], readers[6]):
        assert SECRET in read(*args, "--include-private"), args
    tail = [e for e in events if e.kind == "distillation"][-1]
    assert SECRET in read("runs", "show", run_id, "--seq", str(tail.seq), "--include-private")


def test_mcp_get_events_the_events_resource_and_get_run_withhold_a_stateful_runs_private_material(
    tmp_path, monkeypatch
):
    from loomrt.mcp.server import build_server
    from loomrt.mcp.service import RunService
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentsFile

    store, run_id = stateful_vault_run(tmp_path, monkeypatch)
    service = RunService(AgentsFile(agents={}), runtime=Runtime(store))
    page = service.get_events(run_id, 0, 1000)
    assert SECRET not in json.dumps(page) and any(e["data"].get("withheld") == ["token"] for e in page["events"])
    assert SECRET in json.dumps(service.get_events(run_id, 0, 1000, include_private=True))
    late = service.get_events(run_id, len(store.events(run_id)) - 3, 1000)  # a page after the secret arrived
    assert late["events"] and SECRET not in json.dumps(late)
    shown = service.get_run(run_id)
    assert SECRET not in json.dumps(shown) and shown["state_withheld"] == ["status", "token"]
    server = build_server(service)
    resource = asyncio.run(server.read_resource(f"loomrt://runs/{run_id}/events"))
    text = "".join(str(getattr(c, "content", c)) for c in resource)
    assert run_id in text and SECRET not in text


def test_one_function_redacts_every_kind_that_carries_private_material():
    """A private message's tool calls, a cut message's head inline in a distillation, Σ's
    private keys in a distillation's Σ block and a rejected patch: each replaced by provenance."""
    calls = [{"id": "k1", "name": "deploy", "arguments": {"token": SECRET}}]
    observation = {
        "role": "user",
        "content": f"Last observation (vault):\n{SECRET}",
        "seq": 3,
        "synthetic": "observation",
    }
    sigma = {
        "role": "user",
        "content": "Your state Σ:\n" + json.dumps({"token": SECRET, "owner": "ops"}),
        "synthetic": "state",
    }

    def event(at: int, kind: str, **data) -> Event:
        return Event(run_id="r", seq=at, kind=kind, ts=0.0, data=data, hash="")

    events = [
        event(2, "assistant_message", message={"role": "assistant", "content": SECRET, "tool_calls": calls}),
        event(3, "tool_call", **calls[0]),
        event(4, "mark_private", seq=2, by="operator"),
        event(5, "tool_result", tool_call_id="v", name="vault", content=SECRET, private=True),
        event(
            6, "state_update", state={"token": SECRET, "owner": "ops"}, patch={"token": SECRET}, private_keys=["token"]
        ),
        event(7, "patch_rejected", patch={"token": SECRET, "owner": 5}, error="bad", attempt=1),
        event(
            8,
            "distillation",
            mode="stateful",
            span_seqs=[2],
            context=[{"message": {**observation, "seq": 5}}, {"message": sigma}],
            state={"token": SECRET, "owner": "ops"},
            tokens_before=9,
            tokens_after=3,
            pressure=9,
            budget=9,
        ),
        event(
            9, "final", output=json.dumps({"token": SECRET, "owner": "ops"}), state={"token": SECRET, "owner": "ops"}
        ),
    ]
    out = redact_events(events)
    assert [e.seq for e in out if SECRET in json.dumps(e.data)] == []
    assert all(e.data.get("redacted") for e in out if e.kind != "mark_private")
    assert out[-1].data["state"] == {"owner": "ops"} and out[-1].data["withheld"] == ["token"]
    assert "ops" in out[6].data["context"][1]["message"]["content"]
