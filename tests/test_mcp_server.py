"""`loomrt mcp`, tried with the SDK's real client: over stdio and streamable HTTP against
the server started as a subprocess, and in-process for recall (with a hash embedder)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp_kit import agents_folder, error_text, http_server, http_session, server_env, stdio_session, structured

from loomrt.mcp.server import build_server
from loomrt.mcp.service import RunService
from loomrt.recall.embedders import HashEmbedder
from loomrt.record.sqlite import default_store
from loomrt.runtime import Runtime
from loomrt.spec_load import load_agents

TOKEN = "t" * 40
TOOLS = {
    "list_agents",
    "spawn_run",
    "spawn_runs",
    "get_run",
    "list_runs",
    "get_events",
    "continue_run",
    "cancel_run",
    "compact_run",
    "fork_run",
    "recall",
    "add_memory",
}


def kinds(run_id: str) -> list[str]:
    return [e.kind for e in default_store().events(run_id)]


async def until(session: Any, run_id: str, status: str, within_s: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while True:
        run = structured(await session.call_tool("get_run", {"run_id": run_id}))
        if run["status"] == status or time.monotonic() > deadline:
            return run
        await asyncio.sleep(0.1)


def test_stdio_spawn_wait_fan_out_page_continue_and_resources(tmp_path: Path) -> None:
    agents = agents_folder(tmp_path)

    async def scenario() -> None:
        async with stdio_session(agents) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == TOOLS
            assert all(t.description and t.output_schema for t in tools.values())
            listed = structured(await s.call_tool("list_agents", {}))["agents"]
            assert {a["name"] for a in listed} == {"quick", "slow", "hang", "calc"}

            done = structured(await s.call_tool("spawn_run", {"agent": "quick", "prompt": "hi"}))
            assert (done["status"], done["output"]) == ("done", "quick answer")
            assert set(done) >= {"run_id", "agent", "mode", "status", "output", "state", "usage", "distillations"}

            later = structured(await s.call_tool("spawn_run", {"agent": "slow", "prompt": "hi", "wait": False}))
            assert later["status"] == "running"
            assert (await until(s, later["run_id"], "done"))["output"] == "slow answer"

            started = time.monotonic()
            rows = structured(
                await s.call_tool(
                    "spawn_runs", {"spawns": [{"agent": "slow", "prompt": f"task {i}"} for i in range(4)]}
                )
            )["runs"]
            elapsed = time.monotonic() - started
            assert [r["index"] for r in rows] == [0, 1, 2, 3] and all(r["ok"] and r["status"] == "ok" for r in rows)
            spans = [
                (default_store().events(r["run_id"])[0].ts, default_store().events(r["run_id"])[-1].ts) for r in rows
            ]
            assert max(start for start, _ in spans) < min(end for _, end in spans)  # all four were playing at once
            assert elapsed < 4 * 0.8

            full = default_store().events(done["run_id"])
            first = structured(await s.call_tool("get_events", {"run_id": done["run_id"], "limit": 2}))
            assert [e["seq"] for e in first["events"]] == [1, 2] and first["next_seq"] == 2
            rest = structured(
                await s.call_tool("get_events", {"run_id": done["run_id"], "after_seq": first["next_seq"]})
            )
            assert rest["next_seq"] is None
            assert [e["seq"] for e in first["events"] + rest["events"]] == [e.seq for e in full]

            again = structured(await s.call_tool("continue_run", {"run_id": done["run_id"], "prompt": "more"}))
            assert (again["run_id"], again["output"]) == (done["run_id"], "second answer")

            uris = {str(r.uri) for r in (await s.list_resources()).resources}
            assert {f"loomrt://runs/{done['run_id']}", f"loomrt://runs/{done['run_id']}/events"} <= uris
            shown = json.loads((await s.read_resource(f"loomrt://runs/{done['run_id']}")).contents[0].text)
            assert (shown["run_id"], shown["output"]) == (done["run_id"], "second answer")
            page = json.loads((await s.read_resource(f"loomrt://runs/{done['run_id']}/events")).contents[0].text)
            assert [e["seq"] for e in page["events"]] == [e.seq for e in default_store().events(done["run_id"])]

    anyio.run(scenario)


def test_timeouts_and_cancellation(tmp_path: Path) -> None:
    agents = agents_folder(tmp_path)

    async def scenario() -> None:
        async with stdio_session(agents) as s:
            waited = structured(await s.call_tool("spawn_run", {"agent": "hang", "prompt": "hi", "timeout_s": 0.3}))
            assert waited["status"] == "running"  # the wait ended, the run did not
            assert structured(await s.call_tool("get_run", {"run_id": waited["run_id"]}))["status"] == "running"
            cancelled = structured(await s.call_tool("cancel_run", {"run_id": waited["run_id"]}))
            assert cancelled["status"] == "cancelled"
            assert structured(await s.call_tool("cancel_run", {"run_id": waited["run_id"]}))["status"] == "cancelled"
            assert kinds(waited["run_id"]).count("cancelled") == 1

            finished = structured(await s.call_tool("spawn_run", {"agent": "quick", "prompt": "hi"}))
            assert structured(await s.call_tool("cancel_run", {"run_id": finished["run_id"]}))["status"] == "done"
            assert "cancelled" not in kinds(finished["run_id"])

            with anyio.move_on_after(0.5):  # the client gives up on its request: the run stops with it
                await s.call_tool("spawn_run", {"agent": "hang", "prompt": "abandoned"})
            runs = structured(await s.call_tool("list_runs", {"agent": "hang"}))["runs"]
            abandoned = next(r for r in runs if r["run_id"] != waited["run_id"])
            row = await until(s, abandoned["run_id"], "cancelled", within_s=5)
            assert row["status"] == "cancelled"
            reason = next(
                e.data["reason"] for e in default_store().events(abandoned["run_id"]) if e.kind == "cancelled"
            )
            assert "client cancelled" in reason

    anyio.run(scenario)


def test_context_overrides_narrow_never_widen(tmp_path: Path) -> None:
    agents = agents_folder(tmp_path)

    async def scenario() -> None:
        async with stdio_session(agents) as s:
            run = structured(
                await s.call_tool(
                    "spawn_run",
                    {"agent": "calc", "prompt": "6*7?", "context": {"mode": "append", "budget_tokens": 2048}},
                )
            )
            started = default_store().events(run["run_id"])[0].data
            assert (started["mode"], started["definition"]["context"]["budget_tokens"]) == ("append", 2048)
            assert load_agents(agents).agents["calc"].context.mode == "compaction"  # the definition is untouched
            for context, field in [
                ({"budget_tokens": 99999}, "context.budget_tokens"),
                ({"recall": True}, "context.recall"),
                ({"state_schema": {"type": "object"}}, "context.state_schema"),
                ({"summarizer_model": "openai/gpt-4o"}, "context.summarizer_model"),
                ({"no_such_field": 1}, "context.no_such_field"),
            ]:
                message = error_text(
                    await s.call_tool("spawn_run", {"agent": "calc", "prompt": "x", "context": context})
                )
                assert field in message, message

    anyio.run(scenario)


def test_compact_a_parked_run(tmp_path: Path) -> None:
    agents = agents_folder(tmp_path)
    rt = Runtime()
    run = rt.start("calc", agents=load_agents(agents), interactive=True, overrides={"context": {"keep_last_n": 1}})
    for text in ("what is 6*7?", "and is it still 42 tomorrow?"):
        assert asyncio.run(rt.send(run, text)).status == "parked"

    async def scenario() -> None:
        async with stdio_session(agents) as s:
            out = structured(await s.call_tool("compact_run", {"run_id": run.run_id}))
            assert out["distilled"] and out["tokens_after"] < out["tokens_before"], out
            quick = structured(await s.call_tool("spawn_run", {"agent": "quick", "prompt": "hi"}))
            declined = structured(await s.call_tool("compact_run", {"run_id": quick["run_id"]}))
            assert not declined["distilled"] and "append" in declined["reason"]

    anyio.run(scenario)
    assert kinds(run.run_id)[-1] == "distillation"
    assert Runtime().open(run.run_id).view.status == "parked"  # compacting changes the context, not the status


def test_bad_arguments_are_tool_errors_and_the_server_keeps_serving(tmp_path: Path) -> None:
    agents = agents_folder(tmp_path)

    async def scenario() -> None:
        async with stdio_session(agents) as s:
            assert "no agent named 'nope'" in error_text(
                await s.call_tool("spawn_run", {"agent": "nope", "prompt": "x"})
            )
            for tool, args in [
                ("get_run", {}),
                ("get_events", {}),
                ("cancel_run", {}),
                ("compact_run", {}),
                ("continue_run", {"prompt": "x"}),
            ]:
                assert "no run" in error_text(await s.call_tool(tool, {"run_id": "feedfacecafe", **args})).lower()
            assert "spawn_run" in error_text(await s.call_tool("spawn_run", {"agent": 3, "prompt": ["no"]}))
            assert "over the limit" in error_text(
                await s.call_tool("spawn_run", {"agent": "quick", "prompt": "x" * 1_000_001})
            )
            assert "limit must be" in error_text(await s.call_tool("get_events", {"run_id": "x", "limit": 5000}))
            for tool, args in [  # integers past what a seq can be are refused by the argument check
                ("get_events", {"after_seq": 2**63}),
                ("fork_run", {"at_seq": 2**64}),
                ("recall", {"query": "x", "top_k": 10**30}),
            ]:
                assert "less than or equal" in error_text(await s.call_tool(tool, {"run_id": "x", **args}))
            before = len(default_store().list_runs(limit=100))
            bad = [
                {"agent": "quick", "prompt": "a"},
                {"agent": "quick", "prompt": "b"},
                {"agent": "ghost", "prompt": "c"},
            ]
            assert "spawns[2]" in error_text(await s.call_tool("spawn_runs", {"spawns": bad}))
            assert len(default_store().list_runs(limit=100)) == before  # one bad entry: no run started
            assert "1 to 32" in error_text(await s.call_tool("spawn_runs", {"spawns": []}))
            assert "recall off" in error_text(
                await s.call_tool(
                    "recall",
                    {
                        "run_id": structured(await s.call_tool("spawn_run", {"agent": "quick", "prompt": "x"}))[
                            "run_id"
                        ],
                        "query": "q",
                    },
                )
            )
            assert (
                structured(await s.call_tool("spawn_run", {"agent": "quick", "prompt": "still here?"}))["status"]
                == "done"
            )

    anyio.run(scenario)


def test_progress_notifications_at_most_once_a_second(tmp_path: Path) -> None:
    agents = agents_folder(tmp_path)
    (tmp_path / "steps.yaml").write_text(
        "turns:\n"
        + "".join(
            f"  - {{tool_call: {{name: calculate, arguments: {{expression: '1+{i}'}}}}, delay_s: 0.5}}\n"
            for i in range(5)
        )
        + "  - text: finished\n"
    )
    agents.write_text(agents.read_text() + "  steps:\n    model: scripted/steps.yaml\n    tools: [calculate]\n")
    heard: list[tuple[float, float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        heard.append((time.monotonic(), value, message))

    async def scenario() -> None:
        async with stdio_session(agents) as s:
            out = structured(
                await s.call_tool("spawn_run", {"agent": "steps", "prompt": "go"}, progress_callback=progress)
            )
            assert out["output"] == "finished"

    anyio.run(scenario)
    assert heard and "tool calls" in (heard[-1][2] or "")
    assert [v for _, v, _ in heard] == sorted(v for _, v, _ in heard)
    gaps = [b[0] - a[0] for a, b in zip(heard, heard[1:], strict=False)]
    assert all(g > 0.8 for g in gaps), gaps  # at most one a second (with the transport's jitter)


def test_recall_reads_only_that_run(tmp_path: Path) -> None:
    (tmp_path / "mem.yaml").write_text(
        "turns:\n  - text: noted\n  - text: noted again\n  - text: done\nsummaries:\n  - {extractive: 200, words: 6}\n"
    )
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        "agents:\n  mem:\n    model: scripted/mem.yaml\n"
        "    context: {mode: compaction, recall: true, keep_last_n: 1, keep_first: false}\n"
    )
    defs = load_agents(agents)
    rt = Runtime(embedder=HashEmbedder())
    service = RunService(defs, agents_file=str(agents), runtime=rt)
    run = rt.start("mem", agents=defs, interactive=True)
    other = rt.start("mem", agents=defs, interactive=True)
    filler = " It was a long week of migrations, reviews and meetings about the release plan." * 6
    for text in ("The staging database listens on port 6543.", "The build server is called hopper."):
        asyncio.run(rt.send(run, text + filler))
    for text in ("The staging database listens on port 1111.", "The cache is warm."):
        asyncio.run(rt.send(other, text + filler))
    for r in (run, other):
        assert asyncio.run(rt.compact(r.run_id))["distilled"]

    async def scenario() -> None:
        async with Client(build_server(service)) as client:
            hits = structured(
                await client.call_tool("recall", {"run_id": run.run_id, "query": "staging database port"})
            )["hits"]
            assert hits and "6543" in hits[0]["text"]
            assert not any("1111" in h["text"] for h in hits)

    anyio.run(scenario)


def test_http_refuses_before_any_tool_runs(tmp_path: Path) -> None:
    agents = agents_folder(tmp_path)
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "spawn_run", "arguments": {"agent": "quick", "prompt": "hi"}},
    }
    with http_server(agents, token=TOKEN) as base:

        def post(headers: dict[str, str]) -> int:
            headers = {"accept": "application/json, text/event-stream", "content-type": "application/json", **headers}
            return httpx2.post(f"{base}/mcp", json=call, headers=headers).status_code

        assert post({}) == 401
        assert post({"authorization": "Bearer " + "x" * 40}) == 401
        assert post({"authorization": f"Bearer {TOKEN}", "origin": "http://evil.example"}) == 403
        assert post({"authorization": f"Bearer {TOKEN}", "host": "evil.example:80"}) == 421
        assert default_store().list_runs(limit=10) == []  # nothing refused reached a tool

        async def scenario() -> None:
            async with http_session(base, {"authorization": f"Bearer {TOKEN}"}) as s:
                assert set(t.name for t in (await s.list_tools()).tools) == TOOLS
                done = structured(await s.call_tool("spawn_run", {"agent": "quick", "prompt": "hi"}))
                assert done["output"] == "quick answer"

        anyio.run(scenario)


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--host", "0.0.0.0"], {}, "without a token"),
        ([], {"LOOMRT_MCP_TOKEN": "short"}, "at least 32"),
    ],
)
def test_http_refuses_to_start_exposed(tmp_path: Path, args: list[str], env: dict[str, str], message: str) -> None:
    agents = agents_folder(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "loomrt", "mcp", "--http", "--agents", str(agents), *args],
        env={**server_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_guard_checks_host_on_the_loopback_and_the_token_everywhere() -> None:
    from loomrt.mcp.http import Guard, allowed_origins

    local = Guard(None, host="127.0.0.1", port=8765, token=TOKEN, origins=allowed_origins("127.0.0.1", 8765))
    ok = {"host": "127.0.0.1:8765", "authorization": f"Bearer {TOKEN}"}
    assert local.refusal(ok) is None
    assert local.refusal({**ok, "host": "attacker.example:8765"})[0] == 421  # type: ignore[index]
    assert local.refusal({**ok, "origin": "http://localhost:8765"}) is None
    assert local.refusal({**ok, "origin": "http://attacker.example"})[0] == 403  # type: ignore[index]
    assert local.refusal({"host": "127.0.0.1:8765", "authorization": "Bearer " + TOKEN[:-1]})[0] == 401  # type: ignore[index]
    exposed = Guard(None, host="0.0.0.0", port=8765, token=TOKEN, origins=allowed_origins("0.0.0.0", 8765))
    assert exposed.refusal({"host": "10.1.2.3:8765", "authorization": f"Bearer {TOKEN}"}) is None
    assert exposed.refusal({"host": "10.1.2.3:8765"})[0] == 401  # type: ignore[index]


def test_the_help_lists_every_tool() -> None:
    """`loomrt mcp --help` names each tool the server offers (it named 8 of 11)."""
    from typer.testing import CliRunner

    from loomrt.cli.app import app

    shown = CliRunner().invoke(app, ["mcp", "--help"], terminal_width=200).stdout
    assert [name for name in sorted(TOOLS) if name not in shown] == []
