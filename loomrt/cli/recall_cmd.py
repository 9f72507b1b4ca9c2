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
    from loomrt.record.sqlite import default_store
    from loomrt.search_evicted import recall_in_record

    store = default_store()
    try:
        answer = recall_in_record(store, run_id, query, k=k, include_private=include_private)
    except NotFoundError:
        raise _fail(f"no run {run_id!r} in {store.path} (see `loomrt runs list`)") from None
    hits, notes = answer.hits, answer.notes
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
        what = "nothing matched" if answer.indexed else "the run has evicted nothing yet"
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
