"""``loomrt``: run agents, chat with them, and inspect what happened.

Commands: run, chat, agents (list, validate, schema, fork, promote), runs (list, show,
events, resume, continue), recall, consolidate, memory (search, list, show, forget,
calibrate), db (status, migrate, copy), workers (list), bench, mcp, worker, doctor. Every inspection command takes --json.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import typer

from loomrt.cli import (
    audit_cmd,  # noqa: F401 - registers `loomrt runs pin`, `unpin`, `export`
    ledger_cmd,  # noqa: F401 - registers `loomrt runs verify`, `anchor`
)
from loomrt.cli._common import err, friendly, load, out, print_json, print_result, runtime
from loomrt.cli.agents_cmd import agents_app
from loomrt.cli.bench_chaos_cmd import chaos_cmd  # noqa: F401 - registers `loomrt bench chaos`
from loomrt.cli.bench_cmd import bench_app
from loomrt.cli.bench_harvest_cmd import harvest_cmd  # noqa: F401 - registers `loomrt bench harvest`
from loomrt.cli.bench_qa_cmd import qa_cmd  # noqa: F401 - registers `loomrt bench qa`
from loomrt.cli.db_cmd import db_app, workers_app
from loomrt.cli.doctor import doctor
from loomrt.cli.mcp_cmd import mcp_cmd
from loomrt.cli.memory_cmd import consolidate_cmd, memory_app
from loomrt.cli.recall_cmd import recall
from loomrt.cli.runs_cmd import runs_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="loomrt",
    help="An agent runtime whose agents outlast their context window without forgetting.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(agents_app, name="agents")
app.add_typer(runs_app, name="runs")
app.add_typer(memory_app, name="memory")
app.add_typer(db_app, name="db")
app.add_typer(workers_app, name="workers")


@app.callback()
def _root(
    db_url: str | None = typer.Option(
        None,
        "--db-url",
        help="The record's database for this command: sqlite:PATH or postgresql://... "
        "(default $LOOMRT_DB_URL, else $LOOMRT_HOME/record.sqlite).",
    ),
) -> None:
    """An agent runtime whose agents outlast their context window without forgetting."""
    if db_url:
        import os

        os.environ["LOOMRT_DB_URL"] = db_url


app.command("consolidate")(consolidate_cmd)

AgentsOpt = typer.Option(None, "--agents", help="The agents file (default ./agents.yaml, else $LOOMRT_AGENTS).")
ModeOpt = typer.Option(None, "--mode", help="Override context.mode: append, recap, stateful, compaction, fold, auto.")
JsonOpt = typer.Option(False, "--json", help="Print one JSON object instead of rendering events.")
QuietOpt = typer.Option(False, "--quiet", "-q", help="Print only the answer.")
UserOpt = typer.Option(None, "--user", help="Whom the run works for: its `user` memory scope (default $LOOMRT_USER).")


@app.command("run")
@friendly
def run_cmd(
    agent: str = typer.Argument(..., help="The agent's name in the agents file."),
    prompt: str = typer.Argument(..., help="The task."),
    agents: Path | None = AgentsOpt,
    mode: str | None = ModeOpt,
    json_output: bool = JsonOpt,
    quiet: bool = QuietOpt,
    user: str | None = UserOpt,
    detach: bool = typer.Option(
        False,
        "--detach",
        help="Record the run and its input, queued for any `loomrt worker` to play; print its id and return at once.",
    ),
) -> None:
    """Run an agent once on PROMPT and print its answer."""
    path, defs = load(agents)
    rt = runtime(show_events=not (json_output or quiet), user=user)
    if detach:
        queued = asyncio.run(rt.detach(agent, prompt, agents=defs, mode=mode, agents_file=str(path.resolve())))
        if json_output:
            print_json({"run_id": queued.run_id, "status": "queued"})
        else:
            out.print(
                queued.run_id
                if quiet
                else f"run {queued.run_id} queued: any `loomrt worker` on this record "
                f"plays it (`loomrt runs show {queued.run_id}` follows it)",
                highlight=False,
            )
        return
    run = rt.start(agent, agents=defs, mode=mode, agents_file=str(path.resolve()))
    result = asyncio.run(rt.send(run, prompt))
    if json_output:
        print_json(result.to_json())
    elif result.output is not None and result.status != "failed":
        out.print(result.output, markup=False, highlight=False)
    if result.status == "failed":
        if not json_output:
            err.print(f"[red]error:[/red] {result.error}", highlight=False)
            err.print(f"The record keeps everything: `loomrt runs resume {result.run_id}` retries from there.")
        raise typer.Exit(1)


@app.command("chat")
@friendly
def chat_cmd(
    agent: str = typer.Argument(..., help="The agent's name in the agents file."),
    agents: Path | None = AgentsOpt,
    mode: str | None = ModeOpt,
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object per turn."),
    user: str | None = UserOpt,
) -> None:
    """Talk with an agent. Without a TTY, each line of stdin is one user turn."""
    path, defs = load(agents)
    rt = runtime(user=user)
    run = rt.start(agent, agents=defs, mode=mode, interactive=True, agents_file=str(path.resolve()))
    tty = sys.stdin.isatty()
    if tty and not json_output:
        err.print(f"[dim]run {run.run_id} · mode {run.mode.name} · Ctrl-D to end[/dim]")
    failed = 0
    while True:
        background = threading.Thread(target=lambda: asyncio.run(rt.between_turns(run)), daemon=True)
        background.start()  # a queued fold runs while the next input is typed
        line = _read_turn(tty and not json_output)
        background.join()
        if line is None:
            break
        if not line.strip():
            continue
        result = asyncio.run(rt.send(run, line))
        print_result(result, json_output)
        if result.status == "failed":  # shown and recorded; the run parked, and the next input continues it
            failed += 1
            if not json_output:
                err.print("[dim]the turn failed; the chat goes on (type your next message, or Ctrl-D to end)[/dim]")
    rt.finish(run)
    if tty and not json_output:
        err.print(f"[dim]run {run.run_id} saved · `loomrt runs show {run.run_id}`[/dim]")
    if failed:
        raise typer.Exit(1)


def _read_turn(prompt: bool) -> str | None:
    try:
        if prompt:
            return input("you> ")
        line = sys.stdin.readline()
        return line.rstrip("\n") if line else None
    except EOFError:
        return None


# recall, doctor, mcp and bench import their heavy libraries (torch, litellm) only when they run.
app.command("recall")(friendly(recall))
app.command("doctor")(friendly(doctor))


@app.command("worker")
@friendly
def worker_cmd(
    once: bool = typer.Option(False, "--once", help="Do what is queued now, then exit."),
    interval_s: float = typer.Option(
        5.0, "--interval", help="Seconds between looks at the queue (on PostgreSQL, a NOTIFY wakes it sooner).", min=0.1
    ),
    concurrency: int = typer.Option(1, "--concurrency", help="Runs played at once.", min=1),
    consolidate: bool = typer.Option(
        True,
        "--consolidate/--no-consolidate",
        help="Also drain the harvest queue into durable memory (as `loomrt consolidate`).",
    ),
    model: str | None = typer.Option(None, "--model", help="The extraction model (default: the embedded local model)."),
    json_output: bool = typer.Option(False, "--json", help="One JSON object per run looked at."),
) -> None:
    """Do the background work of runs that are not playing: queued runs (`run --detach`), queued folds,
    consolidation."""
    from loomrt.worker import work, work_once

    rt = runtime()
    consolidator = None
    from loomrt.harvest.db import has_place

    if consolidate and has_place(rt.store):
        from loomrt.harvest.consolidator import Consolidator

        consolidator = Consolidator(rt.store, model=model, holder=rt.owner)

    def tell(row: dict[str, Any]) -> None:
        if json_output:
            print_json(row)
        elif row["work"] == "consolidate":
            out.print(
                f"consolidated {row['spans']} span(s) in {row['batches']} batch(es): "
                f"{sum(row['facts'].values())} fact(s)"
                if row["done"]
                else f"consolidation: {row['reason']}",
                highlight=False,
            )
        elif row["done"] and row["work"] in ("play", "resume"):
            out.print(
                f"run {row['run_id']}: {'played' if row['work'] == 'play' else 'resumed'}, {row['status']}",
                highlight=False,
            )
        elif row["done"]:
            out.print(
                f"run {row['run_id']}: folded, {row['tokens_before']} → {row['tokens_after']} tokens", highlight=False
            )
        else:
            out.print(f"run {row['run_id']}: not now ({row['reason']})", highlight=False)

    if once:
        asyncio.run(work_once(rt, tell=tell, concurrency=concurrency, consolidator=consolidator))
        return
    if not json_output:
        err.print(f"[dim]loomrt worker {rt.owner or ''}: looking every {interval_s:g} s · Ctrl-C to stop[/dim]")
    try:
        work(rt, interval_s=interval_s, tell=tell, concurrency=concurrency, consolidator=consolidator)
    except KeyboardInterrupt:
        pass


app.command("mcp")(mcp_cmd)
app.add_typer(bench_app, name="bench")


def main(argv: Any = None) -> None:
    """The console script."""
    from loomrt._log import configure_logging
    from loomrt.providers.offline import configure_offline

    configure_offline()
    configure_logging()
    app(args=argv)
