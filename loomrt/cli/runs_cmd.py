"""``loomrt runs``: list, show, events, verify, resume, continue (pin, unpin and export: :mod:`loomrt.cli.audit_cmd`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from loomrt.cli._common import friendly, out, plural, print_json, print_result, runtime, took, when
from loomrt.cli._render import events_table, model_label
from loomrt.events import RunInfo

if TYPE_CHECKING:
    from loomrt.glance import Glance

__all__ = ["runs_app"]

runs_app = typer.Typer(
    help="Runs in the record: list, show, events, verify, resume, continue, cancel.", no_args_is_help=True
)
JsonOpt = typer.Option(False, "--json", help="Machine-readable output.")
IncludePrivateOpt = typer.Option(
    False, "--include-private", help="Private material whole, not its placeholders (loomrt.visibility)."
)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _at_a_glance(store: Any, r: RunInfo, g: Glance | None = None) -> tuple[str, str, str]:
    """A listed run's task (its first user input, shortened), how long it took (first event to
    last) and its tokens (its model calls', input and output), from :func:`loomrt.glance.glance`
    (or ``g``, read with the other rows by :func:`loomrt.glance.glances`)."""
    from loomrt.cli._render import short
    from loomrt.glance import glance

    g = g or glance(store, r)
    task = short(g.task, 40) if g.task is not None else f"(fork of {r.forked_from})" if r.forked_from else ""
    duration = took(g.seconds) if g.seconds is not None else ""
    return task, duration, f"{g.input_tokens + g.output_tokens:,}"


@runs_app.command("list")
@friendly
def list_cmd(
    limit: int = typer.Option(20, "--limit", help="How many runs, newest first."),
    agent: str | None = typer.Option(None, "--agent", help="Only this agent's runs."),
    json_output: bool = JsonOpt,
) -> None:
    """Recent runs, newest first: when each started (local time), how long it took, its tokens
    and its task (the first input), in the columns the terminal has room for (--json: each run's fields, its times as numbers)."""
    from loomrt.record import default_store

    store = default_store()
    runs = store.list_runs(limit=limit, agent=agent)
    if json_output:
        print_json([r.model_dump(mode="json") for r in runs])
        return
    from loomrt.glance import glances

    seen = glances(store, runs)  # every row's sums in one query
    rows = []
    for r in runs:
        task, duration, tokens = _at_a_glance(store, r, seen[r.run_id])
        rows.append(
            {
                "run": r.run_id,
                "agent": r.agent,
                "status": r.status,
                "started": when(r.created_at),
                "took": duration,
                "tokens": tokens,
                "events": str(r.last_seq),
                "mode": r.mode,
                "model": model_label(r.model),
                "task": task,
            }
        )
    out.print(_runs_table(rows, out.width))


_COLUMNS = ("run", "agent", "status", "started", "took", "tokens", "events", "mode", "model", "task")
_PRIORITY = ("run", "status", "started", "agent", "task", "took", "tokens", "model", "mode", "events")
"""Which columns a narrow terminal keeps first (the run id always, whole: it is typed back in)."""


def _runs_table(rows: list[dict[str, str]], width: int) -> Table:
    """The columns that fit ``width`` whole, in :data:`_PRIORITY` order; the agent cut at 24
    characters and the task to what is left, each with an ellipsis, one line per run."""
    natural = {c: max([len(c), *(len(row[c]) for row in rows)]) for c in _COLUMNS}
    natural["agent"] = min(natural["agent"], 24)
    natural["task"] = min(natural["task"], 12)  # at least this; it takes the room left over
    shown: list[str] = []
    used = -2  # two spaces between columns
    for c in _PRIORITY:
        if c == "run" or used + 2 + natural[c] <= width:
            shown.append(c)
            used += 2 + natural[c]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for c in _COLUMNS:
        if c in shown:
            table.add_column(
                c,
                no_wrap=True,
                overflow="ellipsis",
                justify="right" if c in ("took", "tokens", "events") else "left",
                max_width=24 if c == "agent" else width - used + natural["task"] if c == "task" else None,
            )
    for row in rows:
        table.add_row(*(escape(row[c]) for c in _COLUMNS if c in shown))
    return table
    out.print(table)


@runs_app.command("show")
@friendly
def show_cmd(
    run_id: str,
    seq: int | None = typer.Option(
        None, "--seq", help="Print this one event verbatim, with the distillations that covered it."
    ),
    full: bool = typer.Option(False, "--full", help="The transcript with the evicted messages too (dimmed)."),
    as_of: int | None = typer.Option(
        None, "--as-of", help="The working context exactly as the model saw it after this seq."
    ),
    prompt: int | None = typer.Option(
        None,
        "--prompt",
        help="The whole prompt the model call at this seq sent: the working context and, marked, "
        "the recalled passages injected into that call only.",
    ),
    include_private: bool = IncludePrivateOpt,
    json_output: bool = JsonOpt,
) -> None:
    """One run: its summary, pins and transcript, each distillation a marker between the messages
    (private material as placeholders unless --include-private)."""
    from loomrt.run.projection import project
    from loomrt.run.summary import run_summary
    from loomrt.visibility import private_record, redact_events

    rt = runtime()
    info = rt.store.get_run(run_id)
    events = rt.store.events(run_id)
    withheld: list[str] = []
    if not include_private:  # the one redaction every reader goes through (loomrt.visibility)
        private = private_record(rt.store, run_id)
        events, withheld = redact_events(events, private), private.state_withheld
    if seq is not None:
        _show_event(run_id, events, seq, json_output)
        return
    if as_of is not None:
        _show_as_of(run_id, events, as_of, json_output)
        return
    if prompt is not None:
        _show_prompt(run_id, events, prompt, json_output)
        return
    summary = run_summary(info, events, rt.store)
    view = project(events, store=rt.store)
    pins = [p.to_json() for p in view.pins.values()]
    standing = ((events[0].data.get("definition") or {}).get("context") or {}).get("pins") or [] if events else []
    if json_output:
        withholds = {"state_withheld": withheld} if withheld and summary.get("state") is not None else {}
        print_json({**summary, **withholds, "pins": pins, "definition_pins": standing, "private": sorted(view.private)})
        return
    table = Table(show_header=False, box=None)
    for key in (
        "run_id",
        "agent",
        "status",
        "mode",
        "requested_mode",
        "model",
        "def_hash",
        "distillations",
        "declined",
        "summaries_rejected",
        "working_context_messages",
    ):
        value = summary.get(key)
        table.add_row(f"[bold]{key}[/bold]", escape(model_label(value) if key == "model" else str(value)))
    table.add_row("[bold]tools[/bold]", ", ".join(summary["tools"]) or "none")
    if summary.get("forked_from"):
        table.add_row("[bold]forked from[/bold]", f"{summary['forked_from']} at #{summary.get('fork_seq')}")
    state = summary.get("mode_state")
    if state:

        def when(t: float | None) -> str:
            return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if t else "never"

        failure = state.get("last_failure") or {}
        table.add_row(
            f"[bold]{summary['mode']}[/bold]",
            (
                f"{plural(state.get('cards', 0), 'card')} · "
                f"{'folding now' if state.get('running') else 'a fold is pending' if state.get('pending') else 'nothing pending'} · "
                f"last success {when(state.get('last_success'))}"
                + (
                    f" · last failure {when(failure.get('at'))}: {escape(str(failure.get('error') or failure.get('reason')))}"
                    if failure
                    else ""
                )
                + (f" · paused until {when(state['paused_until'])}" if state.get("paused_until") else "")
            ),
        )
    if summary.get("parent_run_id"):
        table.add_row("[bold]parent[/bold]", f"{summary['parent_run_id']} (root {summary.get('root_run_id')})")
    if summary.get("children"):
        kids = summary["usage"]["children"]
        table.add_row(
            "[bold]children[/bold]",
            f"{', '.join(summary['children'])} ({kids['input_tokens']} input, "
            f"{kids['output_tokens']} output tokens in all)",
        )
    out.print(table)
    usage = Table("input tokens", "output tokens", "cached tokens", "model calls", title="usage", title_justify="left")
    u = summary["usage"]
    usage.add_row(*(str(u.get(k, 0)) for k in ("input_tokens", "output_tokens", "cached_tokens", "model_calls")))
    out.print(usage)
    for message in summary["errors"]:
        out.print(f"[red]error:[/red] {escape(message or '')}")
    if view.output is not None:
        out.print("[bold]output[/bold]")
        out.print(view.output, markup=False, highlight=False)
    if view.state is not None:
        out.print("[bold]state Σ[/bold]" + (f" (withheld: {', '.join(withheld)})" if withheld else ""))
        out.print_json(json.dumps(view.state, ensure_ascii=False))
    if pins or standing:
        out.print("[bold]pins[/bold]")
        for text in standing:
            out.print(f"  definition: {escape(text)}", highlight=False)
        for p in pins:
            note = f" · {escape(p['note'])}" if p["note"] else ""
            out.print(f"  {p['id']} by {p['by']} ({plural(p['tokens'], 'token')}){note}", highlight=False)
    _print_transcript(events, full=full)


def _print_transcript(events: list, *, full: bool) -> None:  # type: ignore[type-arg]
    """Messages in record order with each distillation as a marker; evicted ones only with --full."""
    from loomrt.audit import Marker, transcript

    out.rule("transcript" + (" (everything the record holds; evicted messages dimmed)" if full else ""))
    hidden = 0
    for item in transcript(events):
        if isinstance(item, Marker):
            if hidden:
                out.print(f"[dim]… {plural(hidden, 'evicted message')} (--full shows them)[/dim]")
                hidden = 0
            span = f"#{item.covered[0]}–#{item.covered[-1]}" if item.covered else "nothing"
            out.rule(
                f"distillation #{item.seq} · {item.mode} · covered {span} ({plural(len(item.covered), 'message')}) · "
                f"{item.tokens_before} → {item.tokens_after} tokens",
                style="cyan",
            )
            for block in item.worked_from:
                out.print(escape(block), style="cyan", highlight=False)
            out.rule(style="cyan")
            continue
        if item.evicted_by and not full:
            hidden += 1
            continue
        who = f"tool result · {item.name}" if item.role == "tool" else item.role
        who += " · private" if item.private else ""
        calls = f" → {', '.join(item.tool_calls)}" if item.tool_calls else ""
        style = "dim" if item.evicted_by else ""
        out.print(f"[bold]#{item.seq} {escape(who)}[/bold]{escape(calls)}", style=style, highlight=False)
        if item.text:
            out.print(item.text, markup=False, highlight=False, style=style)
    if hidden:
        out.print(f"[dim]… {plural(hidden, 'evicted message')} (--full shows them)[/dim]")


def _show_as_of(run_id: str, events: list, seq: int, json_output: bool) -> None:  # type: ignore[type-arg]
    """The working context after event ``seq``, as the projection rebuilds it."""
    from loomrt.audit import context_as_of
    from loomrt.errors import NotFoundError

    if not events or not 1 <= seq <= events[-1].seq:
        raise NotFoundError(f"run {run_id} has no event #{seq} (its record ends at #{events[-1].seq if events else 0})")
    context = context_as_of(events, seq, runtime().store)
    if json_output:
        print_json({"run_id": run_id, "as_of": seq, "context": [m.to_dict() for m in context]})
        return
    out.rule(f"run {run_id}: the working context after #{seq} ({plural(len(context), 'message')})")
    for m in context:
        where = f"#{m.seq}" if m.seq is not None and m.synthetic is None else (m.synthetic or "synthetic")
        out.print(f"[bold]{where} {escape(m.role)}[/bold]", highlight=False)
        out.print(m.content, markup=False, highlight=False)


def _show_prompt(run_id: str, events: list, seq: int, json_output: bool) -> None:  # type: ignore[type-arg]
    """The prompt of the turn call at ``seq``, as the record derives it (injected block marked)."""
    from loomrt.audit import prompt_as_of
    from loomrt.errors import NotFoundError
    from loomrt.injection import INJECTED

    try:
        prompt = prompt_as_of(events, seq, runtime().store)
    except ValueError as exc:
        raise NotFoundError(f"run {run_id}: {exc}") from None
    if json_output:
        print_json({"run_id": run_id, "prompt_of": seq, "prompt": [m.to_dict() for m in prompt]})
        return
    out.rule(f"run {run_id}: the prompt of the model call #{seq} ({plural(len(prompt), 'message')})")
    for m in prompt:
        if m.synthetic == INJECTED:
            out.print("[bold magenta]▶ injected for this call only (recall_injected)[/bold magenta]", highlight=False)
        where = f"#{m.seq}" if m.seq is not None and m.synthetic is None else (m.synthetic or "synthetic")
        out.print(f"[bold]{where} {escape(m.role)}[/bold]", highlight=False)
        out.print(m.content, markup=False, highlight=False)


def _show_event(run_id: str, events: list, seq: int, json_output: bool) -> None:  # type: ignore[type-arg]
    """One event verbatim, and the distillations whose span covered it."""
    from loomrt.errors import NotFoundError

    event = next((e for e in events if e.seq == seq), None)
    if event is None:
        raise NotFoundError(f"run {run_id} has no event #{seq} (its record ends at #{events[-1].seq if events else 0})")
    covered = [e.seq for e in events if e.kind == "distillation" and seq in (e.data.get("span_seqs") or [])]
    if json_output:
        print_json({**event.to_json_dict(), "distilled_by": covered})
        return
    out.print(f"[bold]#{event.seq} {event.kind}[/bold] · {_when(event.ts)}", highlight=False)
    content = event.data.get("content")
    if content is None and event.kind == "assistant_message":
        content = (event.data.get("message") or {}).get("content")
    if isinstance(content, str):
        out.print(content, markup=False, highlight=False)
        rest = {k: v for k, v in event.data.items() if k != "content"}
        if rest and event.kind != "assistant_message":
            out.print_json(json.dumps(rest, ensure_ascii=False, default=str))
    else:
        out.print_json(json.dumps(event.data, ensure_ascii=False, default=str))
    where = ", ".join(f"#{s}" for s in covered) if covered else "none (it is in the working context, or not a message)"
    out.print(f"[dim]evicted by distillation {where}[/dim]", highlight=False)


@runs_app.command("events")
@friendly
def events_cmd(
    run_id: str,
    after: int = typer.Option(0, "--after", help="Only events with seq greater than this."),
    kind: list[str] = typer.Option(None, "--kind", help="Only events of these kinds."),
    include_private: bool = IncludePrivateOpt,
    json_output: bool = typer.Option(False, "--json", help="JSON lines, one event each."),
) -> None:
    """The run's record, event by event (private material as placeholders unless --include-private)."""
    from loomrt.record import default_store
    from loomrt.visibility import reader_events

    store = default_store()
    store.get_run(run_id)
    events = reader_events(store, run_id, include_private=include_private, after=after, kinds=kind or None)
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


@runs_app.command("fork")
@friendly
def fork_cmd(
    run_id: str,
    at: int | None = typer.Option(None, "--at", help="The seq to fork at (default: the run's last)."),
    json_output: bool = JsonOpt,
) -> None:
    """A new run sharing RUN_ID's history up to --at, parked for its next input (`runs continue`)."""
    rt = runtime()
    run = asyncio.run(rt.fork(run_id, at=at))
    if json_output:
        print_json(
            {
                "run_id": run.run_id,
                "forked_from": {"run_id": run_id, "seq": run.view.fork_seq},
                "mode": run.mode.name,
                "context_tokens": run.estimate(),
            }
        )
        return
    out.print(
        f"forked {run_id} at #{run.view.fork_seq}: run {run.run_id} ({run.mode.name}); "
        f'`loomrt runs continue {run.run_id} "..."` goes on from there',
        highlight=False,
    )


@runs_app.command("refold")
@friendly
def refold_cmd(
    run_id: str,
    fallback_only: bool = typer.Option(
        False, "--fallback-only", help="Rewrite only fallback cards (and those above one)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Write the new cards with this model (default: the run's summariser)."
    ),
    json_output: bool = JsonOpt,
) -> None:
    """Write new cards for a fold run's catalog; the old cards stay on the record."""
    result = asyncio.run(runtime().refold(run_id, fallback_only=fallback_only, model=model))
    if json_output:
        print_json(result)
        return
    out.print(
        f"run {run_id}: {plural(result['refolded'], 'card')} rewritten, {result['tokens_before']} → "
        f"{plural(result['tokens_after'], 'token')}, {plural(result['fallbacks_left'], 'fallback card')} left"
        + (f" ({result['reason']})" if result["reason"] else ""),
        highlight=False,
    )


@runs_app.command("continue")
@friendly
def continue_cmd(run_id: str, prompt: str, json_output: bool = JsonOpt) -> None:
    """Add a new user input to an existing run and play it."""
    rt = runtime(show_events=not json_output)
    result = asyncio.run(rt.continue_run(run_id, prompt))
    _finish(result, json_output)


@runs_app.command("cancel")
@friendly
def cancel_cmd(
    run_id: str = typer.Argument(..., help="The run to stop (`loomrt runs list` shows them)."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Cancel an active run that no worker claims (its process died; or a foreground run, which will not stop).",
    ),
    json_output: bool = JsonOpt,
) -> None:
    """Stop a run that has not ended: a queued one (`run --detach`) is never played, a parked one
    takes no more input, and one that a worker plays (here or on another machine) stops at its next
    step. The record gets `cancelled` (the same path as MCP `cancel_run`). An active run that no
    worker claims (a foreground `loomrt run` or chat) cannot be stopped from here: stop it where it
    runs (Ctrl-C), or `--force` if its process is gone."""
    from loomrt.errors import SpecError
    from loomrt.record.owners import worker_name

    rt = runtime()
    status = rt.store.get_run(run_id).status
    if status in ("done", "failed", "cancelled"):
        raise SpecError(
            f"run {run_id} has already ended ({status}): there is nothing to cancel. "
            f"`loomrt runs show {run_id}` shows how it ended; `loomrt runs continue {run_id} ...` gives it a new input."
        )
    unclaimed = status == "active" and not any(c["run_id"] == run_id for c in rt.coordination.run_owners())
    if unclaimed and not force:  # a foreground run checks no one's cancel: it would play on after it
        raise SpecError(
            f"run {run_id} is active and no worker claims it: it plays in a foreground process "
            "(`loomrt run` or `loomrt chat`), which does not look for a cancel from elsewhere. Stop it "
            f"there (Ctrl-C). If that process is gone, `loomrt runs cancel {run_id} --force` records the cancel."
        )
    rt.owner = rt.owner or worker_name()  # written through the run's claim, as a worker's would be
    result = asyncio.run(rt.cancel(run_id, reason="runs cancel"))
    if json_output:
        print_json(result.to_json())
        return
    out.print(f"run {run_id}: {result.status}", highlight=False)
