"""`loomrt mcp --http --users FILE`: a token bound to a user, tried with two real MCP
clients against the server as a subprocess. Each client's runs work for its user, and it
sees only its own user's durable memory and runs (issue 46)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_kit import error_text, http_server, http_session, structured

from loomrt.errors import SpecError
from loomrt.harvest.backends import memory_of
from loomrt.harvest.db import harvest_db, release
from loomrt.mcp.http import Guard, read_user_tokens
from loomrt.record.sqlite import default_store

ALICE, BOB, OPERATOR = "a" * 40, "b" * 40, "o" * 40

AGENTS = """\
agents:
  mem:
    model: scripted/mem.yaml
    context: {mode: compaction, recall: true, memory_scopes: [user]}
"""


def _seed_memory() -> None:
    """One fact in each user's scope, in the durable memory beside the record the server uses."""
    store = default_store()
    try:
        memory_of(harvest_db(store), embedder=False).import_facts(
            [
                ("user:alice", "The locker code of the gym is 4417."),
                ("user:bob", "The locker code of the gym is 9020."),
            ]
        )
        release(store)
    finally:
        store.close()


@pytest.mark.slow
def test_each_client_sees_only_its_users_runs_and_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mem.yaml").write_text("turns:\n  - text: noted\n  - text: noted\n  - text: noted\n")
    agents = tmp_path / "agents.yaml"
    agents.write_text(AGENTS)
    users = tmp_path / "users"
    users.write_text(f"# who may call\nalice {ALICE}\nbob {BOB}\n")
    monkeypatch.setenv("LOOMRT_USER", "operator")  # what an unbound spawn would work for
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "hash")
    _seed_memory()

    with http_server(agents, token=OPERATOR, extra=["--users", str(users)]) as base:

        async def scenario() -> None:
            async with (
                http_session(base, {"authorization": f"Bearer {ALICE}"}) as alice,
                http_session(base, {"authorization": f"Bearer {BOB}"}) as bob,
                http_session(base, {"authorization": f"Bearer {OPERATOR}"}) as operator,
            ):
                runs = {}
                for name, client in (("alice", alice), ("bob", bob)):
                    runs[name] = structured(await client.call_tool("spawn_run", {"agent": "mem", "prompt": "hi"}))[
                        "run_id"
                    ]
                for name, client, code, other in (("alice", alice, "4417", "9020"), ("bob", bob, "9020", "4417")):
                    hits = structured(
                        await client.call_tool("recall", {"run_id": runs[name], "query": "gym locker code"})
                    )["hits"]
                    texts = " ".join(h["text"] for h in hits)
                    assert code in texts and other not in texts, (name, hits)
                    listed = structured(await client.call_tool("list_runs", {}))["runs"]
                    assert [r["run_id"] for r in listed] == [runs[name]]
                # bob names alice's run: as if it were not there, for every tool that reads a run
                for tool in ("recall", "get_run", "get_events", "continue_run", "fork_run"):
                    args: dict[str, Any] = {"run_id": runs["alice"]}
                    args.update(
                        {"recall": {"query": "gym locker code"}, "continue_run": {"prompt": "hi"}}.get(tool, {})
                    )
                    assert f"no run {runs['alice']} for this client" in error_text(await bob.call_tool(tool, args))
                # alice's own fork works for alice too (a fork inherits its run's user)
                fork = structured(await alice.call_tool("fork_run", {"run_id": runs["alice"]}))["run_id"]
                assert structured(await alice.call_tool("get_run", {"run_id": fork}))["run_id"] == fork
                assert f"no run {fork} for this client" in error_text(await bob.call_tool("get_run", {"run_id": fork}))
                resources = [str(r.uri) for r in (await bob.list_resources()).resources]
                assert not any(runs["alice"] in uri for uri in resources) and any(runs["bob"] in u for u in resources)
                # the operator's token is bound to no user: it reads every run
                listed = structured(await operator.call_tool("list_runs", {}))["runs"]
                assert {r["run_id"] for r in listed} == {*runs.values(), fork}

        anyio.run(scenario)
    store = default_store()
    users_on_record = sorted(store.latest(r.run_id, "run_started").data.get("user") for r in store.list_runs(limit=9))  # type: ignore[union-attr]
    assert users_on_record == ["alice", "alice", "bob"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("alice\n", "expected USER TOKEN"),
        (f"alice {'x' * 10}\n", "at least 32"),
        (f"alice {ALICE}\nbob {ALICE}\n", "also alice's"),
        (f"al/ice {ALICE}\n", "not a valid identity"),
        ("# nobody\n", "names no user"),
    ],
)
def test_a_bad_users_file_is_one_error_naming_the_line(tmp_path: Path, text: str, message: str) -> None:
    users = tmp_path / "users"
    users.write_text(text)
    with pytest.raises(SpecError, match=message):
        read_user_tokens(users)


def test_the_guard_names_the_tokens_user_and_none_for_the_operator() -> None:
    guard = Guard(None, host="127.0.0.1", port=1, token=OPERATOR, origins=set(), users={ALICE: "alice"})
    ok = {"host": "127.0.0.1:1"}
    assert guard.user_of({**ok, "authorization": f"Bearer {ALICE}"}) == "alice"
    assert guard.user_of({**ok, "authorization": f"Bearer {OPERATOR}"}) is None
    assert guard.refusal({**ok, "authorization": f"Bearer {BOB}"})[0] == 401  # type: ignore[index]
    assert guard.refusal({**ok, "authorization": f"Bearer {ALICE}"}) is None
