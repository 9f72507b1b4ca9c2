"""The ``audit`` measure: pins kept, private material withheld, prompts re-derived.

Per retention mode (recap, compaction, append with its backstop), on scripted interactive chats:

- **pins**: the user states a decision early; an operator pins it (``runs pin``). Reported:
  the share of the later turns whose working context still holds the decision verbatim,
  with the pin and, as the control, without it (here the summariser is an ordinary
  extractive one: the first twelve words of each line);
- **private**: the first turn calls a vault tool whose result is a secret, and the
  summariser is the worst there is (it copies its whole input into the summary). Reported: how
  many summaries and summariser prompts contain the secret when the tool is private, and,
  as the control, when it is an ordinary tool;
- **readers**: per mode, stateful included, a chat built to leak (:mod:`loomrt.bench.leak_measure`:
  a model that quotes the private token and a marked PIN and copies them into Σ, a summariser
  that copies its whole input, a fork that talks on), read by every reader (the record's
  events, MCP ``get_run`` and ``get_events``, the export, the context as of the end), parent
  and fork: how many readers return a secret; the control (an ordinary tool, no mark) must
  show them in the readers that carry the text at all (most; a distilled context may not);
- **verify**: ``runs verify``'s prompt check (the working context re-derived at every turn
  and hashed) on a 200-turn recap chat: milliseconds per 1,000 events, and what hashing
  one prompt costs a turn.

The design fails if a pinned decision is ever missing (kept < 100 %), if a private secret
reaches any summary or summariser prompt (leaks > 0), or if the controls show nothing to
guard against (unpinned kept 100 %, control leaks 0: the chat would not test the guard).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure
from loomrt.bench.leak_measure import MODES as READER_MODES
from loomrt.bench.leak_measure import reader_leaks

__all__ = ["audit", "audit_figures"]

DECISION = "Decision: the launch date is fixed at 14 March and the budget at 9,400 euros; do not reopen it."
SECRET = "vault-token-7Q9Z-SECRET"
MODES = ("recap", "compaction", "append", "fold")


def _filler(i: int) -> str:
    return f"Note {i}: the venue team sent another long update about chairs, lights, parking and catering."


class _Copier:
    """Turns: call the vault once (when offered), then acknowledge. Summaries: the whole input,
    copied (``copy``), or the first words of each line (an ordinary extractive summariser)."""

    def __init__(self, *, copy: bool) -> None:
        self.prompts: list[str] = []
        self.vaulted = False
        self.copy = copy

    def __call__(self, request: Any) -> Any:
        from loomrt.messages import ToolCall
        from loomrt.providers.base import ModelResponse

        if request.purpose != "turn":
            text = "\n".join(str(m.get("content") or "") for m in request.messages if m.get("role") == "user")
            self.prompts.append(text)
            if not self.copy:
                from loomrt.providers.scripted import extractive_summary

                return ModelResponse(text=extractive_summary(request, max_chars=500, words_per_line=12))
            return ModelResponse(text="The account of the span: " + text[:1500])
        if not self.vaulted and any(t.name == "vault" for t in request.tools):
            self.vaulted = True
            return ModelResponse(text="", tool_calls=(ToolCall(id="v1", name="vault", arguments={}),))
        return ModelResponse(text="Noted; filed with the rest of the plan.")


async def _chat(folder: Path, mode: str, *, pin: bool, private: bool | None, turns: int) -> dict[str, Any]:
    from loomrt.record.sqlite import SQLiteStore
    from loomrt.run.pin_record import pin_in_record
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentSpec
    from loomrt.testing import FunctionProvider
    from loomrt.tools import Tool

    copier = _Copier(copy=private is not None)
    tools = (
        []
        if private is None
        else [
            Tool(
                "vault", "The deployment token.", {"type": "object", "properties": {}}, lambda: SECRET, private=private
            )
        ]
    )
    store = SQLiteStore(folder / f"{mode}-{pin}-{private}.db")
    runtime = Runtime(store, providers=lambda s, m: FunctionProvider(copier), tools=tools, embedder=False)
    ctx: dict[str, Any] = {"mode": mode, "budget_tokens": 500, "keep_last_n": 2, "autocompact_at_pct": 60}
    if mode == "append":
        ctx["backstop"] = True
    spec = AgentSpec(
        model="function/inline", system_prompt="You keep the user's plans.", tools=[t.name for t in tools], context=ctx
    )
    run = await runtime.astart(spec, interactive=True, name=f"audit-{mode}")
    kept = []
    for i, text in enumerate(["Plan the launch with me.", DECISION, *(_filler(j) for j in range(turns - 2))]):
        await runtime.send(run, text)
        if i == 1 and pin:
            seq = store.events(run.run_id, kinds=["user_input"])[-1].seq
            pin_in_record(store, run.run_id, seq=seq, note="the user's decision")
        if i > 1:
            kept.append(any(DECISION in m.content for m in run.context))
    summaries = [e.data.get("summary") or "" for e in store.events(run.run_id, kinds=["distillation"])]
    leaks = sum(SECRET in s for s in summaries) + sum(SECRET in p for p in copier.prompts)
    store.close()
    return {
        "distillations": len(summaries),
        "kept": sum(kept) / len(kept) if kept else 0.0,
        "leaks": leaks,
        "summariser_calls": len(copier.prompts),
    }


def _verify_cost(folder: Path) -> dict[str, Any]:
    from loomrt.audit import prompt_hash, prompt_problems
    from loomrt.bench.load import play_concurrently

    asyncio.run(play_concurrently(1, 200, latency_s=0.0, db=folder / "verify.db"))
    from loomrt.record.sqlite import SQLiteStore

    store = SQLiteStore(folder / "verify.db")
    (info,) = [r for r in store.list_runs(limit=5) if r.agent != "load--1"][:1] or store.list_runs(limit=1)
    events = store.events(info.run_id)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        problems = prompt_problems(events)
        times.append(time.perf_counter() - started)
    from loomrt.run.projection import project

    wire = project(events).wire
    hashes = []
    for _ in range(200):
        started = time.perf_counter()
        prompt_hash(wire)
        hashes.append(time.perf_counter() - started)
    checked = sum(1 for e in events if e.kind == "model_call" and e.data.get("prompt_from") == "context")
    store.close()
    return {
        "events": len(events),
        "prompts_checked": checked,
        "problems": len(problems),
        "ms_per_1000_events": round(statistics.median(times) * 1000 / len(events) * 1000, 2),
        "hash_us_per_turn": round(statistics.median(hashes) * 1e6, 1),
        "context_messages": len(wire),
    }


def audit_figures(turns: int = 16) -> dict[str, Any]:
    """The figures of :func:`audit` (see the module docstring)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for mode in MODES:
            pinned = asyncio.run(_chat(folder, mode, pin=True, private=None, turns=turns))
            unpinned = asyncio.run(_chat(folder, mode, pin=False, private=None, turns=turns))
            guarded = asyncio.run(_chat(folder, mode, pin=False, private=True, turns=turns))
            control = asyncio.run(_chat(folder, mode, pin=False, private=False, turns=turns))
            rows.append(
                {
                    "mode": mode,
                    "distillations": pinned["distillations"],
                    "pinned_kept": round(pinned["kept"], 3),
                    "unpinned_kept": round(unpinned["kept"], 3),
                    "private_leaks": guarded["leaks"],
                    "control_leaks": control["leaks"],
                    "summariser_calls": guarded["summariser_calls"],
                }
            )
        verify = _verify_cost(folder)
        readers = [
            {**reader_leaks(folder / f"readers-{mode}", mode, private=True), "control": _control(folder, mode)}
            for mode in READER_MODES
        ]
    return {"turns": turns, "rows": rows, "verify": verify, "readers": readers}


def _control(folder: Path, mode: str) -> dict[str, Any]:
    """The same chat with an ordinary tool and no mark: how many readers show the secrets."""
    row = reader_leaks(folder / f"control-{mode}", mode, private=False)
    return {"leaking": row["leaking"], "readers": row["readers"]}


@standalone_measure(
    "audit", "pins kept verbatim, private results withheld from a copying summariser, prompts re-derived"
)
def audit(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    progress.start("audit", 1)
    out = audit_figures(12 if config.quick else 16)
    progress.advance()
    return out
