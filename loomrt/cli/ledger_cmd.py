"""``loomrt runs verify`` and ``loomrt runs anchor``: proving a run's history (the ledger, the
head anchor, the event grammar and external anchors: :mod:`loomrt.record.integrity`)."""

from __future__ import annotations

import typer

from loomrt.cli._common import friendly, out, print_json, runtime
from loomrt.cli.runs_cmd import JsonOpt, runs_app

__all__ = ["verify_cmd"]


@runs_app.command("verify")
@friendly
def verify_cmd(run_id: str, json_output: bool = JsonOpt) -> None:
    """Check a run's record: seqs dense from 1, every event's ledger hash chained to the one
    before, and every turn's prompt the working context the record rebuilds at that moment."""
    from loomrt.audit import prompt_problems
    from loomrt.record.ledger import verify_chain

    store = runtime().store
    store.get_run(run_id)
    events = store.events(run_id)
    problems = verify_chain(events)
    problems += prompt_problems(events, store) if not problems else []
    checked = sum(1 for e in events if e.kind == "model_call" and e.data.get("prompt_from") == "context")
    if json_output:
        print_json(
            {
                "run_id": run_id,
                "events": len(events),
                "prompts_checked": checked,
                "clean": not problems,
                "problems": problems,
            }
        )
    elif problems:
        for line in problems:
            out.print(f"run {run_id}: {line}", markup=False, highlight=False)
    else:
        out.print(
            f"run {run_id}: {len(events)} events, {checked} prompts re-derived, the record audits clean",
            highlight=False,
        )
    if problems:
        raise typer.Exit(1)
