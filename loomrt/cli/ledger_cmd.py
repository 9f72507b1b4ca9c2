"""``loomrt runs verify``, ``loomrt runs anchor`` and ``loomrt db keygen``: proving a run's
history (the chain, the head anchor, the event grammar, the cards, external anchors and the
prompts: :mod:`loomrt.integrity`)."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import typer

from loomrt.cli._common import friendly, out, plural, print_json, runtime
from loomrt.cli.db_cmd import db_app
from loomrt.cli.runs_cmd import JsonOpt, runs_app
from loomrt.errors import SpecError

__all__ = ["verify_cmd", "anchor_cmd", "keygen_cmd"]


def _read_anchors(path: Path) -> dict[str, Any]:
    from loomrt.integrity import ANCHOR_FORMAT

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"cannot read the anchors file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SpecError(
            f"the anchors file {path} is not JSON ({exc}); `loomrt runs anchor --out FILE` writes one"
        ) from None
    if not isinstance(data, dict) or data.get("format") != ANCHOR_FORMAT or not isinstance(data.get("runs"), dict):
        raise SpecError(
            f"{path} is not a loomrt anchors file (format {ANCHOR_FORMAT}); `loomrt runs anchor` writes one"
        )
    for run_id, mark in data["runs"].items():
        if not isinstance(mark, dict) or not isinstance(mark.get("seq"), int) or not isinstance(mark.get("hash"), str):
            raise SpecError(f"{path}: the anchor of run {run_id} needs an integer seq and a hash string")
    return data


@runs_app.command("verify")
@friendly
def verify_cmd(
    run_ids: list[str] | None = typer.Argument(None, help="The runs to check (or --all)."),
    all_runs: bool = typer.Option(False, "--all", help="Check every run in the record."),
    anchors: Path | None = typer.Option(
        None, "--anchors", help="An anchors file (`loomrt runs anchor --out`): what it anchored must still hold."
    ),
    require_keyed: bool = typer.Option(
        False, "--require-keyed", help="An unkeyed (v1) chain is a problem, not a note (a keyed deployment)."
    ),
    json_output: bool = JsonOpt,
) -> None:
    """Check a run's record: the ledger chain (keyed with $LOOMRT_LEDGER_KEY for v2 runs), its
    end against the head anchor, the order of its events, its cards, any external anchors, and
    every turn's prompt against the working context the record rebuilds at that moment.
    Exit 1 when anything does not hold."""
    from loomrt.integrity import verify_run

    store = runtime().store
    anchored = _read_anchors(anchors) if anchors is not None else None
    if all_runs:
        ids = [r.run_id for r in store.list_runs(limit=2**31)]
    elif run_ids:
        ids = list(run_ids)
    else:
        raise SpecError("name the runs to verify, or --all (`loomrt runs list` shows them)")
    for run_id in ids:
        store.get_run(run_id)  # an unknown id: one clear error before any check
    verdicts = [verify_run(store, run_id, anchored=anchored, require_keyed=require_keyed) for run_id in ids]
    missing = sorted(set((anchored or {}).get("runs", {})) - set(ids)) if all_runs else []
    if json_output:
        if len(verdicts) == 1 and not all_runs:
            print_json(verdicts[0].to_json())
        else:
            print_json(
                {
                    "clean": all(v.clean for v in verdicts) and not missing,
                    "runs": [v.to_json() for v in verdicts],
                    "anchored_runs_missing": missing,
                }
            )
    for v in verdicts if not json_output else ():
        for line in v.problems:
            out.print(f"run {v.run_id}: {line}", markup=False, highlight=False)
        if v.clean:
            out.print(
                f"run {v.run_id}: {plural(v.events, 'event')}, chain {v.chain}, "
                f"{plural(v.prompts_checked, 'prompt')} re-derived, "
                "the record audits clean",
                highlight=False,
            )
        for line in v.notes:
            out.print(f"[dim]run {v.run_id}: note: {line}[/dim]", highlight=False)
    for run_id in missing if not json_output else ():
        out.print(f"run {run_id}: anchored, and no longer in the record", markup=False, highlight=False)
    if missing or not all(v.clean for v in verdicts):
        raise typer.Exit(1)


@runs_app.command("anchor")
@friendly
def anchor_cmd(
    run_ids: list[str] | None = typer.Argument(None, help="The runs to anchor (default: every run)."),
    out_file: Path | None = typer.Option(None, "--out", help="Write the anchors here (default: standard output)."),
) -> None:
    """Write the heads of runs (last seq and hash) with the time, as JSON. Keep the file
    outside the database; `loomrt runs verify --anchors FILE` then proves that nothing
    anchored was rewritten since, even by someone who holds the ledger key."""
    from loomrt.integrity import anchors

    store = runtime().store
    for run_id in run_ids or ():
        store.get_run(run_id)
    text = json.dumps(anchors(store, run_ids or None), indent=2) + "\n"
    if out_file is None:
        print(text, end="")
        return
    try:
        out_file.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot write the anchors to {out_file}: {exc.strerror or exc}") from None
    out.print(f"anchored {plural(len(json.loads(text)['runs']), 'run')} in {out_file}", highlight=False)


@db_app.command("keygen")
@friendly
def keygen_cmd(path: Path = typer.Argument(..., help="The key file to create (mode 0600; never overwritten).")) -> None:
    """Write a random ledger key (32 bytes, hex) to a new file readable by its owner only. Point
    $LOOMRT_LEDGER_KEY_FILE at it on every machine that writes the record: new runs are then
    chained v2 (keyed), and a writer without the key can no longer forge a chain that verifies."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SpecError(f"{path} exists: a ledger key is never overwritten (runs chained with it need it)") from None
    except OSError as exc:
        raise SpecError(f"cannot create {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(secrets.token_hex(32) + "\n")
    out.print(f"wrote a ledger key to {path}; set LOOMRT_LEDGER_KEY_FILE={path} for every writer", highlight=False)
