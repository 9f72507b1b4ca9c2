"""``loomrt agents``: list, validate, schema, version, promote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from loomrt.cli._common import err, friendly, load, out, plural, print_json
from loomrt.cli._render import model_label
from loomrt.errors import SpecError

__all__ = ["agents_app"]

agents_app = typer.Typer(help="Agent definitions: list, validate, schema, version, promote.", no_args_is_help=True)

AgentsOpt = typer.Option(None, "--agents", help="The agents file (default ./agents.yaml, else $LOOMRT_AGENTS).")


@agents_app.command("list")
@friendly
def list_cmd(agents: Path | None = AgentsOpt, json_output: bool = typer.Option(False, "--json")) -> None:
    """The agents in the file, with model, mode and content hash."""
    from loomrt.spec import definition_hash

    path, defs = load(agents)
    rows = [
        {
            "name": n,
            "model": a.model,
            "mode": a.context.mode,
            "tools": a.tools,
            "recall": a.context.recall,
            "hash": definition_hash(a),
            "description": a.description,
        }
        for n, a in defs.agents.items()
    ]
    if json_output:
        print_json(rows)
        return
    table = Table("agent", "model", "mode", "tools", "hash", "description", title=str(path))
    for r in rows:
        table.add_row(
            r["name"],
            escape(model_label(r["model"])),
            r["mode"] + (" +recall" if r["recall"] else ""),
            ", ".join(r["tools"]) or "-",
            r["hash"],
            r["description"],
        )
    out.print(table)


def _local_model_problem(model: str | None) -> str | None:
    """Why an embedded model name would be refused by `loomrt run`, or None."""
    if not model or not model.startswith("local/"):
        return None
    from loomrt.providers.models import CATALOGUE

    if model in CATALOGUE:
        return None
    return f"unknown embedded model {model!r}. Embedded models: {', '.join(sorted(CATALOGUE))}"


@agents_app.command("validate")
@friendly
def validate_cmd(
    file: Path | None = typer.Argument(None, help="The file to check (default: the agents file)."),
    json_output: bool = typer.Option(False, "--json"),
) -> None:
    """Check a definitions file; print file:line:col: key: problem on error."""
    from loomrt.errors import SpecError
    from loomrt.spec import SPAWN_TOOLS
    from loomrt.tools import BUILTIN_TOOLS

    path, defs = load(file, eager=True)
    # what `loomrt run` would refuse, refused here too: a tool the CLI's runtime does not have
    # (a Python caller registers its own tools and validates with its own Runtime), an
    # embedded model that does not exist
    for name, spec in defs.agents.items():
        for i, tool in enumerate(spec.tools):
            if tool not in BUILTIN_TOOLS and tool not in ("Recall", *SPAWN_TOOLS) and "." not in tool:
                raise SpecError(
                    f"unknown tool {tool!r}. Known tools: {', '.join(sorted(BUILTIN_TOOLS))} (and Recall, the spawn "
                    "tools and an MCP server's SERVER.TOOL)",
                    where=str(path),
                    path=f"agents.{name}.tools[{i}]",
                )
        for key, model in (("model", spec.model), ("context.summarizer_model", spec.context.summarizer_model)):
            problem = _local_model_problem(model)
            if problem:
                raise SpecError(problem, where=str(path), path=f"agents.{name}.{key}")
    warnings: list[str] = []
    from loomrt.harvest.wiring import config_problems

    warnings += [
        f"agents.{name}.context: {problem}"
        for name, spec in defs.agents.items()
        for problem in config_problems(spec.context)
    ]
    if json_output:
        print_json({"file": str(path), "valid": True, "agents": sorted(defs.agents), "warnings": warnings})
        return
    for w in warnings:
        err.print(f"[yellow]warning:[/yellow] {path}: {w}", highlight=False)
    out.print(f"{path}: ok, {plural(len(defs.agents), 'agent')} ({', '.join(defs.agents)})", highlight=False)


@agents_app.command("schema")
@friendly
def schema_cmd(output: Path | None = typer.Option(None, "--out", help="Write the schema to this file.")) -> None:
    """The JSON Schema of a definitions file (for editors: yaml-language-server)."""
    from loomrt.spec import agents_json_schema

    text = json.dumps(agents_json_schema(), indent=2) + "\n"
    if output:
        output.write_text(text, encoding="utf-8")
        out.print(f"wrote {output}")
    else:
        typer.echo(text, nl=False)


@agents_app.command("version")
@friendly
def version_cmd(
    name: str = typer.Argument(..., help="The agent to write a new version of."),
    state_schema: Path | None = typer.Option(
        None, "--state-schema", help="A JSON or YAML file with the new state_schema."
    ),
    from_run: str | None = typer.Option(None, "--from-run", help="Adopt the last schema a run's model proposed."),
    new_name: str | None = typer.Option(None, "--as", help="The new version's name (default NAME@N)."),
    agents: Path | None = AgentsOpt,
    json_output: bool = typer.Option(False, "--json"),
) -> None:
    """Write a new version of NAME with a new state_schema (an operator's decision)."""
    from loomrt.versions import version_agent

    if (state_schema is None) == (from_run is None):
        raise SpecError("give exactly one of --state-schema FILE or --from-run RUN_ID")
    schema = _schema_from_file(state_schema) if state_schema else _schema_from_run(from_run or "")
    path, _ = load(agents)
    version, digest = version_agent(path, name, schema, new_name=new_name)
    if json_output:
        print_json({"agent": version, "hash": digest, "file": str(path), "version_of": name})
    else:
        out.print(
            f"wrote {version} ({digest}) to {path}. Try it with `loomrt run {version} ...`; "
            f"adopt it with `loomrt agents promote {version}`.",
            highlight=False,
        )


@agents_app.command("fork", hidden=True, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@friendly
def fork_cmd() -> None:
    """Renamed: a new version of a definition is `loomrt agents version`."""
    raise SpecError(
        "`loomrt agents fork` is now `loomrt agents version` (a new version of a definition; "
        '"fork" is kept for forking runs). Run the same command as `loomrt agents version ...`'
    )


@agents_app.command("promote")
@friendly
def promote_cmd(
    version: str = typer.Argument(..., help="The version to promote, NAME@N."),
    agents: Path | None = AgentsOpt,
    json_output: bool = typer.Option(False, "--json"),
) -> None:
    """Make the version NAME@N the definition of NAME."""
    from loomrt.versions import promote_agent

    path, _ = load(agents)
    name, digest = promote_agent(path, version)
    if json_output:
        print_json({"agent": name, "hash": digest, "file": str(path), "promoted_from": version})
    else:
        out.print(f"{name} is now {version}'s definition ({digest}).", highlight=False)


def _schema_from_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError("no such file", where=str(path)) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid JSON or YAML: {exc}", where=str(path)) from None
    if not isinstance(data, dict):
        raise SpecError("a state_schema must be a JSON object", where=str(path))
    return data


def _schema_from_run(run_id: str) -> dict[str, Any]:
    from loomrt.record import default_store

    store = default_store()
    store.get_run(run_id)
    proposals = store.events(run_id, kinds=["schema_proposed"])
    if not proposals:
        raise SpecError(f"run {run_id} proposed no schema (no schema_proposed event)")
    schema: dict[str, Any] = proposals[-1].data["schema"]
    return schema
