"""The CLI through typer's CliRunner and a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loomrt.cli.app import app

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


def invoke(*args: str, input: str | None = None):  # noqa: A002
    return runner.invoke(app, list(args), input=input, catch_exceptions=False)


def write(tmp_path: Path, text: str, name: str = "agents.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


SCRIPTED = """
agents:
  calc:
    model: scripted/calc.yaml
    system_prompt: You add numbers.
    tools: [calculate]
"""
SCRIPT = """
turns:
  - tool_call: {name: calculate, arguments: {expression: "19 + 23"}}
  - text: "19 + 23 = 42"
"""


@pytest.fixture
def calc_agents(tmp_path: Path) -> Path:
    write(tmp_path, SCRIPT, "calc.yaml")
    return write(tmp_path, SCRIPTED)


def test_run_json_prints_exactly_one_object(calc_agents: Path) -> None:
    result = invoke("run", "calc", "add them", "--agents", str(calc_agents), "--json")
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert set(obj) == {"run_id", "agent", "mode", "status", "output", "state", "usage", "distillations"}
    assert obj["output"] == "19 + 23 = 42" and obj["status"] == "done" and obj["mode"] == "append"
    assert obj["usage"]["model_calls"] == 2 and obj["usage"]["input_tokens"] > 0


def test_run_renders_events_and_prints_answer(calc_agents: Path) -> None:
    result = invoke("run", "calc", "add them", "--agents", str(calc_agents))
    assert result.exit_code == 0
    assert result.stdout.strip().endswith("19 + 23 = 42")
    assert "tool call calculate" in result.stderr and "final" in result.stderr


def test_runs_list_show_events(calc_agents: Path) -> None:
    run_id = json.loads(invoke("run", "calc", "x", "--agents", str(calc_agents), "--json").stdout)["run_id"]
    listed = json.loads(invoke("runs", "list", "--json").stdout)
    assert [r["run_id"] for r in listed] == [run_id] and listed[0]["status"] == "done"
    shown = json.loads(invoke("runs", "show", run_id, "--json").stdout)
    assert shown["output"] == "19 + 23 = 42" and shown["usage"]["model_calls"] == 2
    lines = invoke("runs", "events", run_id, "--json").stdout.strip().splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds[0] == "run_started" and kinds[-1] == "final" and "tool_result" in kinds
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, len(lines) + 1))
    assert "tool_result" in invoke("runs", "events", run_id).stdout


def test_unknown_run_is_one_clear_line() -> None:
    result = invoke("runs", "show", "nope")
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: no run 'nope'") and "Traceback" not in result.output


def test_bad_mode_error_names_file_line_and_key(tmp_path: Path) -> None:
    p = write(tmp_path, "agents:\n  triage:\n    model: local/x\n    context:\n      mode: stateful2\n")
    result = invoke("agents", "validate", str(p))
    assert result.exit_code == 2
    assert (
        f"{p}:5:13: agents.triage.context.mode: 'stateful2' is not one of append, recap, stateful, compaction, fold, auto"
        in result.stderr
    )


def test_unknown_agent_and_missing_file(calc_agents: Path, tmp_path: Path) -> None:
    result = invoke("run", "nobody", "x", "--agents", str(calc_agents))
    assert result.exit_code == 2 and "no agent named 'nobody'" in result.stderr and "calc" in result.stderr
    result = invoke("run", "calc", "x", "--agents", str(tmp_path / "missing.yaml"))
    assert result.exit_code == 2 and "no such agents file" in result.stderr


def test_failed_run_exits_1_and_stays_resumable(tmp_path: Path) -> None:
    write(tmp_path, "turns:\n  - tool_call: {name: calculate, arguments: {expression: '1+1'}}\n", "short.yaml")
    p = write(tmp_path, "agents:\n  a:\n    model: scripted/short.yaml\n    tools: [calculate]\n")
    result = invoke("run", "a", "go", "--agents", str(p), "--json")
    assert result.exit_code == 1
    obj = json.loads(result.stdout)
    assert obj["status"] == "failed" and "short.yaml" in obj["error"] and "has 1 turns" in obj["error"]
    # more turns arrive in the script: resume picks up from the record
    (tmp_path / "short.yaml").write_text(
        "turns:\n  - tool_call: {name: calculate, arguments: {expression: '1+1'}}\n  - text: two\n"
    )
    resumed = invoke("runs", "resume", obj["run_id"], "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["output"] == "two"


def test_chat_json_one_object_per_stdin_line(tmp_path: Path) -> None:
    write(tmp_path, "turns:\n  - text: hello\n  - text: again\n", "chat.yaml")
    p = write(tmp_path, "agents:\n  c:\n    model: scripted/chat.yaml\n    context: {mode: auto}\n")
    result = invoke("chat", "c", "--agents", str(p), "--json", input="hi\n\nhi again\n")
    assert result.exit_code == 0, result.output
    turns = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [t["output"] for t in turns] == ["hello", "again"]
    assert {t["status"] for t in turns} == {"parked"} and turns[0]["mode"] == "recap"
    assert turns[0]["run_id"] == turns[1]["run_id"]
    shown = json.loads(invoke("runs", "show", turns[0]["run_id"], "--json").stdout)
    assert shown["status"] == "done" and shown["interactive"] is True


def test_a_failed_turn_never_ends_the_chat(tmp_path: Path) -> None:
    # the script has one reply: the second and third turns fail (it ran out), and the chat goes on
    write(tmp_path, "turns:\n  - text: hello\n", "chat.yaml")
    p = write(tmp_path, "agents:\n  c:\n    model: scripted/chat.yaml\n")
    result = invoke("chat", "c", "--agents", str(p), "--json", input="one\ntwo\nthree\n")
    turns = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [t["status"] for t in turns] == ["parked", "failed", "failed"]
    assert "chat.yaml" in turns[1]["error"]  # the error names the script
    assert result.exit_code == 1  # a turn failed; the chat still read every line
    shown = json.loads(invoke("runs", "show", turns[0]["run_id"], "--json").stdout)
    assert shown["status"] == "done"
    kinds = [
        json.loads(line)["kind"] for line in invoke("runs", "events", turns[0]["run_id"], "--json").stdout.splitlines()
    ]
    assert kinds.count("user_input") == 3 and kinds.count("error") == 2


def test_runs_list_never_cuts_a_run_id(tmp_path: Path) -> None:
    write(tmp_path, "turns:\n  - text: ok\n", "s.yaml")
    p = write(tmp_path, "agents:\n  a-long-agent-name-for-a-narrow-terminal:\n    model: scripted/s.yaml\n")
    run_id = json.loads(
        invoke("run", "a-long-agent-name-for-a-narrow-terminal", "go", "--agents", str(p), "--json").stdout
    )["run_id"]
    listed = invoke("runs", "list")
    assert listed.exit_code == 0 and run_id in listed.stdout


def test_continue_adds_a_turn(tmp_path: Path) -> None:
    write(tmp_path, "turns:\n  - text: one\n  - text: two\n", "s.yaml")
    p = write(tmp_path, "agents:\n  a:\n    model: scripted/s.yaml\n")
    run_id = json.loads(invoke("run", "a", "first", "--agents", str(p), "--json").stdout)["run_id"]
    result = invoke("runs", "continue", run_id, "second", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["output"] == "two"
    events = [
        json.loads(x) for x in invoke("runs", "events", run_id, "--json", "--kind", "user_input").stdout.splitlines()
    ]
    assert [e["data"]["content"] for e in events] == ["first", "second"]


def test_agents_list_schema_and_mode_override(calc_agents: Path) -> None:
    rows = json.loads(invoke("agents", "list", "--agents", str(calc_agents), "--json").stdout)
    assert rows[0]["name"] == "calc" and len(rows[0]["hash"]) == 16
    schema = json.loads(invoke("agents", "schema").stdout)
    assert schema["title"] == "loomrt agents file" and "agents" in schema["properties"]
    result = invoke("run", "calc", "x", "--agents", str(calc_agents), "--mode", "recap", "--json")
    assert json.loads(result.stdout)["mode"] == "recap"
    bad = invoke("run", "calc", "x", "--agents", str(calc_agents), "--mode", "stateful")
    assert bad.exit_code == 2 and "state_schema" in bad.stderr


def test_version_and_promote_keep_the_rest_of_the_file(tmp_path: Path) -> None:
    text = (
        "# top comment\nagents:\n  # the triage agent\n  triage:\n    model: local/x\n"
        "    context:\n      mode: stateful\n      state_schema: {type: object, properties: {a: {type: string}}}\n"
        "  other:\n    model: local/y  # keep me\n"
    )
    p = write(tmp_path, text)
    schema = write(
        tmp_path, json.dumps({"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}), "s.json"
    )
    forked = json.loads(
        invoke("agents", "version", "triage", "--state-schema", str(schema), "--agents", str(p), "--json").stdout
    )
    assert forked["agent"] == "triage@2"
    after = p.read_text()
    assert "# top comment" in after and "local/y  # keep me" in after and "# the triage agent" in after
    rows = {r["name"]: r for r in json.loads(invoke("agents", "list", "--agents", str(p), "--json").stdout)}
    assert set(rows) == {"triage", "triage@2", "other"} and rows["triage"]["hash"] != rows["triage@2"]["hash"]
    promoted = json.loads(invoke("agents", "promote", "triage@2", "--agents", str(p), "--json").stdout)
    assert promoted["hash"] == forked["hash"]
    from loomrt.spec_load import load_agents

    defs = load_agents(p)
    assert set(defs.agents) == {"triage", "other"}
    assert defs.agents["triage"].context.state_schema["required"] == ["b"]
    assert "local/y  # keep me" in p.read_text()


def test_version_from_run_adopts_proposed_schema(tmp_path: Path) -> None:
    write(
        tmp_path,
        (
            "turns:\n  - emit_state:\n      reasoning: r\n      patch: {a: x}\n      done: true\n"
            "      propose_schema: {type: object, properties: {a: {type: string}, b: {type: integer}}}\n"
        ),
        "s.yaml",
    )
    p = write(
        tmp_path,
        (
            "agents:\n  t:\n    model: scripted/s.yaml\n    context:\n      mode: stateful\n      propose_schema: true\n"
            "      state_schema: {type: object, properties: {a: {type: string}}}\n"
        ),
    )
    run = json.loads(invoke("run", "t", "go", "--agents", str(p), "--json").stdout)
    assert run["state"] == {"a": "x"}
    # recorded, never applied: the definition is unchanged until an operator writes a version
    from loomrt.spec_load import load_agents

    assert "b" not in load_agents(p).agents["t"].context.state_schema["properties"]
    result = invoke("agents", "version", "t", "--from-run", run["run_id"], "--agents", str(p), "--json")
    assert result.exit_code == 0, result.output
    assert "b" in load_agents(p).agents["t@2"].context.state_schema["properties"]


def test_the_old_fork_spelling_is_refused_with_a_hint(tmp_path: Path) -> None:
    p = write(tmp_path, "agents:\n  t:\n    model: local/x\n")
    result = invoke("agents", "fork", "t", "--state-schema", "s.json", "--agents", str(p))
    assert result.exit_code == 2
    assert "loomrt agents version" in result.output


@pytest.mark.slow
def test_real_subprocess_run_and_error(calc_agents: Path, tmp_path: Path) -> None:
    env = {**os.environ, "LOOMRT_HOME": str(tmp_path / "home")}
    ok = subprocess.run(
        [sys.executable, "-m", "loomrt", "run", "calc", "go", "--json"],
        cwd=calc_agents.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["output"] == "19 + 23 = 42"
    bad = subprocess.run(
        [sys.executable, "-m", "loomrt", "runs", "show", "missing"],
        cwd=calc_agents.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_validate_refuses_what_run_refuses(tmp_path: Path) -> None:
    """An unknown tool, an unknown embedded model, a system prompt file that is not a file,
    an agent name that is a path or reads as another: each one clear error, as `run` gives."""
    cases = [
        (
            "agents:\n  a:\n    model: local/qwen2.5-coder-1.5b\n    tools: [calculate, deploy]\n",
            "unknown tool 'deploy'",
        ),
        ("agents:\n  a:\n    model: local/qwen9-nope\n", "unknown embedded model 'local/qwen9-nope'"),
        ("agents:\n  a:\n    model: local/smollm2-135m\n    system_prompt_file: /dev/zero\n", "is not a regular file"),
        ("agents:\n  ../evil:\n    model: local/smollm2-135m\n", "path separator"),
        ('agents:\n  "ab\\u202ec":\n    model: local/smollm2-135m\n', "bidirectional"),
    ]
    for text, message in cases:
        result = invoke("agents", "validate", str(write(tmp_path, text)))
        assert result.exit_code == 2 and message in result.stderr, (text, result.stderr)
        assert "Traceback" not in result.stderr


def test_run_resolves_only_the_chosen_agents_files(tmp_path: Path) -> None:
    """A copied agents.yaml whose other agent points at a missing prompt file still runs
    this one; validate checks them all; choosing the broken one names its problem."""
    (tmp_path / "s.yaml").write_text("turns: [{text: hello}]\n")
    p = write(
        tmp_path,
        "agents:\n  good:\n    model: scripted/s.yaml\n  broken:\n    model: scripted/s.yaml\n"
        "    system_prompt_file: prompts/missing.md\n",
    )
    from loomrt.errors import SpecError
    from loomrt.runtime import Runtime
    from loomrt.spec_load import load_agents

    agents = load_agents(p)
    assert Runtime().run_sync("good", "hi", agents=agents).output == "hello"
    with pytest.raises(SpecError, match="system prompt file 'prompts/missing.md' does not exist"):
        Runtime().run_sync("broken", "hi", agents=agents)
    result = invoke("agents", "validate", str(p))
    assert result.exit_code == 2 and "prompts/missing.md" in result.stderr


def test_recall_in_tools_needs_context_recall(tmp_path: Path) -> None:
    p = write(tmp_path, "agents:\n  a:\n    model: local/x\n    tools: [Recall]\n")
    result = invoke("agents", "validate", str(p))
    assert result.exit_code == 2 and "context.recall: true" in result.stderr and ":3:" in result.stderr


def test_definition_hash_does_not_depend_on_where_the_checkout_lives(tmp_path: Path) -> None:
    from loomrt.spec import definition_hash
    from loomrt.spec_load import load_agents

    hashes = []
    for folder in ("one", "two"):
        d = tmp_path / folder
        d.mkdir()
        (d / "p.md").write_text("You add.")
        (d / "s.yaml").write_text("turns: [{text: hi}]\n")
        (d / "agents.yaml").write_text("agents:\n  a:\n    model: scripted/s.yaml\n    system_prompt_file: p.md\n")
        hashes.append(definition_hash(load_agents(d / "agents.yaml").agents["a"]))
    assert hashes[0] == hashes[1]
    (tmp_path / "two" / "p.md").write_text("You subtract.")
    assert definition_hash(load_agents(tmp_path / "two" / "agents.yaml").agents["a"]) != hashes[0]
