"""``loomrt``: run agents, chat with them, and inspect what happened.

Commands: run, chat, agents (list, validate, schema, fork, promote), runs (list, show,
events, resume, continue), recall, consolidate, memory (search, list, show, forget,
calibrate), db (status, migrate, copy), workers (list), bench, mcp, worker, doctor. Every inspection command takes --json.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from pathlib import Path
from typing import Any

import typer

from loomrt.cli import (
    audit_cmd,  # noqa: F401 - registers `loomrt runs pin`, `unpin`, `export`
    ledger_cmd,  # noqa: F401 - registers `loomrt runs verify`, `anchor`
)
from loomrt.cli._common import (
    err,
    friendly,
    load,
    out,
    playing,
    plural,
    print_json,
    print_result,
    runtime,
    terminal,
)
from loomrt.cli._help import plain_metavars
from loomrt.cli._prompt import LineReader
from loomrt.cli._screen import Screen
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
from loomrt.cli.ui_cmd import ui_cmd
from loomrt.errors import SpecError

__all__ = ["app", "main"]

plain_metavars()  # --help writes TEXT, INTEGER, PATH (and nothing for a flag), not <str>, <bool>

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


def _version(value: bool) -> None:
    """``loomrt --version``: the installed version, and exit."""
    if not value:
        return
    import importlib.metadata

    try:
        version = importlib.metadata.version("loomrt")
    except importlib.metadata.PackageNotFoundError:  # a checkout on the path, not installed
        from loomrt import __version__ as version
    out.print(f"loomrt {version}", highlight=False)
    raise typer.Exit()


@app.callback()
def _root(
    db_url: str | None = typer.Option(
        None,
        "--db-url",
        help="The record's database for this command: sqlite:PATH or postgresql://... "
        "(default $LOOMRT_DB_URL, else $LOOMRT_HOME/record.sqlite).",
    ),
    version: bool = typer.Option(
        False, "--version", help="Print the installed version and exit.", is_eager=True, callback=_version
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
    events: bool = typer.Option(
        False, "--events", help="Each event as a line on stderr as it is recorded (off a terminal, always so)."
    ),
) -> None:
    """Run an agent once on PROMPT and print its answer: on a terminal, the answer streams
    under a status line; elsewhere each event is a line on stderr, and the answer follows."""
    path, defs = load(agents)
    live = not (json_output or quiet or detach or events) and terminal(sys.stderr)
    screen = Screen(stream=terminal(sys.stdout), status=True) if live else None
    rt = runtime(show_events=not (json_output or quiet or live), user=user, screen=screen)
    if detach:
        from loomrt.worker import detach as queue_run

        queued = asyncio.run(queue_run(rt, agent, prompt, agents=defs, mode=mode, agents_file=str(path.resolve())))
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
    if screen is not None:
        screen.attach(run)
    with screen.turn() if screen is not None else contextlib.nullcontext():
        result = asyncio.run(rt.send(run, prompt))
    if json_output:
        print_json(result.to_json())
    elif result.output is not None and result.status != "failed":
        if screen is not None:
            screen.answer(result.output)
        else:
            out.print(result.output, markup=False, highlight=False)
    if result.status == "failed":
        if screen is not None:
            screen.close_line()
        if not json_output:
            err.print(f"[red]error:[/red] {result.error}", highlight=False)
            err.print(f"The record keeps everything: `loomrt runs resume {result.run_id}` retries from there.")
        raise typer.Exit(1)


@app.command("chat")
@friendly
def chat_cmd(
    agent: str | None = typer.Argument(
        None, help="The agent's name in the agents file (with --continue, optional: the run knows its agent)."
    ),
    agents: Path | None = AgentsOpt,
    mode: str | None = ModeOpt,
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object per turn."),
    user: str | None = UserOpt,
    reopen: str | None = typer.Option(
        None,
        "--continue",
        metavar="RUN_ID",
        help="Reopen this earlier chat, its history intact: the next input goes on with the same run.",
    ),
    last: bool = typer.Option(
        False, "--last", "-c", help="Reopen the newest chat with AGENT in the record (without AGENT: with any agent)."
    ),
) -> None:
    """Talk with an agent: its answers stream under a status line, and the input line edits
    and keeps history. Without a TTY, each line of stdin is one user turn."""
    screen = None if json_output else Screen(stream=terminal(sys.stdout), status=terminal(sys.stderr))
    rt = runtime(user=user, screen=screen)
    if reopen is not None or last:
        run = _reopen_chat(rt, agent, reopen, last=last, mode=mode, user=user)
    elif agent is None:
        raise SpecError("name the AGENT to chat with, or reopen a chat: --continue RUN_ID, or -c (the newest)")
    else:
        path, defs = load(agents)
        run = rt.start(agent, agents=defs, mode=mode, interactive=True, agents_file=str(path.resolve()))
        playing(run.run_id, chat=True)
    tty = _tty()
    if screen is not None:
        screen.attach(run)
    reader = LineReader(toolbar=screen.toolbar if screen is not None else None) if tty and not json_output else None
    if tty and not json_output:
        if reopen is not None or last:
            turns = plural(len(rt.store.events(run.run_id, kinds=["user_input"])), "turn")
            err.print(
                f"[dim]reopened run {run.run_id} · agent {run.agent} · {turns} so far · mode {run.mode.name} · "
                "Ctrl-D to end[/dim]",
                highlight=False,
            )
        else:
            err.print(f"[dim]run {run.run_id} · mode {run.mode.name} · Ctrl-D to end[/dim]", highlight=False)
    failed = 0
    failed_between: list[BaseException] = []

    from loomrt.run.between_turns import between_turns

    def distil_between() -> None:
        try:
            asyncio.run(between_turns(run, rt.coordination, read_ahead=True))
        except BaseException as exc:  # noqa: BLE001 - raised after the join, in the chat's own thread
            failed_between.append(exc)

    while True:
        background = threading.Thread(target=distil_between, daemon=True)
        background.start()  # a queued distillation runs while the next input is typed
        line = reader.read() if reader is not None else _read_turn()
        background.join()
        if failed_between:  # the run's claim was lost meanwhile: one clear error, not a stray traceback
            raise failed_between[0]
        if line is None:
            break
        if not line.strip():
            continue
        result = _turn(rt, run, line, screen)
        if screen is not None and result.status != "failed":
            screen.answer(result.output)
        else:
            if screen is not None:
                screen.close_line()
            print_result(result, json_output)
        if result.status == "failed":  # shown and recorded; the run parked, and the next input continues it
            failed += 1
            if not json_output:
                err.print("[dim]the turn failed; the chat goes on (type your next message, or Ctrl-D to end)[/dim]")
    if screen is not None:
        screen.flush()  # what the last work between turns did
    if run.view.status not in ("done", "failed", "cancelled"):  # a chat reopened and left at once stays as it was
        rt.finish(run)
    if tty and not json_output:
        err.print(
            f"[dim]run {run.run_id} saved · `loomrt runs show {run.run_id}` · "
            f"`loomrt chat --continue {run.run_id}` reopens it[/dim]",
            highlight=False,
        )
    if failed:
        raise typer.Exit(1)


def _tty() -> bool:
    """Whether a person types the chat (stdin is a terminal): then it prompts and tells."""
    return sys.stdin.isatty()


def _reopen_chat(
    rt: Any, agent: str | None, run_id: str | None, *, last: bool, mode: str | None, user: str | None
) -> Any:
    """The chat ``chat --continue RUN_ID`` (or ``-c``: the newest of ``agent``'s) names, opened
    from its record to take the next input, as :meth:`Runtime.send` goes on with a reopened run."""
    if run_id is None:
        run_id = _newest_chat(rt.store, agent)
    elif last:
        raise SpecError("give --continue RUN_ID or -c (the newest chat), not both")
    info = rt.store.get_run(run_id)  # no such run: one line, exit 2
    if not info.interactive:
        raise SpecError(
            f"run {run_id} is not a chat (a one-shot run of {info.agent}): "
            f'`loomrt runs continue {run_id} "..."` adds a turn to it'
        )
    if agent is not None and info.agent != agent:
        raise SpecError(f"run {run_id} is a chat with {info.agent}, not {agent}")
    if mode is not None:
        raise SpecError(f"--mode is for a new chat: run {run_id} keeps the mode it was started in ({info.mode})")
    started = rt.store.latest(run_id, "run_started")
    recorded = started.data.get("user") if started is not None else None
    if user is not None and (user.strip() or None) != recorded:
        raise SpecError(f"run {run_id} works for {recorded or 'no user'}, not {user}: a reopened chat keeps its user")
    playing(run_id, chat=True)
    run = asyncio.run(rt.aopen(run_id))
    if run.view.status in ("parked", "done", "failed", "cancelled"):
        rt.claim(run)  # the next input opens the next turn (after a resumed where the run had ended)
        return run
    # stopped mid-turn (Ctrl-C, a crash): resumed, its interrupted tool calls closed
    return asyncio.run(rt.reopen(run_id, interactive=True))


def _newest_chat(store: Any, agent: str | None) -> str:
    """The newest top-level interactive run (of ``agent``) in the record, for ``chat -c``."""
    limit = 50
    while True:
        runs = store.list_runs(limit=limit, agent=agent)
        found = next((r for r in runs if r.interactive and r.parent_run_id is None), None)
        if found is not None:
            return str(found.run_id)
        if len(runs) < limit:
            raise SpecError(
                f"no earlier chat with {agent} in the record: `loomrt chat {agent}` starts one"
                if agent
                else "no earlier chat in the record: `loomrt chat AGENT` starts one"
            )
        limit *= 10


def _read_turn() -> str | None:
    """One line of stdin (a chat that no person types), or None at its end."""
    line = sys.stdin.readline()
    return line.rstrip("\n") if line else None


def _turn(rt: Any, run: Any, line: str, screen: Screen | None) -> Any:
    """Play one turn of the chat, drawn live on ``screen`` where there is one."""
    with screen.turn() if screen is not None else contextlib.nullcontext():
        return asyncio.run(rt.send(run, line))


# recall, doctor, mcp and bench import their heavy libraries (torch, litellm) only when they run.
app.command("recall")(friendly(recall))
app.command("doctor")(friendly(doctor))
app.command("ui")(ui_cmd)


@app.command("worker")
@friendly
def worker_cmd(
    once: bool = typer.Option(False, "--once", help="Do what is queued now, then exit."),
    interval_s: float = typer.Option(
        5.0,
        "--interval",
        help="Seconds between looks at the queue (on PostgreSQL, a new job wakes it sooner).",
        min=0.1,
    ),
    concurrency: int = typer.Option(1, "--concurrency", help="Runs played at once.", min=1),
    consolidate: bool = typer.Option(
        True,
        "--consolidate/--no-consolidate",
        help="Also drain the harvest queue into durable memory (as `loomrt consolidate`).",
    ),
    model: str | None = typer.Option(
        None, "--model", help="The extraction model (default: $LOOMRT_HARVEST_MODEL, else the embedded local model)."
    ),
    json_output: bool = typer.Option(False, "--json", help="One JSON object per run looked at."),
    grace_s: float = typer.Option(
        30.0,
        "--grace-s",
        help="On SIGTERM: seconds the work in flight has to finish; what has not is handed back "
        "(its claims let go, for any worker to resume), and the worker exits 0 within them.",
        min=1.0,
    ),
    heartbeat_timeout_s: float = typer.Option(
        30.0,
        "--heartbeat-timeout-s",
        help="A run this worker plays is renewed every third of this; once its heartbeat is this old "
        "(the worker died or hung), any other worker resumes it.",
        min=1.0,
    ),
) -> None:
    """Do the background work of runs that are not playing: queued runs (`run --detach`), queued folds,
    consolidation. It waits out a database restart (looking again with a backoff), and stops on SIGTERM
    within `--grace-s`."""
    from loomrt.worker import work, work_once_then_stop
    from loomrt.worker_life import Stopping

    rt = runtime()
    rt.claim_ttl_s, rt.heartbeat_s = heartbeat_timeout_s, heartbeat_timeout_s / 3  # a dead worker's run moves on soon
    consolidator = None
    from loomrt.harvest.db import has_place

    if consolidate and has_place(rt.store):
        from loomrt.harvest.consolidator import Consolidator

        consolidator = Consolidator(rt.store, model=model, holder=rt.owner)

    def tell(row: dict[str, Any]) -> None:
        if json_output:
            print_json(row)
        elif row["work"] == "reconnect":
            err.print(f"[dim]{row['reason']}[/dim]", highlight=False)
        elif row["work"] == "consolidate":
            out.print(
                f"consolidated {plural(row['spans'], 'span')} in {plural(row['batches'], 'batch', 'batches')}: "
                f"{plural(sum(row['facts'].values()), 'fact')}"
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
                f"run {row['run_id']}: folded, {row['tokens_before']} → {plural(row['tokens_after'], 'token')}",
                highlight=False,
            )
        else:
            out.print(f"run {row['run_id']}: not now ({row['reason']})", highlight=False)

    stopping = Stopping(grace_s)
    stopping.install()
    from loomrt.record.postgres import PostgresStore

    if isinstance(rt.store, PostgresStore):  # the queue is procrastinate's there (loomrt.jobs)
        from loomrt.jobs.engine import serve

        if not (once or json_output):
            err.print(f"[dim]loomrt worker {rt.owner or ''}: waiting for jobs · Ctrl-C to stop[/dim]")
        with contextlib.suppress(KeyboardInterrupt):
            serve(
                rt,
                tell=tell,
                concurrency=concurrency,
                consolidator=consolidator,
                interval_s=interval_s,
                heartbeat_timeout_s=heartbeat_timeout_s,
                stopping=stopping,
                once=once,
            )
        return
    if once:
        work_once_then_stop(rt, tell=tell, concurrency=concurrency, consolidator=consolidator, stopping=stopping)
        return
    if not json_output:
        err.print(f"[dim]loomrt worker {rt.owner or ''}: looking every {interval_s:g} s · Ctrl-C to stop[/dim]")
    try:
        work(
            rt, interval_s=interval_s, tell=tell, concurrency=concurrency, consolidator=consolidator, stopping=stopping
        )
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
