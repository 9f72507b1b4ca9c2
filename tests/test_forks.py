"""Forks: a run forked at any seq shares its parent's history without copying it, in every
mode; the coverage invariant after folds in either branch; view, Recall and Grep isolation
between branches; private material of the parent a placeholder; the CLI and MCP faces."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from fold_kit import coverage
from typer.testing import CliRunner

from loomrt.audit import prompt_problems
from loomrt.cli.app import app
from loomrt.recall import HashEmbedder
from loomrt.record.ledger import verify_chain
from loomrt.run.projection import project
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider, scripted_runtime
from loomrt.tools import Tool
from loomrt.visibility import placeholder

WORDS = "alpha beta gamma delta service deploy port config path value cluster node shard queue".split()
SCHEMA = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}}}}


def said(i: int, rng: random.Random) -> str:
    return (
        f"Note {i}: the {rng.choice(WORDS)} {rng.choice(WORDS)} is {rng.randint(1000, 9999)} in /srv/app{i}.conf. "
        + " ".join(rng.choice(WORDS) for _ in range(24))
    )


def fold_spec(**context: Any) -> AgentSpec:
    return AgentSpec(
        model="scripted/fork",
        tools=["vault"],
        context={"mode": "fold", "budget_tokens": 2048, "fold": {"max_calls_per_10min": 10_000}, **context},
    )


def runtime(**kw: Any) -> Runtime:
    provider = ScriptedProvider(turns=[{"text": "ok"}] * 5000, summaries=[{"extractive": 300, "words": 12}])
    vault = Tool("vault", "The token.", {"type": "object", "properties": {}}, lambda: "TOKEN-7Q9Z-SECRET", private=True)
    return scripted_runtime(provider, tools=[vault], **kw)


def messages(store: Any, run_id: str, upto: int | None = None) -> list[int]:
    kinds = ["user_input", "assistant_message", "tool_result"]
    return [e.seq for e in store.events(run_id, kinds=kinds) if upto is None or e.seq <= upto]


def talk(rt: Runtime, run: Any, texts: list[str]) -> None:
    async def go() -> None:
        for text in texts:
            await rt.send(run, text)

    asyncio.run(go())


def test_a_fold_fork_copies_no_text_and_keeps_the_coverage_invariant_in_both_branches(record_store: Any) -> None:
    rng = random.Random(1)
    rt = runtime(store=record_store)
    parent = rt.start(fold_spec(), interactive=True)
    talk(rt, parent, [said(i, rng) for i in range(60)])
    assert parent.view.cards, "the parent has folded"
    at = parent.last_seq - 9
    fork = asyncio.run(rt.fork(parent.run_id, at=at))
    started = rt.store.events(fork.run_id)[0]
    assert started.seq == at + 1 and started.data["forked_from"] == {"run_id": parent.run_id, "seq": at}
    assert "parent_run_id" not in started.data and rt.store.get_run(fork.run_id).forked_from == parent.run_id
    blob = json.dumps(started.data)
    assert not any(c.text in blob for c in parent.view.cards.values()), "no summary text is copied"
    assert sorted(coverage(fork)) == messages(rt.store, parent.run_id, at) and len(set(coverage(fork))) == len(
        coverage(fork)
    )
    before_parent = [m.to_dict() for m in parent.context]
    talk(rt, fork, [said(1000 + i, rng) for i in range(40)])  # the fork folds on its own
    assert fork.distillations > 0
    assert [m.to_dict() for m in project(rt.store.events(parent.run_id), store=rt.store).context] == before_parent
    own = messages(rt.store, fork.run_id)
    assert sorted(coverage(fork)) == messages(rt.store, parent.run_id, at) + own
    before_fork = [m.to_dict() for m in fork.context]
    talk(rt, parent, [said(2000 + i, rng) for i in range(40)])  # and so does the parent
    assert [m.to_dict() for m in project(rt.store.events(fork.run_id), store=rt.store).context] == before_fork
    assert sorted(coverage(parent)) == messages(rt.store, parent.run_id)
    # a fork of the fork, at a seq of its own
    grand = asyncio.run(rt.fork(fork.run_id, at=own[5]))
    assert sorted(coverage(grand)) == messages(rt.store, parent.run_id, at) + own[:6]
    for run_id in (fork.run_id, grand.run_id):
        events = rt.store.events(run_id)
        assert verify_chain(events) == [] and prompt_problems(events, rt.store) == []


def test_recall_and_grep_in_a_fork_never_see_the_other_branch() -> None:
    rng = random.Random(2)
    rt = runtime(embedder=HashEmbedder())
    parent = rt.start(fold_spec(recall=True), interactive=True)
    talk(
        rt, parent, ["Keep notes for me.", "The shared marker is SHARED-ALPHA-41."] + [said(i, rng) for i in range(40)]
    )
    fork = asyncio.run(rt.fork(parent.run_id))
    talk(rt, parent, ["Only the parent says PARENT-LATER-93."] + [said(100 + i, rng) for i in range(40)])
    talk(rt, fork, ["Only the fork says FORK-ONLY-57."] + [said(200 + i, rng) for i in range(40)])
    grep_fork, grep_parent = fork.toolset.tools["Grep"], parent.toolset.tools["Grep"]

    def hits(tool: Any, pattern: str) -> list[str]:
        return [h["snippet"] for h in json.loads(asyncio.run(tool.call({"pattern": pattern, "mode": "text"})))["hits"]]

    assert any("SHARED-ALPHA-41" in h for h in hits(grep_fork, "SHARED-ALPHA-41")), "the shared history is the fork's"
    assert hits(grep_fork, "PARENT-LATER-93") == [] and hits(grep_parent, "FORK-ONLY-57") == []
    assert any("FORK-ONLY-57" in h for h in hits(grep_fork, "FORK-ONLY-57"))

    def recalled(run: Any, query: str) -> str:
        return asyncio.run(run.toolset.tools["Recall"].call({"query": query, "top_k": 10}))

    assert "PARENT-LATER-93" not in recalled(fork, "only the parent says") and "PARENT-LATER-93" in recalled(
        parent, "only the parent says"
    )
    assert "FORK-ONLY-57" not in recalled(parent, "only the fork says") and "FORK-ONLY-57" in recalled(
        fork, "only the fork says"
    )
    assert "SHARED-ALPHA-41" in recalled(fork, "the shared marker")


@pytest.mark.parametrize("mode", ["append", "recap", "compaction", "stateful", "fold"])
def test_a_fork_works_in_every_mode(mode: str) -> None:
    rng = random.Random(3)
    context: dict[str, Any] = {"mode": mode, "budget_tokens": 1024, "keep_last_n": 2}
    if mode == "stateful":
        context["state_schema"] = SCHEMA
    turns = [
        {"emit_state": {"reasoning": "noting", "patch": {"notes": [f"n{i}"]}, "done": True, "final": f"ok {i}"}}
        if mode == "stateful"
        else {"text": f"ok {i}"}
        for i in range(40)
    ]
    rt = scripted_runtime(ScriptedProvider(turns=turns, summaries=[{"extractive": 300}]))
    spec = AgentSpec(model="scripted/every", context={**context, "fold": {"max_calls_per_10min": 10_000}})
    parent = rt.start(spec, interactive=True)
    talk(rt, parent, [said(i, rng) for i in range(12)])
    at = messages(rt.store, parent.run_id)[-5]
    fork = asyncio.run(rt.fork(parent.run_id, at=at))
    as_of = project([e for e in rt.store.events(parent.run_id) if e.seq <= at])
    if mode != "fold":  # the fork replays its parent's record up to the seq
        assert [m.to_dict() for m in fork.context[1:]] == [m.to_dict() for m in as_of.context[1:]]
        assert fork.state == as_of.state
    else:
        assert sorted(coverage(fork)) == messages(rt.store, parent.run_id, at)
    result = asyncio.run(rt.continue_run(fork.run_id, "and from here?"))
    assert result.status == "parked" and result.run_id == fork.run_id
    events = rt.store.events(fork.run_id)
    assert verify_chain(events) == [] and prompt_problems(events, rt.store) == []


def test_the_parents_private_material_is_a_placeholder_in_the_fork() -> None:
    rt = runtime()
    rt2 = Runtime(
        rt.store,
        providers=lambda s, m: ScriptedProvider(
            turns=[{"tool_call": {"name": "vault", "arguments": {}}}, {"text": "got it"}] + [{"text": "ok"}] * 20,
            summaries=[{"extractive": 300}],
        ),
        tools=list(rt.tools.values()),
    )
    parent = rt2.start(fold_spec(), interactive=True)
    talk(rt2, parent, ["fetch the token"])
    (result,) = [e for e in rt.store.events(parent.run_id, kinds=["tool_result"])]
    assert "TOKEN-7Q9Z-SECRET" in json.dumps([m.to_dict() for m in parent.context]), "its own run sees it"
    fork = asyncio.run(rt2.fork(parent.run_id))
    assert "TOKEN-7Q9Z-SECRET" not in json.dumps([m.to_dict() for m in fork.context])
    assert placeholder(result.seq) in json.dumps([m.to_dict() for m in fork.context])
    page = asyncio.run(fork.toolset.tools["Expand"].call({"id": f"#{result.seq}"}))
    assert "TOKEN-7Q9Z-SECRET" not in page and placeholder(result.seq) in page


def test_runs_fork_on_the_cli_and_fork_run_over_mcp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path))
    rt = Runtime(providers=lambda s, m: ScriptedProvider(turns=[{"text": "ok"}] * 10, summaries=["s"]))
    script = tmp_path / "chat.yaml"
    script.write_text("turns:\n  - text: ok\n  - text: ok\n  - text: ok\nsummaries:\n  - s\n")
    parent = rt.start(fold_spec().clone(tools=[], model=f"scripted/{script}"), interactive=True)
    talk(rt, parent, ["hello", "again"])
    out = CliRunner().invoke(app, ["runs", "fork", parent.run_id, "--at", "3", "--json"])
    assert out.exit_code == 0, out.output
    made = json.loads(out.output)
    assert made["forked_from"] == {"run_id": parent.run_id, "seq": 3} and made["mode"] == "fold"
    shown = json.loads(CliRunner().invoke(app, ["runs", "show", made["run_id"], "--json"]).output)
    assert shown["forked_from"] == parent.run_id and shown["fork_seq"] == 3
    assert shown["mode_state"]["pending"] is False and shown["mode_state"]["cards"] == 0
    text = CliRunner().invoke(app, ["runs", "show", made["run_id"]]).output
    assert f"{parent.run_id} at #3" in text and "nothing pending" in text
    bad = CliRunner().invoke(app, ["runs", "fork", parent.run_id, "--at", "999"])
    assert bad.exit_code != 0 and "no seq 999" in bad.output
    from loomrt.mcp.service import RunService
    from loomrt.spec_load import load_agents_text

    service = RunService(load_agents_text("agents: {a: {model: scripted/x}}"), runtime=rt)
    row = asyncio.run(service.fork(parent.run_id, 5))
    assert row["forked_from"] == {"run_id": parent.run_id, "seq": 5} and row["status"] == "parked"
