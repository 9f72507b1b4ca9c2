"""``loomrt consolidate`` and ``loomrt memory add|search|list|show|forget|erase-private|calibrate``.

The consolidator drains the harvest queue of the default record into durable memory with
the embedded local model (or ``--model``); the memory commands are the operator's view of
durable memory (every scope: scopes bind agents, not the operator). The embedder is the
default (all-MiniLM-L6-v2) unless ``LOOMRT_RECALL_EMBEDDER`` says otherwise; consolidate
and search with the same one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from loomrt.cli._common import err, friendly, out, plural, print_json, when

__all__ = ["consolidate_cmd", "memory_app"]

memory_app = typer.Typer(
    help="Durable memory: add, search, list, show, forget, erase-private, calibrate.", no_args_is_help=True
)

_SCOPE = typer.Option(
    None, "--scope", help="A scope, KIND:IDENTITY (user:alice, agent:NAME, project:NAME); repeatable."
)
_JSON = typer.Option(False, "--json", help="Print JSON.")


def _memory() -> Any:
    from loomrt.harvest.wiring import memory_store
    from loomrt.record.sqlite import default_store

    store = _file_store(default_store())
    return store, memory_store(store)


def _file_store(store: Any) -> Any:
    """``store``, if durable memory can live beside it (a SQLite file or PostgreSQL)."""
    from loomrt.harvest.db import has_place

    if not has_place(store):
        from loomrt.errors import StoreError

        raise StoreError(
            "durable memory needs a record file or PostgreSQL, and this record is in memory. "
            "Set LOOMRT_HOME, or LOOMRT_DB_URL=sqlite:PATH or postgresql://..."
        )
    return store


def _scopes(scope: list[str] | None) -> list[str] | None:
    from loomrt.harvest.scopes import parse_scope

    return [parse_scope(s) for s in scope] if scope else None


def _waiting(unsettled: int) -> str:
    return f"{plural(unsettled, 'span')} {'waits' if unsettled == 1 else 'wait'} for {'its run' if unsettled == 1 else 'their runs'} to settle"


@friendly
def consolidate_cmd(
    once: bool = typer.Option(False, "--once", help="One pass over what is queued, then exit (the default)."),
    watch: bool = typer.Option(False, "--watch", help="Pass after pass until Ctrl-C."),
    scope: list[str] | None = _SCOPE,
    settle_s: float = typer.Option(60.0, "--settle-s", min=0, help="A run still active is taken once quiet this long."),
    tail_after_s: float = typer.Option(
        3600.0,
        "--tail-after-s",
        min=0,
        help="A run's tail (its last words, still in its working context: never evicted) is banked once the "
        "run has ended, or been quiet this long.",
    ),
    retry_dead: bool = typer.Option(False, "--retry-dead", help="Put the dead letters back on the queue first."),
    status: bool = typer.Option(False, "--status", help="Show the queue (per scope) and the dead letters; do nothing."),
    model: str | None = typer.Option(
        None, "--model", help="The extraction model (default: $LOOMRT_HARVEST_MODEL, else the embedded local model)."
    ),
    interval_s: float = typer.Option(5.0, "--interval", min=0.1, help="--watch: seconds between passes when idle."),
    json_output: bool = _JSON,
) -> None:
    """Turn banked spans into durable facts (context.harvest_to_memory)."""
    from loomrt.harvest.consolidator import Consolidator
    from loomrt.record.sqlite import default_store

    store = _file_store(default_store())
    spinner = None if json_output or not err.is_terminal else err.status("consolidating…")

    def progress(batches: int, spans: int) -> None:
        if spinner is not None:
            spinner.update(f"consolidating… {plural(batches, 'batch', 'batches')}, {plural(spans, 'span')}")

    worker = Consolidator(store, model=model, settle_s=settle_s, tail_after_s=tail_after_s, progress=progress)
    if status:
        rows, dead = worker.queue.status(), worker.queue.dead_letters()
        if json_output:
            print_json({"scopes": rows, "dead_letters": dead})
            return
        table = Table("scope", "pending", "claimed", "done", "dead", "watermark")
        for r in rows:
            table.add_row(r["scope"], *(str(r.get(k, 0)) for k in ("pending", "claimed", "done", "dead", "watermark")))
        out.print(table)
        for d in dead:
            out.print(
                f"dead letter {d['batch_id']} ({d['scope']}, {plural(len(d['span_ids']), 'span')}): {escape(d['error'])}",
                highlight=False,
            )
        return
    revived = worker.retry_dead() if retry_dead else []
    scopes = _scopes(scope)

    def tell(report: Any) -> None:
        row = {**report.to_dict(), "revived": revived}
        if json_output:
            print_json(row)
        elif report.batches or revived:
            facts = report.facts
            out.print(
                f"{plural(report.batches, 'batch', 'batches')}, {plural(report.spans, 'span')}: {facts.get('new', 0)} new, "
                f"{facts.get('merged', 0)} merged, {facts.get('superseded', 0)} superseded; "
                f"{plural(report.passages.get('new', 0), 'new passage')}; "
                f"dropped {sum(report.dropped.values())}; dead letters {report.dead}"
                + (f"; {_waiting(report.unsettled)}" if report.unsettled else ""),
                highlight=False,
            )
        for held in report.held:
            err.print(f"[red]write failed[/red], the watermark holds: {escape(held)}", highlight=False)

    if watch:
        if not json_output:
            err.print(f"[dim]loomrt consolidate: watching every {interval_s:g} s · Ctrl-C to stop[/dim]")
        try:
            asyncio.run(worker.watch(scopes, interval_s=interval_s, on_pass=tell))
        except KeyboardInterrupt:
            pass
        return
    if spinner is not None:
        with spinner:
            report = worker.run_once(scopes)
    else:
        report = worker.run_once(scopes)
    tell(report)
    if not json_output and not report.batches and not revived:
        out.print(
            "nothing to consolidate"
            + (f" ({_waiting(report.unsettled)}; --settle-s 0 takes them now)" if report.unsettled else "")
        )
    if report.held:
        raise typer.Exit(1)


@memory_app.command("add")
@friendly
def add_cmd(
    scope: str = typer.Argument(..., help="Whose memory: KIND:IDENTITY (user:alice, agent:NAME, project:NAME)."),
    statement: str = typer.Argument(..., help="One self-contained sentence, stored as written."),
    cls: str = typer.Option("fact", "--class", help="preference, fact, decision, identity, constraint or correction."),
    subject: str = typer.Option(
        "", "--subject", help="Whom it is about: lets it merge into, or supersede, stored facts about them."
    ),
    json_output: bool = _JSON,
) -> None:
    """Write a fact by hand (author: operator), as a later run's Recall will find it."""
    from loomrt.harvest.manual import add_statement

    _, memory = _memory()
    added = add_statement(memory, scope, statement, cls=cls, subject=subject, by="cli")
    if json_output:
        print_json(added.to_dict())
        return
    out.print(f"{added.fact.fact_id}: {added.outcome} in {added.fact.scope}", highlight=False)


@memory_app.command("search")
@friendly
def search_cmd(
    query: str = typer.Argument(..., help="What to look for."),
    scope: list[str] | None = _SCOPE,
    k: int = typer.Option(5, "--k", min=1, max=50),
    json_output: bool = _JSON,
) -> None:
    """Search durable memory (every scope unless --scope)."""
    _, memory = _memory()
    scopes = _scopes(scope) or memory.scopes()
    hits = memory.search(query, k, scopes)
    if json_output:
        print_json(
            [
                {"fact_id": h.id, "scope": h.scope, "score": round(h.score, 4), "text": h.text, **h.provenance}
                for h in hits
            ]
        )
        return
    if not hits:
        out.print("nothing matched")
    for h in hits:
        out.print(f"[bold]{h.id}[/bold] {h.score:.3f} {h.scope} {h.provenance.get('class')}: {escape(h.text)}")
        said = h.provenance.get("said")
        if said:
            out.print(
                f"  [dim]said by {escape(str(said['speaker']))} on {said['date'] or '?'}:[/dim] {escape(said['text'])}",
                highlight=False,
            )


@memory_app.command("list")
@friendly
def list_cmd(
    scope: list[str] | None = _SCOPE,
    all_: bool = typer.Option(False, "--all", help="Include superseded and forgotten facts."),
    passages: bool = typer.Option(False, "--passages", help="The verbatim passages instead of the facts."),
    limit: int = typer.Option(200, "--limit", min=1),
    json_output: bool = _JSON,
) -> None:
    """List durable facts (or passages), oldest first."""
    _, memory = _memory()
    tiers = ("passages",) if passages else ("facts",)
    facts = memory.facts(_scopes(scope), include_hidden=all_, limit=limit, tiers=tiers)
    if json_output:
        print_json([f.to_dict() for f in facts])
        return
    table = Table("fact", "scope", "class", "status", "statement")
    for f in facts:
        table.add_row(f.fact_id, f.scope, f.cls, f.status, escape(f.statement))
    out.print(table if facts else "no passages" if passages else "no facts")


def _origins(store: Any, fact: Any) -> list[dict[str, Any]]:
    """The original turns a fact came from, read from the record by seq."""
    from loomrt.errors import NotFoundError
    from loomrt.events import message_of

    turns = []
    for source in fact.sources:
        seqs = {s for s in source.get("seqs") or [] if s is not None}
        try:
            events = store.events(source["run_id"], after=min(seqs) - 1, until=max(seqs)) if seqs else []
        except NotFoundError:
            events = []
        for e in events:
            m = message_of(e)
            if e.seq in seqs and m is not None:
                turns.append({"run_id": e.run_id, "seq": e.seq, "role": m.role, "ts": e.ts, "text": m.content})
    return turns


@memory_app.command("show")
@friendly
def show_cmd(fact_id: str = typer.Argument(...), json_output: bool = _JSON) -> None:
    """A fact: its class, scope, history (merges, supersessions) and the original turns."""
    store, memory = _memory()
    fact = memory.get(fact_id)
    history, origins = memory.history(fact_id), _origins(store, fact)
    if json_output:
        print_json({**fact.to_dict(), "history": history, "origins": origins})
        return
    out.print(
        f"[bold]{fact.fact_id}[/bold] · {fact.scope} · {fact.cls} · {fact.status}"
        + (f" (by {fact.superseded_by})" if fact.superseded_by else "")
    )
    out.print(escape(fact.statement) or "[dim](erased)[/dim]", highlight=False)
    out.print(
        f"[dim]subject {escape(fact.subject)} · observed {fact.observed_at or '?'} · written by {fact.author}"
        + (f" · extracted by {escape(fact.model)}" if fact.model else "")
        + "[/dim]"
    )
    for line in fact.lines:
        out.print(
            f"  [dim]said by {escape(str(line.get('speaker') or line.get('role')))} "
            f"({when(line['ts']) if line.get('ts') else '?'}, #{line.get('seq')}):[/dim] {escape(str(line['text']))}",
            highlight=False,
        )
    for h in history:
        out.print(
            f"  {when(h['at'])} {h['action']}: {escape(str(h.get('statement') or h.get('by') or ''))}", highlight=False
        )
    for t in origins:
        out.print(f"  [dim]{t['run_id']} #{t['seq']} {t['role']}:[/dim] {escape(t['text'][:300])}", highlight=False)


@memory_app.command("forget")
@friendly
def forget_cmd(
    fact_id: str = typer.Argument(...),
    erase: bool = typer.Option(False, "--erase", help="Wipe its text and vector too (its history says so)."),
    json_output: bool = _JSON,
) -> None:
    """Hide a fact from search (recorded in its history); --erase wipes its words."""
    _, memory = _memory()
    fact = memory.forget(fact_id, erase=erase)
    if json_output:
        print_json(fact.to_dict())
    else:
        out.print(f"{fact.fact_id}: {fact.status}")


@memory_app.command("erase-private")
@friendly
def erase_private_cmd(run_id: str = typer.Argument(...), json_output: bool = _JSON) -> None:
    """Erase from memory what it holds of RUN_ID's private messages (marked by the runtime, or
    before memory was stored): their passages and fact lines (a fact left with none too)."""
    from loomrt.harvest.wiring import erase_private

    store, _ = _memory()
    store.get_run(run_id)
    erased = erase_private(store, run_id)
    if json_output:
        print_json({"run_id": run_id, "memory_erased": erased})
    else:
        out.print(f"run {run_id}: " + ", ".join(f"{n} {k}" for k, n in erased.items()) + " erased", highlight=False)


@memory_app.command("calibrate")
@friendly
def calibrate_cmd(
    apply: bool = typer.Option(False, "--apply", help="Store the measured merge band for this record's memory."),
    json_output: bool = _JSON,
) -> None:
    """Measure the merge band (cosine) for the configured embedder on paraphrase and non-paraphrase pairs."""
    from loomrt.harvest.calibrate import calibrate

    _, memory = _memory()
    result = calibrate(memory.embedder)
    if apply:
        memory.set_band("merge_cosine", result["merge_cosine"])
    if json_output:
        print_json({**result, "applied": apply})
        return
    out.print(
        f"embedder {result['embedder']}: paraphrases {result['paraphrase']['min']:.3f}–"
        f"{result['paraphrase']['max']:.3f} (median {result['paraphrase']['median']:.3f}), non-paraphrases "
        f"{result['other']['min']:.3f}–{result['other']['max']:.3f} (median {result['other']['median']:.3f})"
    )
    out.print(
        f"merge band: cosine ≥ {result['merge_cosine']:.3f} (accuracy {result['accuracy']:.3f} on "
        f"{result['pairs']} pairs)" + (" · stored" if apply else " · --apply stores it")
    )
