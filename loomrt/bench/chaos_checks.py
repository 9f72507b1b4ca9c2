"""The chaos harness's checks: what a run holds, and how a recovered run compares with the uninterrupted one.

:mod:`loomrt.bench.chaos` kills a scenario's processes and recovers the run; here, what a
run holds is read from its record (or from the live run the recovery played) into an
:class:`Outcome`: its answers, Σ, inputs, working context, recall texts, the record's model
calls (:class:`Call`), and with harvest the bank and durable memory. The checks compare a
recovered run's with the uninterrupted run's (:func:`check`, :func:`call_problems`, and
:func:`fork_problems` for forks):

- the record audits clean (seqs dense from 1, the ledger chain intact);
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

Each failed check is a violation: a sentence saying what differs (the texts missing or extra,
the purposes whose calls differ, where two contexts part).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrt.bench.chaos_scenarios import Scenario
from loomrt.run.loop import INTERRUPTED

if TYPE_CHECKING:
    from loomrt.record.store import Store
    from loomrt.run.state import RunState
    from loomrt.runtime import Runtime

__all__ = ["Outcome", "Call", "check", "fork_problems", "call_problems"]

RUN_ID = re.compile(r"\b[0-9a-f]{12}\b")


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


def _runtime(store: Store) -> Runtime:
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


def _recall_texts(run: RunState) -> list[str]:
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
        return banked, sorted(s for (s,) in db.rows("SELECT statement FROM memory_facts WHERE class <> 'passage'"))
    finally:
        db.close()


async def _outcome(store: Store, run_id: str, live: RunState | None = None, *, harvest: bool = False) -> Outcome:
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


def _calls(store: Store) -> list[Call]:
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


# ---------------------------------------------------------------------- checking


def fork_problems(store: Store, scenario: Scenario) -> list[str]:
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
    interrupted may pay fewer or more calls (the interrupted result is not the tool's, so the
    run distils by other sizes: a kill in tools-mcp's tool call made one more summary), and a
    call it paid twice still shows as a prompt paid again. Tokens per purpose must agree within 2% (prompts quote seqs, which a resume
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
    off = [] if interrupted else [p for p in sorted(set(got) | set(want)) if got[p] != want[p]]
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
