"""``loomrt doctor``: what this machine can run, and why not.

It reports the providers the agents file configures (with their capabilities), which
API-key variables are set (never their values), whether the embedded models are
installed and verified against their pinned sha256, and the versions of litellm and
llama-cpp-python. It never makes a model request. ``--json`` prints one object. The exit
status is 1 when an agent in the file cannot run here (a missing key or model package).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

import typer

from loomrt.errors import LoomError

__all__ = ["doctor", "diagnose", "COMMON_KEY_VARS"]

COMMON_KEY_VARS = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GROQ_API_KEY",
    "MISTRAL_API_KEY",
    "OPENROUTER_API_KEY",
)
"""API-key variables checked whether or not an agent names them."""

_LITELLM_SWITCHES = ("LITELLM_LOCAL_MODEL_COST_MAP", "LITELLM_OFFLINE_MODE", "LOOMRT_ALLOW_MODEL_REQUESTS")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _agents(explicit: Path | None) -> tuple[str | None, dict[str, Any], str | None]:
    from loomrt.cli._common import agents_path
    from loomrt.spec_load import load_agents

    try:
        path = agents_path(explicit)
        return str(path), dict(load_agents(path).agents), None
    except LoomError as exc:
        return None if explicit is None else str(explicit), {}, str(exc)


def _provider_entry(name: str, spec: Any, verify: bool) -> dict[str, Any]:
    from loomrt.providers.models import CATALOGUE, model_status
    from loomrt.providers.registry import capabilities_for, is_embedded, is_scripted, provider_of

    entry: dict[str, Any] = {"agent": name, "model": spec.model, "provider": provider_of(spec.model)}
    if spec.api_base:
        entry["api_base"] = spec.api_base
    problems = []
    if spec.api_key_env:
        entry["api_key_env"] = spec.api_key_env
        if not os.environ.get(spec.api_key_env):
            problems.append(f"{spec.api_key_env} is not set")
    if spec.model in CATALOGUE:
        status = model_status(spec.model, verify=verify)
        if not status["installed"]:
            problems.append(str(status.get("error")))
        elif status.get("error"):
            problems.append(str(status["error"]))
    elif is_embedded(spec.model):
        problems.append(f"unknown embedded model; known: {', '.join(sorted(CATALOGUE))}")
    if not is_scripted(spec.model):
        caps = capabilities_for(spec.model, api_base=spec.api_base, declared=spec.capabilities)
        entry["capabilities"] = dict(caps.__dict__)
        entry["tools_via"] = "native" if caps.tool_calling else "JSON decision"
    entry["ok"] = not problems
    if problems:
        entry["problems"] = problems
    return entry


def diagnose(agents: Path | None = None, *, verify: bool = False) -> dict[str, Any]:
    """Everything ``loomrt doctor`` reports, as one JSON-ready object (no model requests)."""
    from loomrt.providers.models import CATALOGUE, DEFAULT_LOCAL_MODEL, model_cache_dir, model_status

    path, specs, problem = _agents(agents)
    providers = [_provider_entry(name, spec, verify) for name, spec in specs.items()]
    key_vars = list(COMMON_KEY_VARS)
    for spec in specs.values():
        if spec.api_key_env and spec.api_key_env not in key_vars:
            key_vars.append(spec.api_key_env)
    models = [model_status(name, verify=verify) for name in CATALOGUE]
    for m in models:
        m["default"] = m["model"] == DEFAULT_LOCAL_MODEL
    report: dict[str, Any] = {
        "agents_file": path,
        "providers": providers,
        "api_keys": {var: bool(os.environ.get(var)) for var in key_vars},
        "embedded_models": models,
        "model_cache": str(model_cache_dir()),
        "versions": {
            "loomrt": _version("loomrt"),
            "litellm": _version("litellm"),
            "llama-cpp-python": _version("llama-cpp-python"),
            "python": platform.python_version(),
        },
        "environment": {var: os.environ.get(var) for var in _LITELLM_SWITCHES},
        "ledger": _ledger(),
    }
    report["ok"] = all(p["ok"] for p in providers) and report["ledger"]["ok"]
    if problem:
        report["agents_problem"] = problem
    return report


def _ledger() -> dict[str, Any]:
    """Whether new runs are chained keyed (v2): the key's source, or why it cannot be used."""
    from loomrt.errors import LoomError
    from loomrt.record.ledger import KEY_ENV, KEY_FILE_ENV, ledger_key

    try:
        keyed = ledger_key() is not None
    except LoomError as exc:
        return {"keyed": False, "ok": False, "problem": str(exc)}
    source = KEY_ENV if os.environ.get(KEY_ENV) else (KEY_FILE_ENV if keyed else None)
    return {"keyed": keyed, "ok": True, "source": source}


def _mark(ok: bool) -> str:
    return "[green]✓[/green]" if ok else "[red]✗[/red]"


def _print(report: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from loomrt.cli._common import out
    from loomrt.cli._render import model_label

    out.print(f"[bold]agents file[/bold]: {report['agents_file'] or 'none'}")
    if report.get("agents_problem"):
        out.print(f"  {report['agents_problem']}", highlight=False)
    if report["providers"]:
        table = Table("agent", "model", "local", "window", "tools", "", box=None)
        for p in report["providers"]:
            caps = p.get("capabilities") or {}
            table.add_row(
                p["agent"],
                escape(model_label(p["model"])),
                str(caps.get("local", "—")),
                str(caps.get("context_window", "—")),
                p.get("tools_via", "scripted"),
                _mark(p["ok"]),
            )
        out.print(table)
        for p in report["providers"]:
            for problem in p.get("problems", []):
                out.print(f"  [red]✗[/red] {p['agent']}: {problem}", highlight=False)
    out.print("[bold]API keys[/bold] (set or not; values are never shown)")
    for var, is_set in report["api_keys"].items():
        out.print(f"  {_mark(is_set)} {var}")
    out.print(f"[bold]embedded models[/bold] (cache: {report['model_cache']})")
    for m in report["embedded_models"]:
        if not m["installed"]:
            state = m.get("error", "not installed")
        elif not m["ready"]:
            state = "installed; assembled on first use"
        else:
            state = (
                "verified (sha256)" if m["verified"] else m.get("error", "not verified yet (loomrt doctor --verify)")
            )
        default = " (default)" if m["default"] else ""
        out.print(f"  {_mark(bool(m['verified']))} {m['model']}{default}: {state}", highlight=False)
    ledger = report["ledger"]
    if not ledger["ok"]:
        out.print(f"[bold]ledger[/bold]: [red]✗[/red] {ledger['problem']}", highlight=False)
    elif ledger["keyed"]:
        out.print(
            f"[bold]ledger[/bold]: keyed: new runs are chained v2 (key from ${ledger['source']})", highlight=False
        )
    else:
        out.print(
            "[bold]ledger[/bold]: unkeyed: new runs are chained v1, which a writer with database access can "
            "re-chain (`loomrt db keygen FILE`, then LOOMRT_LEDGER_KEY_FILE=FILE: docs/audit.md)",
            highlight=False,
        )
    out.print(
        "[bold]versions[/bold]: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in report["versions"].items())
    )


_JSON = typer.Option(False, "--json", help="Print one JSON object.")
_AGENTS = typer.Option(None, "--agents", help="The agents file (default ./agents.yaml, else $LOOMRT_AGENTS).")
_VERIFY = typer.Option(False, "--verify", help="Hash model files not verified yet (seconds for 1 GB).")


def doctor(json_output: bool = _JSON, agents: Path | None = _AGENTS, verify: bool = _VERIFY) -> None:
    """Show configured providers, which API keys are set, the embedded models and versions."""
    report = diagnose(agents, verify=verify)
    if json_output:
        from loomrt.cli._common import print_json

        print_json(report)
    else:
        _print(report)
    if not report["ok"]:
        raise typer.Exit(1)
