"""The docs and the README are run: their Python examples, their `$ loomrt` lines, the
generated reference pages, and the README's set-up commands against .ci/run."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])


def blocks(lang: str) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for i, body in enumerate(re.findall(rf"```{lang}\n(.*?)```", page.read_text(encoding="utf-8"), re.S)):
            found.append((f"{page.relative_to(REPO)}#{i}", body))
    return found


PYTHON = blocks("python")
CONSOLE = [
    (where, line[2:].strip())
    for where, body in blocks("console")
    for line in body.splitlines()
    if line.startswith("$ ")
]


SLOW_WORDS = (
    "loomrt bench run",
    "loomrt run demo-recap",
    "loomrt memory calibrate",
    "providers.gateway",
    "providers.registry",
    "stdio_client",
    "FaultyProvider",
)
"""An example that says one of these loads the embedder or litellm, or starts a process
(seconds each): it is in the slow set, as the tests that do so by hand are."""


def examples(found: list[tuple[str, str]], *, processes: bool = False) -> list[object]:
    """``found`` as parameters, the slow ones marked: those that say one of :data:`SLOW_WORDS`,
    or every one when each starts a ``loomrt`` process (``processes``: a console line)."""
    return [
        pytest.param(
            where, text, id=where, marks=[pytest.mark.slow] if processes or any(w in text for w in SLOW_WORDS) else []
        )
        for where, text in found
    ]


def test_docs_have_examples() -> None:
    assert len(PYTHON) >= 2 and len(CONSOLE) >= 4


@pytest.mark.parametrize("where,code", examples(PYTHON))
def test_python_examples_run(where: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})


@pytest.mark.parametrize("where,command", examples(CONSOLE, processes=True))
def test_console_examples_run(where: str, command: str, tmp_path: Path) -> None:
    argv = shlex.split(command)
    assert argv[0] == "loomrt"
    env = {**os.environ, "LOOMRT_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "loomrt", *argv[1:]], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{where}: {command}\n{done.stderr}"
    if "--json" in argv:
        for line in done.stdout.strip().splitlines() or [done.stdout]:
            json.loads(line)


def test_generated_reference_pages_are_current() -> None:
    from loomrt.docgen import generated_files

    for path, text in generated_files().items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name} is stale: run `python -m loomrt.docgen`"


def test_readme_setup_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Set up and test", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(setup) == 2, "exactly two set-up commands: install; run the tests"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    for command in setup:
        assert re.search(rf"^{re.escape(command)}( |$)", ci, re.M), f".ci/run does not run {command!r}"


def test_agents_yaml_examples_are_valid_and_point_at_the_schema() -> None:
    from loomrt.spec_load import load_agents

    text = (REPO / "agents.yaml").read_text(encoding="utf-8")
    assert text.splitlines()[0] == "# yaml-language-server: $schema=./docs/agents.schema.json"
    defs = load_agents(REPO / "agents.yaml")
    modes = {a.context.mode for a in defs.agents.values()}
    assert modes >= {"append", "recap", "stateful", "compaction", "auto"}
    assert defs.agents["assistant"].model.startswith("local/")


@pytest.mark.slow
def test_readme_main_job_runs_offline_on_the_local_model(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    job = readme.split("## The main job", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0].strip()
    argv = shlex.split(job)
    assert argv[:3] == ["loomrt", "run", "assistant"]
    env = {**os.environ, "LOOMRT_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "loomrt", *argv[1:], "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "done" and len(result["output"].strip()) > 20


def _demo(agent: str, prompt: str, tmp_path: Path) -> tuple[dict, list[dict]]:
    """Run a scripted demo of agents.yaml as a user would; its result and its record."""
    env = {**os.environ, "LOOMRT_HOME": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-m", "loomrt", "run", agent, prompt, "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    events = subprocess.run(
        [sys.executable, "-m", "loomrt", "runs", "events", result["run_id"], "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, [json.loads(line) for line in events.stdout.splitlines()]


@pytest.mark.slow
def test_demo_recap_shows_a_recap_boundary_and_recalls_an_evicted_value(tmp_path: Path) -> None:
    """agents.yaml: "shows a recap boundary and a Recall of an evicted value"."""
    result, events = _demo("demo-recap", "Plan the staging migration", tmp_path)
    recaps = [e for e in events if e["kind"] == "distillation"]
    assert recaps and recaps[0]["data"]["mode"] == "recap" and recaps[0]["data"]["summary"]
    evicted = set(recaps[0]["data"]["span_seqs"])
    (recalled,) = [
        json.loads(e["data"]["content"]) for e in events if e["kind"] == "tool_result" and e["data"]["name"] == "Recall"
    ]
    assert recalled["results"] and recalled["results"][0]["text"] == "5433"
    assert recalled["results"][0]["seq"] in evicted  # the value came back from an evicted span
    assert "5433" in result["output"]


@pytest.mark.slow
def test_demo_triage_shows_stateful_steps_a_retried_patch_and_a_final_sigma(tmp_path: Path) -> None:
    """agents.yaml: "shows stateful steps, an invalid patch retried, and a final Σ"."""
    result, events = _demo("demo-triage", "Users report data loss on save", tmp_path)
    kinds = [e["kind"] for e in events]
    assert kinds.count("state_update") >= 2 and "patch_rejected" in kinds and "distillation" in kinds
    assert result["mode"] == "stateful" and result["state"]["severity"] in ("low", "medium", "high", "critical")
    assert result["usage"]["output_tokens"] > 4 * kinds.count("state_update")  # tool-call arguments count as output
