"""The record cannot be rewritten: INSERT OR REPLACE is refused, and every event carries a
hash chained to the one before it, which `loomrt runs verify` checks."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from spine_kit import runtime, send, write
from typer.testing import CliRunner

from loomrt import RunInfo, SQLiteStore, load_agents
from loomrt.cli import app
from loomrt.record.ledger import verify_chain
from loomrt.testing import ScriptedProvider

runner = CliRunner()


def _store_with_a_run(tmp_path):
    store = SQLiteStore(tmp_path / "record.sqlite")
    store.create_run(RunInfo(run_id="r1", agent="a", def_hash="h", mode="append", model="m"))
    store.append("r1", "run_started", {"mode": "append"})
    store.append("r1", "user_input", {"content": "the real input"})
    store.append("r1", "final", {"output": "done"})
    return store


@pytest.mark.parametrize("verb", ["INSERT OR REPLACE INTO", "REPLACE INTO"])
def test_replace_can_neither_rewrite_an_event_nor_flip_a_status(tmp_path, verb):
    store = _store_with_a_run(tmp_path)
    raw = sqlite3.connect(tmp_path / "record.sqlite")
    with pytest.raises(sqlite3.DatabaseError, match="append-only: an event with this run_id and seq exists"):
        raw.execute(
            f"{verb} events (run_id, seq, kind, ts, data) VALUES ('r1', 2, 'user_input', 0, ?)",
            (json.dumps({"content": "forged"}),),
        )
    with pytest.raises(sqlite3.DatabaseError, match="append-only: an event with this run_id and seq exists"):
        raw.execute(f"{verb} events (run_id, seq, kind, ts, data) VALUES ('r1', 3, 'error', 0, '{{}}')")
    with pytest.raises(sqlite3.DatabaseError, match="append-only: a run with this run_id exists"):
        raw.execute(
            f"{verb} runs (run_id, agent, def_hash, mode, model, interactive, created_at) "
            "VALUES ('r1', 'b', 'h', 'recap', 'm', 0, 0)"
        )
    raw.close()
    assert [e.data.get("content") for e in store.events("r1")] == [None, "the real input", None]
    assert store.get_run("r1").status == "done" and store.get_run("r1").agent == "a"


def test_every_event_is_chained_and_a_clean_record_verifies(tmp_path):
    store = _store_with_a_run(tmp_path)
    events = store.events("r1")
    assert all(e.hash and len(e.hash) == 64 for e in events)
    assert len({e.hash for e in events}) == 3
    assert verify_chain(events) == []


def test_an_edit_made_around_the_triggers_is_detected(tmp_path):
    _store_with_a_run(tmp_path).close()
    forged = tmp_path / "forged.sqlite"
    shutil.copy(tmp_path / "record.sqlite", forged)
    raw = sqlite3.connect(forged)
    raw.execute("DROP TRIGGER events_no_update")
    raw.execute("UPDATE events SET data = ? WHERE run_id = 'r1' AND seq = 2", (json.dumps({"content": "forged"}),))
    raw.commit()
    raw.close()
    problems = verify_chain(SQLiteStore(forged).events("r1"))
    assert problems == ["seq 2 (user_input): hash does not match its content or the event before it"]


def test_a_missing_seq_is_detected(tmp_path):
    store = _store_with_a_run(tmp_path)
    events = store.events("r1")
    problems = verify_chain([events[0], events[2]])
    assert problems[0] == "seq 3: expected seq 2 (seqs must be dense from 1)"


def test_runs_verify_from_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path / "home"))
    write(tmp_path, "s.yaml", "turns: [{text: done}]\n")
    agents = write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml}\n")
    ran = runner.invoke(app, ["run", "a", "go", "--agents", str(agents), "--json"])
    run_id = json.loads(ran.stdout)["run_id"]
    ok = runner.invoke(app, ["runs", "verify", run_id])
    assert ok.exit_code == 0 and "audits clean" in ok.stdout
    as_json = json.loads(runner.invoke(app, ["runs", "verify", run_id, "--json"]).stdout)
    assert as_json["clean"] is True and as_json["events"] >= 4 and as_json["problems"] == []


def test_a_runs_record_through_the_runtime_is_chained(tmp_path):
    write(tmp_path, "s.yaml", "turns: []\n")
    agents = load_agents(write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml, tools: [calculate]}\n"))
    provider = ScriptedProvider([{"tool_call": {"name": "calculate", "arguments": {"expression": "2+2"}}}, "4"])
    rt = runtime(tmp_path, provider)
    run = rt.start("a", agents=agents)
    assert send(rt, run, "add").output == "4"
    assert verify_chain(rt.store.events(run.run_id)) == []
