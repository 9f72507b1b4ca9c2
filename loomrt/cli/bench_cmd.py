"""``loomrt bench``: what each retention mode costs and what it still remembers, side by side.

``loomrt bench run [WORKLOAD ...]`` plays the workloads (``chat200``, ``agentic``,
``locomo``) in every mode and runs the standalone measures (``overhead``,
``recall_latency``, ``local_overhead``); ``loomrt bench list`` names them all;
``loomrt bench recall`` is the LoCoMo evidence benchmark of the recall issue.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["bench_app", "RichProgress"]

bench_app = typer.Typer(
    help="Benchmarks: input tokens per retention mode against append, cache-adjusted cost, fidelity "
    "(planted facts still in context or found by Recall), runtime overhead, Recall latency.",
    no_args_is_help=True,
)

LOCAL_DEFAULT = "local/qwen2.5-coder-1.5b"
"""What ``--model local`` means: the embedded local model."""

_err = Console(stderr=True)
_out = Console()
if not _out.is_terminal:  # piped: do not squeeze the tables into 80 columns
    _out = Console(width=200)


class RichProgress:
    """The harness's progress, drawn as a rich bar on stderr."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.task: Any = None

    def start(self, label: str, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.progress.tasks[self.task].total, visible=False)
        self.task = self.progress.add_task(label, total=max(1, total))

    def advance(self, n: int = 1) -> None:
        if self.task is not None and n:
            self.progress.advance(self.task, n)

    def note(self, text: str) -> None:
        self.progress.console.log(text)


def rewrite_block(docs: Path, begin: str, end: str, body: str, what: str, *, title: str = "Benchmarks") -> None:
    """Rewrite one generated block of ``docs`` (a clear error and exit 2 if its markers are missing)."""
    from loomrt.bench.report import replace_block

    try:
        replace_block(docs, begin, end, body, title=title)
    except ValueError as exc:
        _err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    _err.print(f"updated the {what} block of {docs}")


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


@bench_app.command("run")
def run_cmd(
    targets: Annotated[
        list[str] | None, typer.Argument(help="Workloads and measures to run (default: all; see `loomrt bench list`).")
    ] = None,
    modes: Annotated[
        list[str] | None,
        typer.Option(
            "--modes",
            help="Modes to play, comma-separated or repeated: MODE or MODE/no-recall, append/backstop (default: every mode, auto and the variants recap|compaction|stateful|fold/no-recall, append/backstop, fold/no-tools, fold/no-defer; fold/soft-N, not played by default, is fold/no-defer with fold.soft_pct N).",
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object with every figure.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write report.md, results.json and PNG plots into this folder.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Play against a real model instead of the scripted one: `local` (the embedded local/qwen2.5-coder-1.5b), any local/... model, or any litellm model. Slow.",
        ),
    ] = None,
    data: Annotated[
        Path | None, typer.Option("--data", help="A LoCoMo-format JSON file (the locomo workload needs it).")
    ] = None,
    conversations: Annotated[
        list[str] | None,
        typer.Option("--conversations", help="LoCoMo sample ids to use (default: all; --quick: the first)."),
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A small, fast configuration (the CI smoke test).")] = False,
    seed: Annotated[int, typer.Option("--seed", help="The seed the workloads are generated from.")] = 7,
    embedder: Annotated[
        str,
        typer.Option(
            "--embedder", help="Recall's embedder: default (MiniLM), hash (fast, deterministic) or none (lexical only)."
        ),
    ] = "default",
    cache_discount: Annotated[
        float,
        typer.Option(
            "--cache-discount",
            min=0.0,
            max=1.0,
            help="Price of a cached input token, as a fraction of an uncached one.",
        ),
    ] = 0.10,
    docs: Annotated[
        Path | None,
        typer.Option("--docs", help="Rewrite the figures block of this Markdown page (e.g. docs/benchmarks.md)."),
    ] = None,
    docs_block: Annotated[
        str | None,
        typer.Option(
            "--docs-block",
            help="With --docs: rewrite the block named NAME instead of the main one "
            "(for measures run on their own, like mcp or fanout).",
        ),
    ] = None,
) -> None:
    """Play the workloads in every mode and print the figures."""
    from loomrt.bench.core import DEFAULT_VARIANTS, VARIANTS, BenchConfig, all_modes, known_variant
    from loomrt.bench.report import mode_rows
    from loomrt.bench.runner import run_bench

    if model == "local":
        model = LOCAL_DEFAULT
    if embedder not in ("default", "hash", "none"):
        raise typer.BadParameter("use default, hash or none", param_hint="--embedder")
    chosen = _split(modes) or [*all_modes(), *DEFAULT_VARIANTS]
    unknown = [m for m in chosen if not known_variant(m)]
    if unknown:
        raise typer.BadParameter(
            f"unknown mode {', '.join(unknown)}; known: {', '.join(all_modes())}, "
            f"each optionally as MODE/{'|'.join(VARIANTS)} (backstop: append only; soft-N, N from 10 to 99: fold only)",
            param_hint="--modes",
        )
    if model and not _model_allowed(model):
        _err.print(f"[yellow]note:[/yellow] {model} makes real model calls; this is slow.")
    config = BenchConfig(
        modes=chosen,
        quick=quick,
        seed=seed,
        model=model,
        data=data,
        conversations=_split(conversations) or None,
        embedder=embedder,
        cache_discount=cache_discount,
    )
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    try:
        with Progress(*columns, console=_err, transient=True) as bar:
            results = run_bench(_split(targets), config, RichProgress(bar))
    except ValueError as exc:
        _err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    results["command"] = _command(
        targets, modes, quick, seed, embedder, cache_discount, model, data, conversations, out, docs
    ) + (f" --docs-block {docs_block}" if docs_block else "")
    _write(results, out, docs, docs_block)
    if json_output:
        import json
        import sys

        sys.stdout.write(json.dumps(results, ensure_ascii=False) + "\n")
    else:
        _print_tables(results, mode_rows)
    if results.get("failed"):
        for name, why in results["failed"].items():
            _err.print(f"[red]error:[/red] {name} failed: {why}", highlight=False)
        raise typer.Exit(1)


def _write(results: dict[str, Any], out: Path | None, docs: Path | None, block: str | None = None) -> None:
    from loomrt.bench.report import update_docs, write_report

    command = results.get("command")
    if out is not None:
        written = write_report(results, out, command=command)
        _err.print("wrote " + ", ".join(str(p) for p in written))
    if docs is not None:
        rel = _relative(out, docs.parent) if out is not None else None
        try:
            update_docs(docs, results, command=command or "loomrt bench run", images=rel, block=block)
        except ValueError as exc:
            _err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(2) from None
        _err.print(f"updated the figures block of {docs}")


@bench_app.command("report")
def report_cmd(
    results: Annotated[Path, typer.Argument(help="A results.json written by `bench run --out`.")],
    out: Annotated[Path | None, typer.Option("--out", help="Write report.md, results.json and the plots here.")] = None,
    docs: Annotated[
        Path | None, typer.Option("--docs", help="Rewrite the figures block of this Markdown page.")
    ] = None,
) -> None:
    """Render the report, the plots and the docs block again from a results.json, without rerunning."""
    import json

    try:
        data = json.loads(results.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        _err.print(f"[red]error:[/red] cannot read {results}: {exc}", highlight=False)
        raise typer.Exit(2) from None
    _write(data, out, docs)


def _model_allowed(model: str) -> bool:
    return model.startswith(("local/", "scripted/"))


def _relative(folder: Path, base: Path) -> str:
    try:
        return str(folder.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(folder.resolve())


def _command(
    targets: Any,
    modes: Any,
    quick: bool,
    seed: int,
    embedder: str,
    discount: float,
    model: Any,
    data: Any,
    conversations: Any,
    out: Any,
    docs: Any,
) -> str:
    parts = ["loomrt", "bench", "run", *_split(targets)]
    if modes:
        parts += ["--modes", ",".join(_split(modes))]
    for flag, value, default in (
        ("--seed", seed, 7),
        ("--embedder", embedder, "default"),
        ("--cache-discount", discount, 0.10),
        ("--model", model, None),
        ("--data", data, None),
        ("--out", out, None),
        ("--docs", docs, None),
    ):
        if value != default:
            parts += [flag, str(value)]
    if conversations:
        parts += ["--conversations", ",".join(_split(conversations))]
    if quick:
        parts.append("--quick")
    return shlex.join(parts)


def _print_tables(results: dict[str, Any], mode_rows: Any) -> None:
    from loomrt.bench.report import SHORT, describe

    for name, w in results["workloads"].items():
        table = Table(title=f"{name} ({describe(w['params'])})", title_justify="left")
        for _, header in SHORT:
            table.add_column(header, justify="left" if header in ("mode", "resolved") else "right")
        for row in mode_rows(w, SHORT):
            table.add_row(*row)
        _out.print(table)
        for key in ("evidence_recall", "evidence_recall_chat"):
            ev = w.get(key)
            if ev:
                _out.print(
                    f"evidence recall, {ev.get('replay', 'observer')} replay ({ev['questions']} questions): "
                    + ", ".join(f"R@{k} {v:.3f}" for k, v in ev["recall_at"].items())
                    + " any; "
                    + ", ".join(f"R@{k} {v:.3f}" for k, v in ev.get("recall_all_at", {}).items())
                    + " all"
                )
    from rich.markdown import Markdown

    from loomrt.bench.render import render_measure

    for name, figures in results["measures"].items():  # each measure renders itself, as in report.md
        if "skipped" not in figures:
            _out.print(Markdown("\n".join(render_measure(name, figures))))
    for name, why in results["skipped"].items():
        _err.print(f"[yellow]skipped[/yellow] {name}: {why}")


@bench_app.command("list")
def list_cmd(
    json_output: bool = typer.Option(False, "--json", help="One JSON object: each name and what it measures."),
) -> None:
    """List the workloads and measures `bench run` knows."""
    from loomrt.bench.runner import available_targets
    from loomrt.cli._common import print_json

    if json_output:
        print_json(available_targets())
        return
    for name, description in available_targets().items():
        _out.print(f"[bold]{name}[/bold]  {description}")


def _register_recall() -> None:
    """`loomrt bench recall` (the LoCoMo evidence benchmark) lives with the recall CLI; it is
    registered when that module is there (it imports torch only when the command runs)."""
    try:
        from loomrt.cli.recall_cmd import bench_recall
    except ImportError:
        return
    from loomrt.cli._common import friendly

    bench_app.command("recall")(friendly(bench_recall))


_register_recall()
