"""Writing memory by hand (issue 48 item 5): ``loomrt memory add SCOPE "statement"`` and the
MCP tool ``add_memory`` store a statement as written, with its author (operator), so a
later run's Recall finds it, tells it from what a run said (a hit's ``author``; ``source:
"operator"``), and only within the scopes the run is granted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harvest_kit import TALK, chat, harvest_agent, harvest_record
from typer.testing import CliRunner

from loomrt.cli import app
from loomrt.harvest import Consolidator
from loomrt.harvest.scripted import echo_extractor
from loomrt.harvest.wiring import memory_store
from loomrt.record.sqlite import SQLiteStore

WINDOW = "Alice's deploy window is 14:00 to 16:00 UTC on weekdays."


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    yield from harvest_record(request, tmp_path)


@pytest.fixture
def cli(store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("LOOMRT_DB_URL", getattr(store, "url", f"sqlite:{store.path}"))
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "hash")
    return CliRunner()


def test_memory_add_writes_a_fact_a_later_run_recalls_as_the_operators(store: SQLiteStore, cli: CliRunner) -> None:
    added = cli.invoke(app, ["memory", "add", "user:alice", WINDOW, "--json"])
    assert added.exit_code == 0, added.output
    fact = json.loads(added.output)
    assert (fact["outcome"], fact["author"], fact["scope"], fact["statement"]) == (
        "new",
        "operator",
        "user:alice",
        WINDOW,
    )
    again = json.loads(cli.invoke(app, ["memory", "add", "user:alice", WINDOW, "--json"]).output)
    assert (again["outcome"], again["fact_id"]) == ("already", fact["fact_id"])  # stored once
    _, first = chat(store, harvest_agent(), TALK)  # a run's words, extracted: author run
    Consolidator(store, provider=echo_extractor(), embedder="hash", settle_s=0).run_once()
    rt, later = chat(store, harvest_agent(), ["hello"], finish=False)
    recall = rt.open(later).toolset.tools["Recall"].fn
    mixed = [r for r in recall(query="Rosa billing deploy window", top_k=10)["results"] if r["source"] == "memory"]
    assert {r["author"] for r in mixed} == {"operator", "run"}
    mine = recall(query="Rosa billing deploy window", source="operator", top_k=10)["results"]
    assert [(r["text"], r["author"]) for r in mine] == [(WINDOW, "operator")]
    _, bobs = chat(store, harvest_agent(), ["hello"], user="bob", finish=False)
    assert rt.open(bobs).toolset.tools["Recall"].fn(query="deploy window", source="operator")["results"] == []


def test_memory_add_refuses_bad_input_with_one_clear_error(store: SQLiteStore, cli: CliRunner) -> None:
    cases = {
        ("nobody", WINDOW): "KIND:IDENTITY",
        ("user:alice", "short"): "8 to 400 characters",
        ("user:alice", "x" * 401): "8 to 400 characters",
        ("user:alice", "Alice's api_key = sk-abcdefghijklmnopqrstuvwx"): "holds a secret",
    }
    for (scope, statement), message in cases.items():
        bad = cli.invoke(app, ["memory", "add", scope, statement])
        assert bad.exit_code == 2 and message in bad.output and "Traceback" not in bad.output, bad.output
    bad = cli.invoke(app, ["memory", "add", "user:alice", WINDOW, "--class", "gossip"])
    assert bad.exit_code == 2 and "unknown memory class 'gossip'" in bad.output
    assert memory_store(store, "hash").facts() == []


def test_an_operator_statement_with_a_subject_supersedes_the_stored_value(store: SQLiteStore, cli: CliRunner) -> None:
    cli.invoke(app, ["memory", "add", "user:alice", WINDOW, "--subject", "Alice"])
    later = WINDOW.replace("14:00 to 16:00", "17:00 to 19:00")
    moved = json.loads(cli.invoke(app, ["memory", "add", "user:alice", later, "--subject", "Alice", "--json"]).output)
    assert moved["outcome"] == "superseded"
    live = memory_store(store, "hash").facts(["user:alice"])
    assert [f.statement for f in live] == [later]
    shown = cli.invoke(app, ["memory", "show", moved["fact_id"]])
    assert "written by operator" in shown.output


def test_the_service_keeps_a_bound_client_inside_its_users_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MCP tool's logic: a client bound to bob writes user:bob only ("user" names it), as
    ``user:bob`` (not the operator: Recall's ``source: "operator"`` never returns it); an
    unbound client (the operator) writes any scope as the operator; the history says who."""
    from loomrt import Runtime
    from loomrt.mcp.service import CLIENT_USER, RunService, ServiceError
    from loomrt.spec import AgentsFile

    store = SQLiteStore(tmp_path / "record.sqlite")
    service = RunService(AgentsFile.model_validate({"agents": {}}), runtime=Runtime(store, embedder="hash"))
    bound = CLIENT_USER.set("bob")
    try:
        with pytest.raises(ServiceError, match="bound to user 'bob': it may add memory to user:bob only"):
            service.add_memory("user:alice", WINDOW)
        row = service.add_memory("user", "Bob's locker code is 9020.", "fact", "Bob")
        assert (row["scope"], row["author"], row["outcome"]) == ("user:bob", "user:bob", "new")
        with pytest.raises(ServiceError, match="8 to 400 characters"):
            service.add_memory("user", "hi")
    finally:
        CLIENT_USER.reset(bound)
    shop = service.add_memory("project:shop", "The shop closes at 18:00 on Sundays.")
    assert (shop["scope"], shop["author"]) == ("project:shop", "operator")
    assert service.add_memory("user:bob", "Bob's badge number is 7731.")["author"] == "operator"
    history = memory_store(store, "hash").history(row["fact_id"])
    assert history[0]["sources"] == [{"author": "user:bob", "by": "mcp:bob"}]
    rt, bobs = chat(store, harvest_agent(), ["hello"], user="bob", finish=False)
    recall = rt.open(bobs).toolset.tools["Recall"].fn
    said = [(r["text"], r["author"]) for r in recall(query="Bob locker code badge", source="memory")["results"]]
    assert ("Bob's locker code is 9020.", "user:bob") in said
    mine = [(r["text"], r["author"]) for r in recall(query="Bob locker code badge", source="operator")["results"]]
    assert mine == [("Bob's badge number is 7731.", "operator")]
    store.close()


@pytest.mark.slow
def test_the_mcp_tool_adds_memory_a_users_run_recalls_as_the_operators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through `loomrt mcp --http --users FILE` with real clients: every tool name is one an
    MCP client takes; alice's client adds to her memory, not to bob's; her run's recall finds the entry tagged as hers."""
    import re

    import anyio
    from mcp_kit import error_text, http_server, http_session, structured

    (tmp_path / "mem.yaml").write_text("turns:\n  - text: noted\n  - text: noted\n")
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        "agents:\n  mem:\n    model: scripted/mem.yaml\n    context: {mode: compaction, recall: true, memory_scopes: [user]}\n"
    )
    alice = "a" * 40
    (tmp_path / "users").write_text(f"alice {alice}\n")
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "hash")
    with http_server(agents, token="o" * 40, extra=["--users", str(tmp_path / "users")]) as base:

        async def scenario() -> None:
            async with http_session(base, {"authorization": f"Bearer {alice}"}) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                assert "add_memory" in names and all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", n) for n in names)
                row = structured(
                    await client.call_tool(
                        "add_memory", {"scope": "user", "statement": WINDOW, "fact_class": "constraint"}
                    )
                )
                assert (row["scope"], row["class"], row["author"]) == ("user:alice", "constraint", "user:alice")
                refused = error_text(await client.call_tool("add_memory", {"scope": "user:bob", "statement": WINDOW}))
                assert "may add memory to user:alice only" in refused
                run = structured(await client.call_tool("spawn_run", {"agent": "mem", "prompt": "hi"}))["run_id"]
                hits = structured(await client.call_tool("recall", {"run_id": run, "query": "deploy window"}))["hits"]
                assert [(h["text"], h["source"], h["author"], h["scope"]) for h in hits] == [
                    (WINDOW, "memory", "user:alice", "user:alice")
                ]

        anyio.run(scenario)
