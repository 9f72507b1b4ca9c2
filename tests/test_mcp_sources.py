"""MCP servers as tool sources: an agent's ``mcp_servers:`` give it their tools, under
provider-safe names, default-deny, started on first use; a server that dies or cannot
start is a tool error and an event, never a failed run."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from loomrt.errors import SpecError
from loomrt.mcp.sources import UNTRUSTED, safe_name
from loomrt.providers.scripted import ScriptedProvider
from loomrt.record.sqlite import default_store
from loomrt.runtime import Runtime
from loomrt.spec_load import load_agents, load_agents_text

TINY = Path(__file__).parent / "data" / "tiny_mcp_server.py"
SAFE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def agent_file(folder: Path, tools: str, command: str = sys.executable, args: str = f"['{TINY}']") -> Path:
    path = folder / "agents.yaml"
    path.write_text(
        "agents:\n  worker:\n    model: scripted/unused.yaml\n"
        f"    mcp_servers:\n      - {{name: tiny, command: '{command}', args: {args}, timeout_s: 20}}\n"
        f"    tools: {tools}\n"
    )
    return path


def play(folder: Path, tools: str, turns: list[dict[str, Any]], **kw: Any) -> tuple[Any, ScriptedProvider]:
    provider = ScriptedProvider(turns=turns)
    rt = Runtime(providers=lambda spec, model: provider)
    defs = load_agents(agent_file(folder, tools, **kw))
    return rt.run_sync("worker", "go", agents=defs), provider


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_call": {"name": name, "arguments": arguments}}


def results(run_id: str) -> list[dict[str, Any]]:
    return [e.data for e in default_store().events(run_id) if e.kind == "tool_result"]


def test_tools_are_offered_under_safe_names_called_and_recorded(tmp_path: Path) -> None:
    result, provider = play(tmp_path, "['tiny.echo']", [call("mcp__tiny__echo", text="hello"), {"text": "done"}])
    assert result.status == "done", result.error
    offered = {t.name: t for t in provider.calls[0].tools}
    assert set(offered) == {"mcp__tiny__echo"}  # default-deny: add, long_report and crash are not offered
    assert offered["mcp__tiny__echo"].description.startswith(UNTRUSTED.format(server="tiny"))
    assert offered["mcp__tiny__echo"].parameters["properties"]["text"]["type"] == "string"
    assert results(result.run_id) == [
        {"tool_call_id": "call_1_0", "name": "mcp__tiny__echo", "content": "echo: hello", "is_error": False}
    ]


def test_a_wildcard_grants_every_tool_and_long_results_are_cut(tmp_path: Path) -> None:
    result, provider = play(
        tmp_path, "['tiny.*']", [call("mcp__tiny__long_report"), call("mcp__tiny__add", a=2, b=3), {"text": "done"}]
    )
    assert {t.name for t in provider.calls[0].tools} == {
        f"mcp__tiny__{n}" for n in ("echo", "add", "long_report", "nap", "crash")
    }
    report, added = results(result.run_id)
    assert report["content"].count("\n") == 1999 and added["content"] == "5"  # the record keeps every word
    sent = provider.calls[1].messages[-1]["content"]  # the working context holds it cut, and says so
    assert "[cut:" in sent and len(sent) < len(report["content"])


def test_a_server_that_crashes_mid_run_is_a_tool_error(tmp_path: Path) -> None:
    result, _ = play(
        tmp_path,
        "['tiny.*']",
        [call("mcp__tiny__crash"), call("mcp__tiny__echo", text="again"), {"text": "done anyway"}],
    )
    assert (result.status, result.output) == ("done", "done anyway")
    crashed, after = results(result.run_id)
    assert crashed["is_error"] and "tiny" in crashed["content"]
    assert after["is_error"] and "not available" in after["content"]  # started again only after a back-off (1 s)
    errors = [e.data for e in default_store().events(result.run_id) if e.kind == "tool_source_error"]
    assert errors and errors[0]["server"] == "tiny" and errors[0]["phase"] == "call"


def test_a_dead_server_is_started_again_after_its_back_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("loomrt.mcp.sources.BACKOFF_S", (0.0,))
    result, _ = play(
        tmp_path, "['tiny.*']", [call("mcp__tiny__crash"), call("mcp__tiny__echo", text="again"), {"text": "done"}]
    )
    crashed, after = results(result.run_id)
    assert crashed["is_error"] and (after["content"], after["is_error"]) == ("echo: again", False)


def test_a_server_that_cannot_start_is_a_tool_error_and_an_event(tmp_path: Path) -> None:
    result, provider = play(
        tmp_path,
        "['tiny.echo']",
        [call("mcp__tiny__echo", text="x"), {"text": "carried on"}],
        command="/nonexistent/mcp-server",
        args="[]",
    )
    assert (result.status, result.output) == ("done", "carried on")
    assert [t.name for t in provider.calls[0].tools] == ["mcp__tiny__echo"]  # named exactly: offered, as an error
    (only,) = results(result.run_id)
    assert only["is_error"] and "could not start" in only["content"]
    kinds = [e.kind for e in default_store().events(result.run_id)]
    assert "tool_source_error" in kinds


def test_inspecting_a_run_starts_no_server(tmp_path: Path) -> None:
    result, _ = play(tmp_path, "['tiny.echo']", [{"text": "no tools needed"}])
    (tmp_path / "unused.yaml").write_text("turns:\n  - text: unused\n")
    run = Runtime().open(result.run_id)
    assert run.toolset.sources and all(s._task is None for s in run.toolset.sources)


def test_safe_names() -> None:
    assert safe_name("gh", "search.code") == "mcp__gh__search_code"
    long = safe_name("a-very-long-server-name-indeed", "a_tool_name_that_goes_on_and_on_and_on_forever")
    assert SAFE.match(long) and len(long) == 64
    assert long == safe_name("a-very-long-server-name-indeed", "a_tool_name_that_goes_on_and_on_and_on_forever")
    assert long != safe_name("a-very-long-server-name-indeed", "a_tool_name_that_goes_on_and_on_and_on_forever2")


@pytest.mark.parametrize(
    "servers, tools, message",
    [
        ("[{name: tiny, command: x}]", "['other.echo']", "names MCP server 'other'"),
        ("[{name: tiny, command: x, url: 'http://127.0.0.1:1/mcp'}]", "[]", "exactly one"),
        ("[{name: 'bad.name', command: x}]", "[]", "must be 1-32"),
        ("[{name: tiny, command: x}, {name: tiny, command: y}]", "[]", "unique"),
        ("[{name: tiny, url: 'ftp://x'}]", "[]", "http://"),
        ("[{name: tiny, command: x}]", "['tiny.']", "SERVER.TOOL"),
    ],
)
def test_mcp_servers_are_validated_at_load_time(servers: str, tools: str, message: str) -> None:
    text = f"agents:\n  w:\n    model: scripted/x.yaml\n    mcp_servers: {servers}\n    tools: {tools}\n"
    with pytest.raises(SpecError) as caught:
        load_agents_text(text, filename="agents.yaml")
    assert message in str(caught.value) and "agents.yaml:" in str(caught.value), str(caught.value)


def test_the_docs_snippets_load() -> None:
    import json

    page = (Path(__file__).parent.parent / "docs" / "mcp.md").read_text(encoding="utf-8")
    snippets = re.findall(r"```yaml\n(.*?)```", page, re.S)
    assert len(snippets) == 2
    for text in snippets:
        (agent,) = load_agents_text(text, filename="docs/mcp.md").agents.values()
        assert agent.mcp_servers and any("." in t for t in agent.tools)
    (config,) = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", page, re.S)]
    assert config["mcpServers"]["loomrt"]["args"][0] == "mcp"


def test_runs_spawned_through_loomrt_mcp_as_a_tool_source_are_children(tmp_path: Path) -> None:
    (tmp_path / "worker.yaml").write_text("turns:\n  - text: worked\n")
    (tmp_path / "boss.yaml").write_text(
        "turns:\n  - tool_call: {name: mcp__loomrt__spawn_run, arguments: {agent: worker, prompt: go}}\n"
        "  - text: boss done\n"
    )
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        "agents:\n  worker: {model: scripted/worker.yaml}\n  boss:\n    model: scripted/boss.yaml\n"
        f"    mcp_servers: [{{name: loomrt, command: '{sys.executable}', args: [-m, loomrt, mcp, --agents, '{agents}']}}]\n"
        "    tools: [loomrt.spawn_run]\n"
    )
    result = Runtime().run_sync("boss", "delegate", agents=load_agents(agents))
    assert result.output == "boss done", result.error
    (row,) = results(result.run_id)
    assert not row["is_error"] and '"output": "worked"' in row["content"].replace("\n", "").replace("  ", " ")
    (child,) = default_store().children(result.run_id)  # recorded in the same record, under its parent
    started = default_store().events(child.run_id)[0].data
    assert (child.agent, child.root_run_id, started["depth"]) == ("worker", result.run_id, 1)


def test_loomrt_mcp_refuses_spawns_past_the_depth_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import json

    from loomrt.mcp.service import RunService, ServiceError

    (tmp_path / "w.yaml").write_text("turns:\n  - text: ok\n")
    (tmp_path / "agents.yaml").write_text("agents:\n  w: {model: scripted/w.yaml}\n")
    monkeypatch.setenv("LOOMRT_SPAWN_LINEAGE", json.dumps({"parent_run_id": "p", "root_run_id": "r", "depth": 4}))
    service = RunService(load_agents(tmp_path / "agents.yaml"))
    with pytest.raises(ServiceError, match="at most 3 deep"):
        asyncio.run(service.spawn("w", "go"))


def test_a_call_past_the_servers_timeout_is_a_tool_error(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(
        "agents:\n  worker:\n    model: scripted/unused.yaml\n"
        f"    mcp_servers:\n      - {{name: tiny, command: '{sys.executable}', args: ['{TINY}'], timeout_s: 1}}\n"
        "    tools: ['tiny.nap']\n"
    )
    provider = ScriptedProvider(
        turns=[call("mcp__tiny__nap", seconds=0.1), call("mcp__tiny__nap", seconds=30), {"text": "done"}]
    )
    result = Runtime(providers=lambda spec, model: provider).run_sync("worker", "go", agents=load_agents(path))
    quick, slow = results(result.run_id)
    assert (quick["content"], quick["is_error"]) == ("slept 0.1", False)
    assert slow["is_error"] and ("longer than 1 s" in slow["content"] or "timed out" in slow["content"].lower()), slow
    assert result.status == "done"


def test_a_streamable_http_server_is_a_tool_source_with_its_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp_kit import agents_folder, http_server

    token = "s" * 40
    (tmp_path / "served").mkdir()
    served = agents_folder(tmp_path / "served")
    with http_server(served, token=token) as base:
        monkeypatch.setenv("REMOTE_TOKEN", token)
        path = tmp_path / "client.yaml"
        path.write_text(
            "agents:\n  caller:\n    model: scripted/unused.yaml\n"
            f"    mcp_servers: [{{name: remote, url: '{base}/mcp', token_env: REMOTE_TOKEN}}]\n"
            "    tools: ['remote.spawn_run']\n"
        )
        provider = ScriptedProvider(
            turns=[call("mcp__remote__spawn_run", agent="quick", prompt="hi"), {"text": "done"}]
        )
        result = Runtime(providers=lambda spec, model: provider).run_sync("caller", "go", agents=load_agents(path))
        (row,) = results(result.run_id)
        assert not row["is_error"] and "quick answer" in row["content"], row
        monkeypatch.setenv("REMOTE_TOKEN", "x" * 40)  # a wrong token: the server refuses, the run goes on
        provider = ScriptedProvider(
            turns=[call("mcp__remote__spawn_run", agent="quick", prompt="hi"), {"text": "went on"}]
        )
        refused = Runtime(providers=lambda spec, model: provider).run_sync("caller", "go", agents=load_agents(path))
        assert refused.output == "went on"
        (row,) = results(refused.run_id)
        assert row["is_error"] and "could not start" in row["content"]
