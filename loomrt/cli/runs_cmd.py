"""``loomrt runs``: list, show, events, resume, continue."""

from __future__ import annotations

import asyncio
import datetime as dt

import typer
from rich.table import Table

from loomrt.cli.common import friendly, out, print_json, print_result, runtime
from loomrt.cli.render import events_table

__all__ = ["runs_app"]

runs_app = typer.Typer(help="Runs in the record: list, show, events, resume, continue.", no_args_is_help=True)
JsonOpt = typer.Option(False, "--json", help="Machine-readable output.")


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


@runs_app.command("list")
@friendly
def list_cmd(
    limit: int = typer.Option(20, "--limit", help="How many runs, newest first."),
    agent: str | None = typer.Option(None, "--agent", help="Only this agent's runs."),
    json_output: bool = JsonOpt,
) -> None:
    """Recent runs, newest first."""
    from loomrt.record import default_store

    runs = default_store().list_runs(limit=limit, agent=agent)
    if json_output:
        print_json([r.model_dump(mode="json") for r in runs])
        return
    table = Table("run", "agent", "mode", "status", "events", "model", "started")
    for r in runs:
        table.add_row(r.run_id, r.agent, r.mode, r.status, str(r.last_seq), r.model, _when(r.created_at))
    out.print(table)


@runs_app.command("show")
@friendly
def show_cmd(run_id: str, json_output: bool = JsonOpt) -> None:
    """One run: definition hash, mode, status, usage, distillations, output and Σ."""
    from loomrt.run.projection import project

    rt = runtime()
    info = rt.store.get_run(run_id)
    events = rt.store.events(run_id)
    p = project(events)
    started = events[0].data if events else {}
    summary = {
        **info.model_dump(mode="json"),
        "requested_mode": started.get("requested_mode"),
        "tools": started.get("tools", []),
        "usage": {**p.usage.to_dict(), "model_calls": p.model_calls},
        "distillations": p.distillations,
        "declined": sum(e.kind == "distillation_declined" for e in events),
        "errors": [e.data.get("message") for e in events if e.kind == "error"],
        "output": p.output,
        "state": p.state,
        "working_context_messages": len(p.context),
    }
    if json_output:
        print_json(summary)
        return
    table = Table(show_header=False, box=None)
    for key in ("run_id", "agent", "status", "mode", "requested_mode", "model", "def_hash", "tools", "usage",
                "distillations", "declined", "errors", "working_context_messages", "output", "state"):
        table.add_row(f"[bold]{key}[/bold]", str(summary.get(key)))
    out.print(table)


@runs_app.command("events")
@friendly
def events_cmd(
    run_id: str,
    after: int = typer.Option(0, "--after", help="Only events with seq greater than this."),
    kind: list[str] = typer.Option(None, "--kind", help="Only events of these kinds."),
    json_output: bool = typer.Option(False, "--json", help="JSON lines, one event each."),
) -> None:
    """The run's record, event by event."""
    from loomrt.record import default_store

    store = default_store()
    store.get_run(run_id)
    events = store.events(run_id, after=after, kinds=kind or None)
    if json_output:
        for e in events:
            print_json(e.to_json_dict())
    else:
        out.print(events_table(events))


def _finish(result, json_output: bool) -> None:  # type: ignore[no-untyped-def]
    print_result(result, json_output)
    if result.status == "failed":
        raise typer.Exit(1)


@runs_app.command("resume")
@friendly
def resume_cmd(run_id: str, json_output: bool = JsonOpt) -> None:
    """Pick up a run that stopped mid-turn, from its record alone."""
    rt = runtime(show_events=not json_output)
    result = asyncio.run(rt.resume(run_id))
    _finish(result, json_output)


@runs_app.command("continue")
@friendly
def continue_cmd(run_id: str, prompt: str, json_output: bool = JsonOpt) -> None:
    """Add a new user input to an existing run and play it."""
    rt = runtime(show_events=not json_output)
    result = asyncio.run(rt.continue_run(run_id, prompt))
    _finish(result, json_output)
