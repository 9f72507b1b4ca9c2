"""The CLI's chat reopened (``chat --continue`` / ``-c``), Ctrl-C, ``--version``, and how it
reads: plurals, tool-only steps, model names, times and help text (issue 44)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loomrt.cli._render import describe, model_label
from loomrt.cli.app import app
from loomrt.events import Event
from loomrt.providers.scripted import FunctionProvider

runner = CliRunner()


def invoke(*args: str, input: str | None = None) -> Any:  # noqa: A002
    return runner.invoke(app, list(args), input=input, catch_exceptions=False)


def write(tmp_path: Path, text: str, name: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def turns_of(result: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.strip().splitlines()]


def kinds(run_id: str) -> list[str]:
    return [json.loads(line)["kind"] for line in invoke("runs", "events", run_id, "--json").stdout.splitlines()]


@pytest.fixture
def chat_agents(tmp_path: Path) -> Path:
    write(tmp_path, "turns:\n  - text: one\n  - text: two\n  - text: three\n", "c.yaml")
    write(tmp_path, "turns:\n  - text: other\n", "o.yaml")
    return write(
        tmp_path,
        "agents:\n  c:\n    model: scripted/c.yaml\n  other:\n    model: scripted/o.yaml\n",
        "agents.yaml",
    )


def _chat(agents: Path, *lines: str, agent: str = "c") -> str:
    result = invoke("chat", agent, "--agents", str(agents), "--json", input="".join(f"{x}\n" for x in lines))
    assert result.exit_code == 0, result.output
    return str(turns_of(result)[0]["run_id"])


# ---------------------------------------------------------------- chat --continue, -c


def test_chat_continue_goes_on_with_the_same_run_and_its_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "turns: []\n", "echo.yaml")
    agents = write(tmp_path, "agents:\n  echo:\n    model: scripted/echo.yaml\n", "agents.yaml")

    def seen(request: Any) -> str:  # the model answers with every user input its prompt holds
        return "seen: " + ", ".join(m["content"] for m in request.messages if m.get("role") == "user")

    monkeypatch.setattr("loomrt.runtime.resolve_provider", lambda spec, model: FunctionProvider(seen))
    first = invoke("chat", "echo", "--agents", str(agents), "--json", input="apples\n")
    run_id = turns_of(first)[0]["run_id"]
    assert invoke("runs", "show", run_id, "--json").stdout and kinds(run_id)[-1] == "final"

    again = invoke("chat", "echo", "--continue", run_id, "--json", input="pears\n")
    assert again.exit_code == 0, again.output
    [turn] = turns_of(again)
    assert turn["run_id"] == run_id and turn["output"] == "seen: apples, pears"
    # AGENT is optional: the run knows its agent (and no agents file is needed)
    third = invoke("chat", "--continue", run_id, "--json", input="plums\n")
    assert turns_of(third)[0]["output"] == "seen: apples, pears, plums"
    record = kinds(run_id)
    assert record.count("run_started") == 1 and record.count("user_input") == 3 and record[-1] == "final"
    assert invoke("runs", "verify", run_id).exit_code == 0  # the record reads as the runtime wrote it


def test_chat_c_reopens_the_newest_chat_of_the_agent(chat_agents: Path) -> None:
    older = _chat(chat_agents, "a")
    newer = _chat(chat_agents, "b")
    invoke("run", "c", "a one-shot run is not a chat", "--agents", str(chat_agents), "--json")
    _chat(chat_agents, "x", agent="other")  # another agent's chat is newer still
    result = invoke("chat", "c", "-c", "--json", input="again\n")
    assert result.exit_code == 0, result.output
    assert [t["run_id"] for t in turns_of(result)] == [newer] and newer != older
    assert invoke("chat", "--last", "--json", input="").exit_code == 0  # without AGENT: the newest chat of any


def test_chat_reopened_and_left_at_once_stays_as_it_was(chat_agents: Path) -> None:
    run_id = _chat(chat_agents, "a")
    before = kinds(run_id)
    assert invoke("chat", "--continue", run_id, "--json", input="").exit_code == 0
    assert kinds(run_id) == before  # no second final, no resumed


@pytest.mark.parametrize(
    "args,message",
    [
        (["chat", "c", "--continue", "nope"], "no run 'nope'"),
        (["chat", "--continue", "ONESHOT"], "is not a chat"),
        (["chat", "other", "--continue", "CHAT"], "is a chat with c, not other"),
        (["chat", "other", "-c"], "no earlier chat with other"),
        (["chat", "--continue", "CHAT", "--mode", "append"], "--mode is for a new chat"),
        (["chat", "--continue", "CHAT", "--user", "bob"], "works for no user, not bob"),
        (["chat", "--continue", "CHAT", "-c"], "not both"),
        (["chat"], "name the AGENT"),
    ],
)
def test_chat_reopen_mistakes_are_one_clear_line(chat_agents: Path, args: list[str], message: str) -> None:
    ids = {"CHAT": _chat(chat_agents, "a")}
    ids["ONESHOT"] = json.loads(invoke("run", "c", "x", "--agents", str(chat_agents), "--json").stdout)["run_id"]
    result = invoke(*(ids.get(a, a) for a in args), "--agents", str(chat_agents), input="hi\n")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


def test_chat_reopened_in_a_tty_says_which_run_and_how_many_turns(
    chat_agents: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _chat(chat_agents, "a")
    monkeypatch.setattr(sys.modules["loomrt.cli.app"], "_tty", lambda: True)  # (the package's `app` is the Typer)
    result = invoke("chat", "--continue", run_id, input="b\n")
    assert result.exit_code == 0, result.output
    assert f"reopened run {run_id} · agent c · 1 turn so far" in result.stderr
    assert f"loomrt chat --continue {run_id}" in result.stderr  # the closing line says how to come back
    assert "two" in result.stdout


# ---------------------------------------------------------------- Ctrl-C, --version


def _interrupt(request: Any) -> str:
    raise KeyboardInterrupt


def test_ctrl_c_names_the_run_it_interrupted(chat_agents: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr("loomrt.runtime.resolve_provider", lambda spec, model: FunctionProvider(_interrupt))
        result = invoke("run", "c", "go", "--agents", str(chat_agents))
    assert result.exit_code == 130
    [run] = json.loads(invoke("runs", "list", "--json").stdout)
    assert "RUN_ID" not in result.stderr and f"`loomrt runs resume {run['run_id']}`" in result.stderr
    resumed = invoke("runs", "resume", run["run_id"], "--json")
    assert resumed.exit_code == 0 and json.loads(resumed.stdout)["output"] == "one"


def test_ctrl_c_in_a_chat_says_how_to_reopen_it(chat_agents: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr("loomrt.runtime.resolve_provider", lambda spec, model: FunctionProvider(_interrupt))
        result = invoke("chat", "c", "--agents", str(chat_agents), "--json", input="a\nb\n")
    assert result.exit_code == 130
    [run] = json.loads(invoke("runs", "list", "--json").stdout)
    assert f"`loomrt chat --continue {run['run_id']}`" in result.stderr
    # stopped mid-turn: reopened with its interrupted turn closed, it goes on
    again = invoke("chat", "--continue", run["run_id"], "--json", input="c\n")
    assert again.exit_code == 0, again.output
    assert turns_of(again)[0]["output"] == "one"
    assert invoke("runs", "verify", run["run_id"]).exit_code == 0


def test_version_prints_the_installed_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"loomrt {importlib.metadata.version('loomrt')}"


# ---------------------------------------------------------------- how it reads


def test_counts_read_in_the_singular_for_one(tmp_path: Path) -> None:
    write(tmp_path, "turns:\n  - text: ok\n", "s.yaml")
    agents = write(tmp_path, "agents:\n  solo:\n    model: scripted/s.yaml\n", "agents.yaml")
    validated = invoke("agents", "validate", str(agents))
    assert "ok, 1 agent (solo)" in validated.stdout
    one = Event(run_id="r", seq=9, kind="distillation", data={"mode": "recap", "span_seqs": [3]})
    assert "1 message evicted" in describe(one) and "messages" not in describe(one)


def test_a_tool_only_step_reads_as_its_calls() -> None:
    def step(message: dict[str, Any]) -> str:
        return describe(Event(run_id="r", seq=3, kind="assistant_message", data={"message": message}))

    calls = [{"id": "1", "name": "read_file", "arguments": {}}, {"id": "2", "name": "calculate", "arguments": {}}]
    assert step({"role": "assistant", "content": "", "tool_calls": calls}) == "assistant → calls read_file, calculate"
    assert step({"role": "assistant", "content": None, "tool_calls": calls[:1]}) == "assistant → calls read_file"
    assert step({"role": "assistant", "content": "Let me look.", "tool_calls": calls[:1]}) == (
        "assistant: Let me look. → read_file"
    )
    assert step({"role": "assistant", "content": ""}) == "assistant: (an empty reply: no text, no tool calls)"


def test_a_scripted_models_path_shows_without_a_double_slash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "sub" / "s.yaml"
    assert model_label(f"scripted/{script}") == f"scripted:{script}"
    monkeypatch.chdir(tmp_path)
    assert model_label(f"scripted/{script}") == "scripted/sub/s.yaml"
    assert model_label("openai/gpt-4o") == "openai/gpt-4o" and model_label("scripted/rel.yaml") == "scripted/rel.yaml"
    write(tmp_path, "turns:\n  - text: ok\n", "s.yaml")
    agents = write(tmp_path, "agents:\n  a:\n    model: scripted/s.yaml\n", "agents.yaml")
    ran = invoke("run", "a", "go", "--agents", str(agents))
    assert "· scripted/s.yaml" in ran.stderr and "//" not in ran.stderr
    assert "scripted//" not in invoke("agents", "list", "--agents", str(agents)).stdout


def test_runs_list_shows_local_times_the_task_duration_and_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loomrt.cli.runs_cmd import _at_a_glance
    from loomrt.record import default_store

    write(tmp_path, "turns:\n  - text: ok\n", "s.yaml")
    agents = write(tmp_path, "agents:\n  a:\n    model: scripted/s.yaml\n", "agents.yaml")
    task = "add up the invoices of March and tell me which vendor was paid twice"
    done = json.loads(invoke("run", "a", task, "--agents", str(agents), "--json").stdout)
    [raw] = json.loads(invoke("runs", "list", "--json").stdout)
    assert isinstance(raw["created_at"], float)  # --json keeps the number
    store = default_store()
    shown_task, duration, tokens = _at_a_glance(store, store.get_run(done["run_id"]))
    assert shown_task.startswith("add up the invoices") and shown_task.endswith("…") and len(shown_task) == 40
    assert duration.endswith(" s")
    assert tokens == f"{done['usage']['input_tokens'] + done['usage']['output_tokens']:,}" and tokens != "0"
    monkeypatch.setenv("COLUMNS", "250")
    table = invoke("runs", "list").stdout
    assert re.search(r"\b\d{4}-\d\d-\d\d \d\d:\d\d\b", table) and not re.search(r"\d{10}\.\d", table)
    assert "took" in table and "tokens" in table and "add up the invoices" in table


# ---------------------------------------------------------------- help text


@pytest.mark.parametrize("command", [["run"], ["bench", "qa"], ["chat"], ["runs", "events"]])
def test_help_shows_plain_metavars_not_python_types(command: list[str]) -> None:
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    for python_type in ("<bool>", "<list[", "<str>", "<int", "<path>", "{agent}"):
        assert python_type not in result.stdout, (python_type, result.stdout)
    assert "TEXT" in result.stdout or "PATH" in result.stdout
