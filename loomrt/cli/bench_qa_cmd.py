"""``loomrt bench qa``: a real model answers LoCoMo questions after its context was distilled."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from loomrt.cli.bench_cmd import LOCAL_DEFAULT, RichProgress, _err, _out, _relative, _split, bench_app

__all__ = ["qa_cmd"]


@bench_app.command("qa")
def qa_cmd(
    data: Annotated[Path, typer.Option("--data", help="A LoCoMo-format JSON file.")],
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="The answering and distilling model: local/... (default), any litellm model, "
            "or `scripted` (the scripted reader, for tests).",
        ),
    ] = LOCAL_DEFAULT,
    conversations: Annotated[
        list[str] | None, typer.Option("--conversations", help="Sample ids (default: the file's first).")
    ] = None,
    questions: Annotated[
        int, typer.Option("--questions", help="Questions per conversation, spread over its list (0: all).", min=0)
    ] = 30,
    configs: Annotated[
        list[str] | None,
        typer.Option(
            "--configs",
            help="full, recall, recap, compaction, fold, MODE/no-recall; recall injection: MODE/inject "
            "(injection and the Recall tool), MODE/inject-only (injection alone), full/inject (the "
            "distractor guard); memory, memory/passages-only (a new run of the same user answers from "
            "durable memory alone); stateful on request (default: full, recall, recap, compaction and "
            "both /no-recall).",
        ),
    ] = None,
    budget: Annotated[
        int, typer.Option("--budget", help="Working-context budget of the replayed runs.", min=256)
    ] = 2048,
    top_k: Annotated[int, typer.Option("--top-k", help="Recall results for the `recall` configuration.", min=1)] = 10,
    inject_tokens: Annotated[
        int,
        typer.Option(
            "--inject-tokens",
            help="The inject rows' reserve for recalled passages (recall_inject_tokens), on top of the replay's budget.",
            min=64,
        ),
    ] = 640,
    window: Annotated[int, typer.Option("--window", help="The model's context window in tokens.", min=1024)] = 32768,
    embedder: Annotated[
        str, typer.Option("--embedder", help="Recall's embedder: default (MiniLM), hash or none.")
    ] = "default",
    judge: Annotated[str | None, typer.Option("--judge", help="A stronger model that also grades each answer.")] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for report.md, results.json, qa.png, and the answer cache (resumes)."),
    ] = None,
    docs: Annotated[Path | None, typer.Option("--docs", help="Rewrite the QA block of this Markdown page.")] = None,
    one_call_turns: Annotated[
        bool | None,
        typer.Option(
            "--one-call-turns/--two-call-turns",
            help="On the embedded model, where a tool is offered: decide and answer in one generation "
            "(capabilities.one_call_turns, the embedded model's default), or decide, then answer in a second call.",
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Replay LoCoMo conversations through real runs and let the model answer their questions in each configuration."""
    from loomrt.bench.qa import QAConfig, run_qa
    from loomrt.bench.qa.report import update_docs, write_report
    from loomrt.errors import LoomError

    if embedder not in ("default", "hash", "none"):
        raise typer.BadParameter("use default, hash or none", param_hint="--embedder")
    if not data.is_file():
        _err.print(f"[red]error:[/red] no LoCoMo file at {data}", highlight=False)
        raise typer.Exit(2)
    config = QAConfig(
        data=data,
        model=LOCAL_DEFAULT if model == "local" else model,
        conversations=_split(conversations) or None,
        questions=questions or None,
        budget_tokens=budget,
        top_k=top_k,
        inject_tokens=inject_tokens,
        window=window,
        embedder=embedder,
        judge=judge,
        out=out,
        one_call_turns=one_call_turns,
    )
    if configs:
        config.configs = _split(configs)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    try:
        with Progress(*columns, console=_err, transient=True) as bar:
            results = run_qa(config, RichProgress(bar))
    except LoomError as exc:
        _err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    results["command"] = (
        shlex.join(["loomrt", "bench", "qa", *sys.argv[3:]]) if sys.argv[1:3] == ["bench", "qa"] else "loomrt bench qa"
    )
    if out is not None:
        _err.print("wrote " + ", ".join(str(p) for p in write_report(results, out)))
    if docs is not None:
        try:
            update_docs(docs, results, images=_relative(out, docs.parent) if out is not None else None)
        except ValueError as exc:
            _err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(2) from None
        _err.print(f"updated the QA block of {docs}")
    if json_output:
        import json

        sys.stdout.write(json.dumps(results, ensure_ascii=False) + "\n")
        return
    _print(results)


def _print(results: dict[str, Any]) -> None:
    table = Table(title="loomrt bench qa", title_justify="left")
    for h in ("configuration", "questions", "F1", "contains", "folded", "input tok/q", "s/q", "Recall/q"):
        table.add_column(h, justify="left" if h == "configuration" else "right")
    for name, s in results["summary"].items():
        if not s.get("questions"):
            table.add_row(name, "0", "–", "–", "–", "–", "–", s.get("skipped", ""))
            continue
        table.add_row(
            name,
            str(s["questions"]),
            f"{s['f1']:.3f}",
            f"{s['contains']:.3f}",
            f"{s['folded_size']:.3f}",
            f"{s['input_tokens_per_question']:,}",
            f"{s['seconds_per_question']:.1f}",
            f"{s['recall_calls_per_question']:.2f}",
        )
    _out.print(table)
