"""``loomrt runs pin``, ``unpin``, ``private``, ``declassify`` and ``export``: the audit trail's commands (show and
verify, in :mod:`loomrt.cli.runs_cmd`, read it too)."""

from __future__ import annotations

from pathlib import Path

import typer

from loomrt.cli._common import friendly, out, plural, print_json, runtime
from loomrt.cli.runs_cmd import JsonOpt, runs_app

__all__ = ["pin_cmd", "unpin_cmd", "export_cmd", "private_cmd", "declassify_cmd"]


def _pin_id(value: str) -> str:
    return value if value.startswith(("#", "text-")) else f"#{value}"


@runs_app.command("pin")
@friendly
def pin_cmd(
    run_id: str,
    seq: int = typer.Argument(..., help="The record seq of the message to pin (`loomrt runs events RUN_ID`)."),
    note: str = typer.Option("", "--note", help="Why it must stay verbatim."),
    json_output: bool = JsonOpt,
) -> None:
    """Pin a message: it survives every distillation verbatim (and counts against context.pins_max_tokens)."""
    from loomrt.run.pin_record import pin_in_record

    store = runtime().store
    store.get_run(run_id)
    made = pin_in_record(store, run_id, seq=seq, note=note)  # a PinError is a caller's mistake: exit 2
    if json_output:
        print_json({"run_id": run_id, **made.to_json()})
    else:
        out.print(f"run {run_id}: pinned {made.id} ({plural(made.to_json()['tokens'], 'token')})", highlight=False)


@runs_app.command("unpin")
@friendly
def unpin_cmd(
    run_id: str,
    pin: str = typer.Argument(..., help="The pinned seq (87 or #87), or a text pin's id (text-1)."),
    json_output: bool = JsonOpt,
) -> None:
    """End a pin (the message may be distilled again from the next boundary on)."""
    from loomrt.run.pin_record import unpin_in_record

    store = runtime().store
    store.get_run(run_id)
    unpin_in_record(store, run_id, _pin_id(pin))
    if json_output:
        print_json({"run_id": run_id, "unpinned": _pin_id(pin)})
    else:
        out.print(f"run {run_id}: unpinned {_pin_id(pin)}", highlight=False)


@runs_app.command("export")
@friendly
def export_cmd(
    run_id: str,
    format: str = typer.Option("md", "--format", help="md (a thread with its distillation markers) or jsonl."),
    output: Path | None = typer.Option(None, "--out", "-o", help="Write here instead of standard output."),
    include_private: bool = typer.Option(
        False, "--include-private", help="Private material whole, not its placeholders (loomrt.visibility)."
    ),
    json_output: bool = typer.Option(False, "--json", help="JSON lines, one item per line (--format jsonl)."),
) -> None:
    """The run for a reviewer: every message and every distillation marker, in record order
    (private messages as placeholders unless --include-private)."""
    from loomrt.audit import to_jsonl, to_markdown, transcript
    from loomrt.errors import SpecError
    from loomrt.visibility import reader_events

    format = "jsonl" if json_output else format
    if format not in ("md", "jsonl"):
        raise SpecError(f"unknown export format {format!r}: use md or jsonl", path="--format")
    store = runtime().store
    store.get_run(run_id)
    items = transcript(reader_events(store, run_id, include_private=include_private))
    text = to_markdown(run_id, items) if format == "md" else to_jsonl(items)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        out.print(f"wrote {output} ({plural(len(items), 'item')})", highlight=False)


@runs_app.command("private")
@friendly
def private_cmd(
    run_id: str,
    seq: int = typer.Argument(..., help="The record seq of the message only this run may see."),
    json_output: bool = JsonOpt,
) -> None:
    """Mark a message private: no later summary, memory or other run sees it (its own run still
    does); what durable memory already holds of it (passages, a fact's lines) is erased."""
    from loomrt.harvest.wiring import erase_private
    from loomrt.visibility import mark_private_in_record

    store = runtime().store
    store.get_run(run_id)
    mark_private_in_record(store, run_id, seq)
    erased = erase_private(store, run_id, [seq])
    if json_output:
        print_json({"run_id": run_id, "private": seq, "memory_erased": erased})
    else:
        gone = ", ".join(f"{n} {k}" for k, n in erased.items() if n)
        out.print(
            f"run {run_id}: #{seq} is private" + (f" (erased from memory: {gone})" if gone else ""), highlight=False
        )


@runs_app.command("declassify")
@friendly
def declassify_cmd(
    run_id: str,
    seq: int = typer.Argument(..., help="The record seq of a message the runtime marked derived private."),
    json_output: bool = JsonOpt,
) -> None:
    """Lift the runtime's derived-private mark from one message (it repeated a private source):
    readers, summaries and memory see it from now on. Recorded as a declassify event."""
    from loomrt.visibility import declassify_in_record

    store = runtime().store
    store.get_run(run_id)
    declassify_in_record(store, run_id, seq)
    if json_output:
        print_json({"run_id": run_id, "declassified": seq})
    else:
        out.print(f"run {run_id}: #{seq} is no longer private", highlight=False)
