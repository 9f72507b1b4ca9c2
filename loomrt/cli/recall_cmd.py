"""``loomrt recall RUN_ID QUERY`` and ``loomrt bench recall --data FILE``.

``recall`` rebuilds a run's recall index from its record (every distillation's evicted
span) and prints the hits; ``bench_recall`` runs the LoCoMo evidence benchmark
(:func:`loomrt.bench.locomo_recall.evaluate_locomo`) with a progress bar on stderr.

The embedder is the default (all-MiniLM-L6-v2) unless ``LOOMRT_RECALL_EMBEDDER`` says
``none`` (lexical-only) or ``hash``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from loomrt.cli._common import err, out, print_json

__all__ = ["recall", "bench_recall"]


_RUN = typer.Argument(..., help="The run whose evicted spans to search.")
_QUERY = typer.Argument(..., help="What to look for.")
_K = typer.Option(5, "--k", min=1, max=50, help="How many hits.")
_JSON_HITS = typer.Option(False, "--json", help="Print a JSON list of {text, score, source, seq, ts}.")
_DATA = typer.Option(..., "--data", help="A LoCoMo-format JSON file.")
_CONVERSATIONS = typer.Option(None, "--conversations", help="Sample ids to replay (default: all).")
_JSON = typer.Option(False, "--json", help="Print one JSON object.")


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", markup=True, highlight=False)
    return typer.Exit(1)


_INCLUDE_PRIVATE = typer.Option(
    False, "--include-private", help="Show private messages whole (else each is its placeholder)."
)


def recall(
    run_id: str = _RUN,
    query: str = _QUERY,
    k: int = _K,
    json_output: bool = _JSON_HITS,
    include_private: bool = _INCLUDE_PRIVATE,
) -> None:
    """Search what RUN_ID evicted (rebuilt from its record; a fork's shared history too) and
    print the originals; private messages are placeholders unless --include-private."""
    from loomrt.errors import NotFoundError
    from loomrt.recall import RunRecall
    from loomrt.record.sqlite import default_store
    from loomrt.spec import AgentSpec

    store = default_store()
    try:
        store.get_run(run_id)
    except NotFoundError:
        raise _fail(f"no run {run_id!r} in {store.path} (see `loomrt runs list`)") from None
    events = store.events(run_id)
    context: Any = None
    if events and events[0].kind == "run_started":
        try:
            context = AgentSpec.model_validate(events[0].data["definition"]).context
        except Exception:  # noqa: BLE001 - an old definition still has a searchable record
            context = None
    from loomrt.run.family import Family
    from loomrt.visibility import placeholder, private_seqs

    notes: list[str] = []
    family = Family.of(store, events[0].data.get("forked_from")) if events else None
    shared = list(family.events()) if family is not None else []
    rr = RunRecall(
        run_id=run_id,
        context=context,
        emit=lambda kind, data: notes.append(str(data.get("message") or data.get("error"))),
        shared_runs=[r for r, _ in family.links] if family is not None else (),
    )
    rr.rebuild([*shared, *events])
    private = private_seqs([*shared, *events]) | (family.private() if family is not None else set())
    hits = rr.search(query, top_k=k)
    if not include_private:  # the reader without the right sees the placeholder
        from dataclasses import replace

        hits = [
            replace(h, text=placeholder(h.seq, h.role or "tool")) if h.seq is not None and h.seq in private else h
            for h in hits
        ]
    for note in notes:
        err.print(f"[yellow]note:[/yellow] {escape(note)}", markup=True, highlight=False)
    if json_output:
        from loomrt.recall.tool import iso

        print_json(
            [
                {"text": h.text, "score": round(h.score, 4), "source": h.source, "seq": h.seq, "ts": iso(h.ts)}
                for h in hits
            ]
        )
        return
    if not hits:
        what = "nothing matched" if rr.size() else "the run has evicted nothing yet"
        out.print(f"no hits: {what}", highlight=False)
        return
    from loomrt.recall.tool import iso

    for i, h in enumerate(hits, 1):
        where = f"#{h.seq}" if h.seq is not None else h.source
        head = f"[bold]{i}.[/bold] {where} · {h.source} · score {h.score:.3f} · {iso(h.ts) or '-'}"
        if h.role:
            head += f" · {h.role}" + (f" ({', '.join(h.tools)})" if h.tools else "")
        out.print(head, markup=True, highlight=False)
        out.print(escape(h.text), highlight=False)
        out.print()


def _table(result: dict[str, Any]) -> Table:
    ks = list(result["recall_at"])
    table = Table(
        title=f"LoCoMo evidence recall@k · {result.get('replay', 'observer')} replay · "
        f"{result['questions']} questions · {result['seconds']} s"
    )
    table.add_column("category")
    table.add_column("questions", justify="right")
    for k in ks:
        table.add_column(f"R@{k}", justify="right")
    for cat, row in result["by_category"].items():
        table.add_row(
            f"{cat} {row.get('name', '')}", str(row["questions"]), *(f"{row['recall_at'][k]:.3f}" for k in ks)
        )
    table.add_row(
        "[bold]any evidence[/bold]",
        str(result["questions"]),
        *(f"[bold]{result['recall_at'][k]:.3f}[/bold]" for k in ks),
    )
    if "recall_all_at" in result:
        table.add_row("all evidence", str(result["questions"]), *(f"{result['recall_all_at'][k]:.3f}" for k in ks))
    return table


def bench_recall(
    data: Path = _DATA,
    conversations: list[str] = _CONVERSATIONS,
    json_output: bool = _JSON,
    replay: Annotated[
        str,
        typer.Option("--replay", help="observer (no replies) or chat (a short acknowledgement after each turn)."),
    ] = "observer",
) -> None:
    """LoCoMo evidence recall@k: replay each conversation through a recall-enabled run and ask Recall every question."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from loomrt.bench.locomo_recall import evaluate_locomo
    from loomrt.errors import SpecError

    if not data.is_file():
        raise _fail(f"no LoCoMo file at {data}")
    if replay not in ("observer", "chat"):
        raise _fail(f"--replay is observer or chat, not {replay!r}")
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("loading", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)

        try:
            result = evaluate_locomo(
                data, conversations=conversations or None, progress=progress, replies=replay == "chat"
            )
        except SpecError as exc:
            raise _fail(str(exc)) from None
    if json_output:
        print_json(result)
    else:
        out.print(_table(result))
