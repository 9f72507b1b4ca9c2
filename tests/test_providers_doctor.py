"""`loomrt doctor`: configured providers, keys (never their values), embedded models, versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loomrt.cli.app import app

AGENTS = """\
agents:
  offline:
    model: local/smollm2-135m
  frontier:
    model: openai/gpt-4o
    api_key_env: LOOMRT_DOCTOR_KEY
"""


def doctor(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["doctor", *args])
    return result.exit_code, result.output


def test_doctor_json_reports_everything_and_never_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(AGENTS)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret-value")
    monkeypatch.setenv("LOOMRT_DOCTOR_KEY", "another-secret")
    code, output = doctor("--json", "--agents", str(path), "--verify")
    assert code == 0
    assert "secret" not in output
    report = json.loads(output)
    assert report["api_keys"]["OPENAI_API_KEY"] is True and report["api_keys"]["LOOMRT_DOCTOR_KEY"] is True
    assert report["api_keys"]["ANTHROPIC_API_KEY"] in (True, False)
    by_agent = {p["agent"]: p for p in report["providers"]}
    assert by_agent["offline"]["capabilities"]["local"] is True
    assert by_agent["offline"]["tools_via"] == "JSON decision"
    assert by_agent["frontier"]["capabilities"]["context_window"] == 128000
    assert by_agent["frontier"]["tools_via"] == "native"
    models = {m["model"]: m for m in report["embedded_models"]}
    assert models["local/smollm2-135m"]["verified"] is True  # --verify hashed it against the pin
    assert models["local/qwen2.5-coder-1.5b"]["default"] is True
    assert report["versions"]["litellm"] == "1.110.2"
    assert report["ok"] is True


def test_doctor_fails_when_an_agent_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(AGENTS)
    monkeypatch.delenv("LOOMRT_DOCTOR_KEY", raising=False)
    code, output = doctor("--agents", str(path))
    assert code == 1
    assert "LOOMRT_DOCTOR_KEY is not set" in output


def test_doctor_without_an_agents_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOMRT_AGENTS", raising=False)
    code, output = doctor("--json")
    report = json.loads(output)
    assert code == 0 and report["agents_file"] is None and report["providers"] == []
    assert "no agents file" in report["agents_problem"]
