"""``loomrt bench harvest``: does harvest keep what matters, and does its queue hold?

Measures, each able to come out badly:

- **coreference**: the shipped corpus (:mod:`loomrt.harvest.coreference`), extracted as
  whole batches and span by span, by the model-free coreference extractor and by the
  embedded model. A case is kept when a live fact names the person and keeps the case's
  word; the model is told nothing about the cases.
- **paraphrase**: 5 facts in 3 wordings each, banked as three spans and consolidated by the
  echo extractor (which finds each line's subject) with the configured embedder (MiniLM):
  how many rows they become and how many facts stay apart. The goal is 5 rows, each holding
  one fact: more rows is restatements left unmerged (15 is no merging at all), fewer, or a
  row holding two facts, is facts merged that are not the same.
- **load**: spans banked over 4 scopes, drained by two worker processes with the echo
  extractor: lost lines, doubled lines (sent to the extractor more than once), spans per
  second.
- **locomo** (with ``--data``): each session of a LoCoMo conversation banked as one span,
  consolidated by the embedded model; then every answerable question searches durable
  memory, and counts as found at k when a top-k fact's sources include an evidence turn.
  The raw-span tier is ``bench recall``'s run over the same conversations. Reported per
  category, temporal apart, with the model's throughput (spans and turns per minute).
  Without the model (``use_model`` off), an extractor that states nothing: the passage tier
  alone against the raw turns.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loomrt.bench.harvest_figures import BUDGET_TIERS, BUDGETS, TIERS, Tally, locomo_totals, within
from loomrt.bench.locomo_recall import CATEGORY_NAMES
from loomrt.recall.embedders import EmbedderChoice

__all__ = [
    "coreference",
    "paraphrase",
    "load",
    "locomo_tiers",
    "locomo_totals",
    "TIERS",
    "harvest_bench",
    "drained",
    "bank_sessions",
    "as_read",
]

Progress = Callable[[str], None]

PARAPHRASE_SET: list[tuple[str, list[str]]] = [
    (
        "Joaquim",
        [
            "Joaquim keeps bees on the roof of his flat.",
            "Joaquim is a rooftop beekeeper at his flat.",
            "On the roof of his flat, Joaquim keeps bees.",
        ],
    ),
    (
        "Ines",
        ["Ines drinks her coffee black.", "Ines takes her coffee black, without milk.", "Ines likes black coffee."],
    ),
    (
        "Bertrand",
        [
            "Bertrand is training for a triathlon.",
            "Bertrand trains for a triathlon.",
            "Bertrand is preparing to compete in a triathlon.",
        ],
    ),
    (
        "Yuki",
        [
            "Yuki teaches piano to children.",
            "Yuki is a piano teacher for kids.",
            "Yuki gives piano lessons to children.",
        ],
    ),
    ("Oskar", ["Oskar grew up in Gdansk.", "Oskar spent his childhood in Gdansk.", "Oskar was raised in Gdansk."]),
]
"""Five facts in three wordings (not the calibration pairs: the band is not tuned on these)."""


async def drained(worker: Any, passes: int = 4) -> Any:
    """Passes until the queue is empty (a held batch is retried by the next pass, as a
    `consolidate --watch` worker would), at most ``passes``; the reports summed."""
    total = await worker.arun_once()
    for _ in range(passes - 1):
        if not worker.queue.scopes():
            break
        more = await worker.arun_once()
        total.batches += more.batches
        total.spans += more.spans
        total.facts.update(more.facts)
        total.dropped.update(more.dropped)
        total.dead += more.dead
        total.retries += more.retries
        total.stopped_repeating += more.stopped_repeating
        total.held += more.held
    return total


def _fresh(tmp: Path, name: str) -> Any:
    from loomrt.record.sqlite import SQLiteStore

    return SQLiteStore(tmp / f"{name}.sqlite")


def _bench_bank(db: Any, run_id: str, scope: str, max_tokens: int = 8000) -> Any:
    """A bank for ``run_id`` in ``scope`` with nothing private and no record."""
    from loomrt.harvest.bank import Bank

    return Bank(
        db,
        run_id=run_id,
        agent="bench",
        def_hash="0" * 16,
        scope=scope,
        max_tokens=max_tokens,
        private=set,
        record=lambda k, d: None,
    )


def _bank_cases(store: Any, cases: Sequence[tuple[str, str, tuple[str, ...]]]) -> None:
    from loomrt.harvest.db import harvest_db
    from loomrt.messages import EvictedSpan, Message

    for i, (named, said, _) in enumerate(cases):
        bank = _bench_bank(harvest_db(store.path), f"case{i}", f"user:case{i}")
        for j, text in enumerate((named, said)):
            bank.bank(
                EvictedSpan(
                    run_id=f"case{i}",
                    agent="bench",
                    mode="recap",
                    distillation_seq=10 + j,
                    messages=(Message(role="user", content=text, seq=2 * j + 1, ts=1_699_963_200.0),),
                )
            )


def _kept(store: Any, cases: Sequence[tuple[str, str, tuple[str, ...]]]) -> list[bool]:
    from loomrt.harvest.db import harvest_db

    db = harvest_db(store.path)
    out = []
    for i, (_, _, words) in enumerate(cases):
        facts = [
            s.lower()
            for (s,) in db.rows(
                "SELECT statement FROM memory_facts WHERE scope = ? AND status = 'live' AND class <> 'passage'",
                (f"user:case{i}",),
            )
        ]
        out.append(any(all(w.lower() in f for w in words) for f in facts))
    return out


async def coreference(tmp: Path, *, provider: Any, name: str) -> dict[str, Any]:
    """Whole-batch against per-span extraction of the corpus with ``provider``."""
    from loomrt.harvest.consolidator import Consolidator
    from loomrt.harvest.coreference import CASES

    out: dict[str, Any] = {"extractor": name, "cases": len(CASES)}
    for how, batch_tokens in (("whole_batch", 10_000), ("per_span", 1)):
        store = _fresh(tmp, f"coref-{name.replace('/', '-')}-{how}")
        _bank_cases(store, CASES)
        started = time.perf_counter()
        calls_before = len(getattr(provider, "calls", ()))
        report = await drained(
            Consolidator(store, provider=provider, embedder="hash", settle_s=0, batch_tokens=batch_tokens)
        )
        kept = _kept(store, CASES)
        out[how] = {
            "kept": sum(kept),
            "rate": round(sum(kept) / len(CASES), 3),
            "seconds": round(time.perf_counter() - started, 1),
            "calls": report.batches if not hasattr(provider, "calls") else len(provider.calls) - calls_before,
            "dropped": dict(report.dropped),
            "dead_letters": report.dead,
            "held": len(report.held),
        }
    return out


def paraphrase(tmp: Path, embedder: EmbedderChoice = None) -> dict[str, Any]:
    """How many rows 5 facts in 3 wordings become, and whether each fact stays apart.

    Each wording is a user line; the three wordings of the five facts are banked as three
    spans (one batch each) and consolidated by the echo extractor, which finds each line's
    subject itself (:func:`~loomrt.harvest.scripted.subject_of`). A row holds the facts whose
    lines its sources cite. 5 rows, each holding one fact, is the goal: more rows is
    restatements left unmerged, a row holding two facts is facts merged that are not the same."""
    from loomrt.harvest.consolidator import Consolidator
    from loomrt.harvest.db import harvest_db
    from loomrt.harvest.memory import MemoryStore
    from loomrt.harvest.scripted import echo_extractor
    from loomrt.messages import EvictedSpan, Message

    store = _fresh(tmp, "paraphrase")
    db = harvest_db(store.path)
    memory = MemoryStore(db, embedder=embedder)
    whose: dict[tuple[str, int], int] = {}
    for batch in range(3):
        run_id = f"paraphrase{batch}"
        bank = _bench_bank(db, run_id, "user:p")
        lines = []
        for i, (_, wordings) in enumerate(PARAPHRASE_SET):
            whose[(run_id, 2 * i + 1)] = i
            lines.append(Message(role="user", content=wordings[batch], seq=2 * i + 1, ts=1_699_963_200.0 + batch))
        bank.bank(EvictedSpan(run_id=run_id, agent="bench", mode="recap", distillation_seq=20, messages=tuple(lines)))
    worker = Consolidator(
        store, provider=echo_extractor(), memory=memory, db=db, settle_s=0, batch_tokens=1
    )  # one span a batch: three batches, as the wordings came
    asyncio.run(drained(worker))
    rows = memory.facts()
    held = [
        {whose[(src["run_id"], seq)] for src in row.sources for seq in src["seqs"] if (src["run_id"], seq) in whose}
        for row in rows
    ]
    mixed = [h for h in held if len(h) > 1]
    apart = [i for i in range(len(PARAPHRASE_SET)) if all(h == {i} for h in held if i in h)]
    stored = set().union(*held) if held else set()
    goal = len(PARAPHRASE_SET)
    verdict = (
        "goal met"
        if len(rows) == goal and len(apart) == goal
        else ("facts merged together" if mixed else "restatements left apart" if len(rows) > goal else "facts lost")
    )
    return {
        "facts": goal,
        "wordings": 3,
        "rows": len(rows),
        "goal_rows": goal,
        "kept_apart": len(apart),
        "rows_mixing_facts": len(mixed),
        "facts_stored": len(stored),
        "subjects": sorted({row.subject for row in rows}),
        "verdict": verdict,
        "embedder": getattr(memory.embedder, "name", "none"),
        "merge_cosine": memory.bands()[0],
    }


def load(tmp: Path, spans: int, *, workers: int = 2) -> dict[str, Any]:
    """``spans`` banked spans drained by ``workers`` processes with the echo extractor."""
    from loomrt.bench.harvest_load import bank_load, drain, verify

    store = _fresh(tmp, "load")
    store.close()
    texts = bank_load(store.path, spans)
    ran = drain(store.path, workers=workers, batch_tokens=200)
    figures = verify(store.path, texts, ran)
    return {
        "spans": spans,
        "workers": workers,
        **figures,
        "seconds": round(ran["wall_s"], 1),
        "spans_per_s": round(spans / ran["wall_s"], 1),
        "exit_codes": ran["exit_codes"],
    }


def _session_ts(date: str) -> float | None:
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return _dt.datetime.strptime(date.strip(), fmt).replace(tzinfo=_dt.UTC).timestamp()
        except ValueError:
            continue
    return None


async def locomo_tiers(
    tmp: Path,
    data: Path,
    *,
    provider: Any,
    conversations: Sequence[str] | None = None,
    ks: Sequence[int] = (1, 3, 5, 10),
    embedder: EmbedderChoice = None,
    part_tokens: int | None = None,
    raw: bool = True,
    progress: Progress | None = None,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
    done: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The memory tier (facts the embedded model consolidated from each session) against
    the raw-span tier (``bench recall``) on the same questions, one conversation at a time:
    bank its sessions, drain them, ask its questions; ``checkpoint`` gets the figures so far
    after each conversation, so a run stopped early still says what it measured. ``done``
    holds the records of conversations measured before (``--resume``): they are kept as
    they are and not measured again.

    A memory hit at k is counted two ways, neither of which a fact's merged sources can
    inflate: **states** (the top-k statements hold the gold answer's content words, as
    :func:`~loomrt.bench.qa.grade.states_answer` reads them; the raw tier's ``states`` is
    the same test on the top-k turns) and **cites** (an evidence turn is among the lines
    the top-k facts were first extracted from, ``sources[0]``, not those merges added)."""
    from loomrt.bench.locomo_recall import load_locomo, sample_id

    samples = [(sample_id(s, i), s) for i, s in enumerate(load_locomo(data))]
    chosen = [(cid, s) for cid, s in samples if not conversations or cid in conversations]
    records = dict(done or {})
    measured = {c for key, rec in records.items() for c in rec.get("covers", [key])}
    for cid, sample in chosen:
        if cid in measured:
            continue
        rec = await _locomo_conversation(
            tmp,
            data,
            cid,
            sample,
            provider=provider,
            ks=ks,
            embedder=embedder,
            part_tokens=part_tokens,
            raw=raw,
            progress=progress,
        )
        records[cid] = rec
        if checkpoint is not None:
            checkpoint(locomo_totals(records, [c for c, _ in chosen], ks))
    return locomo_totals(records, [c for c, _ in chosen], ks)


def bank_sessions(
    db: Any, cid: str, sample: dict[str, Any], scope: str, sessions: int | None = None
) -> tuple[dict[int, list[Any]], dict[int, str]]:
    """Bank each session of LoCoMo conversation ``cid`` (the first ``sessions``; all by
    default) as one evicted span of ``scope``; the messages by session, and each message's
    seq to its LoCoMo turn id."""
    from loomrt.bench.locomo_recall import turns_of
    from loomrt.messages import EvictedSpan, Message

    bank = _bench_bank(db, f"locomo-{cid}", scope, max_tokens=100_000)
    by_session: dict[int, list[Message]] = {}
    seq_to_dia: dict[int, str] = {}
    for i, t in enumerate(turns_of(sample)):
        if sessions is not None and t.session not in by_session and len(by_session) >= sessions:
            break
        text = t.text + (f" [shares a photo: {t.caption}]" if t.caption else "")
        by_session.setdefault(t.session, []).append(
            Message(role="user", name=t.speaker, content=text, seq=i + 1, ts=_session_ts(t.date))
        )
        seq_to_dia[i + 1] = t.dia_id
    for n, messages in sorted(by_session.items()):
        bank.bank(
            EvictedSpan(
                run_id=f"locomo-{cid}", agent="bench", mode="recap", distillation_seq=n, messages=tuple(messages)
            )
        )
    return by_session, seq_to_dia


def as_read(hit: Any) -> str:
    """A memory hit as the reader gets it and as the raw tier's turns are measured
    (``[date] Speaker: words``): the date its words were said and who said them (the line
    ``provenance.said`` shows), so a date or a name the answer needs counts as it does for a
    raw turn, and costs the tokens it costs there."""
    from loomrt.injection import said_on

    said = hit.provenance.get("said")
    who = said.get("speaker") if isinstance(said, dict) else None
    when = said_on(hit.ts)
    return f"{f'[{when}] ' if when else ''}{f'{who}: ' if who else ''}{hit.text}"


async def _locomo_conversation(
    tmp: Path,
    data: Path,
    cid: str,
    sample: dict[str, Any],
    *,
    provider: Any,
    ks: Sequence[int],
    embedder: EmbedderChoice,
    part_tokens: int | None,
    raw: bool,
    progress: Progress | None,
) -> dict[str, Any]:
    """One conversation's record: bank its sessions in a store of its own, drain them, ask its
    questions of memory (and of the raw turns, unless ``raw`` is off)."""
    from loomrt.bench.locomo_recall import ANSWERABLE, evaluate_locomo_async, evidence_ids
    from loomrt.bench.qa.grade import answer_words, gold_answer, states_answer
    from loomrt.harvest.consolidator import PART_TOKENS, Consolidator
    from loomrt.harvest.db import harvest_db
    from loomrt.harvest.memory import MemoryStore
    from loomrt.harvest.passages import FACT_TIERS
    from loomrt.harvest.passages import TIERS as BOTH

    parts = part_tokens or PART_TOKENS
    store = _fresh(tmp, f"locomo-{cid}-{parts}")
    db = harvest_db(store.path)
    memory = MemoryStore(db, embedder=embedder)
    scope = f"user:{cid}"
    by_session, seq_to_dia = bank_sessions(db, cid, sample, scope)

    def tick(_batches: int, spans: int) -> None:
        if progress is not None:
            progress(f"{cid}: consolidated {spans}/{len(by_session)} sessions")

    worker = Consolidator(
        store,
        provider=provider,
        memory=memory,
        db=db,
        settle_s=0,
        part_tokens=parts,
        max_parts=1 if part_tokens else 2,
        progress=tick if progress else None,
    )
    started = time.perf_counter()
    report = await drained(worker)
    consolidated_s = time.perf_counter() - started
    questions = [q for q in sample["qa"] if int(q.get("category", 0)) in ANSWERABLE and evidence_ids(q.get("evidence"))]
    facts = memory.facts([scope])
    states, cites, passages, fused = Tally(ks), Tally(ks), Tally(ks), Tally(ks)
    curves = {name: Tally(BUDGETS) for name in BUDGET_TIERS}
    for q in questions:
        cat, truth = int(q["category"]), gold_answer(q)
        gold = evidence_ids(q.get("evidence"))
        found = memory.search(str(q["question"]), max(ks), [scope], tiers=FACT_TIERS)
        own = [{seq_to_dia.get(s) for s in (h.provenance.get("sources") or [{}])[0].get("seqs", [])} for h in found]
        cites.add(cat, [bool(gold & set().union(*own[:k])) for k in ks])
        if answer_words(truth, cat):
            said = [as_read(h) for h in found]
            states.add(cat, [states_answer(" ".join(said[:k]), truth, cat) for k in ks])
            for tally, tiers in ((passages, ("passages",)), (fused, BOTH)):
                said = [as_read(h) for h in memory.search(str(q["question"]), max(ks), [scope], tiers=tiers)]
                tally.add(cat, [states_answer(" ".join(said[:k]), truth, cat) for k in ks])
            for name, which in BUDGET_TIERS.items():  # as much as each budget holds, best first
                said = [as_read(h) for h in memory.search(str(q["question"]), 80, [scope], tiers=which)]
                curves[name].add(cat, [states_answer(within(said, b), truth, cat) for b in BUDGETS])
    rec: dict[str, Any] = {
        "turns": len(seq_to_dia),
        "spans": len(by_session),
        "questions": len(questions),
        "facts": len(facts),
        "passages": len(memory.facts([scope], tiers=("passages",), limit=1_000_000)),
        "seconds": round(consolidated_s, 1),
        "part_tokens": parts,
        "dead_letters": report.dead,
        "batches": report.batches,
        "retries": report.retries,
        "dropped": dict(report.dropped),
        "writes": dict(report.facts),
        "measured_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "tallies": {
            "memory_states": states.figures(CATEGORY_NAMES),
            "memory_cites": cites.figures(CATEGORY_NAMES),
            "passage_states": passages.figures(CATEGORY_NAMES),
            "fused_states": fused.figures(CATEGORY_NAMES),
        },
        "budgets": {name: curve.figures(CATEGORY_NAMES) for name, curve in curves.items()},
        "sample_facts": [f.statement for f in facts[:5]],
    }
    if raw:
        if progress:
            progress(f"{cid}: the raw-span tier (bench recall)")
        spans = await evaluate_locomo_async(data, conversations=[cid], ks=ks, embedder=embedder, budgets=BUDGETS)
        rec["budgets"]["raw"] = spans["states_budgets"]
        rec["tallies"]["raw_evidence"] = {k: spans[k] for k in ("questions", "recall_at", "by_category")}
        rec["tallies"]["raw_states"] = {
            "questions": spans["states"]["questions"],
            "recall_at": spans["states"]["at"],
            "by_category": spans["states"]["by_category"],
        }
    return rec


def harvest_bench(
    *,
    data: Path | None = None,
    conversations: Sequence[str] | None = None,
    load_spans: int = 10_000,
    model: str | None = None,
    use_model: bool = True,
    part_sweep: Sequence[int] = (),
    progress: Progress | None = None,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
    done: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Every measure; the embedded-model ones unless ``use_model`` is off. ``checkpoint`` gets
    the figures so far (without ``seconds``) after each LoCoMo conversation; ``done`` holds
    LoCoMo records measured before (see :func:`locomo_tiers`)."""
    from loomrt.harvest.consolidator import _default_provider, harvest_model
    from loomrt.harvest.scripted import coreference_extractor, silent_extractor

    say = progress or (lambda _m: None)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="loomrt-bench-harvest-") as tmp_name:
        tmp = Path(tmp_name)
        result: dict[str, Any] = {"model": None}
        say("coreference (scripted)")
        result["coreference"] = [asyncio.run(coreference(tmp, provider=coreference_extractor(), name="scripted"))]
        say("paraphrase")
        result["paraphrase"] = paraphrase(tmp)
        say(f"load ({load_spans} spans, 2 workers)")
        result["load"] = load(tmp, load_spans)
        if not use_model and data is not None:  # the passage and raw tiers need no model: memory holds passages alone
            say("locomo: passages alone (no model)")
            result["model"] = "none: passages alone"
            result["locomo"] = asyncio.run(
                locomo_tiers(
                    tmp,
                    data,
                    provider=silent_extractor(),
                    conversations=conversations,
                    progress=say,
                    done=done,
                    checkpoint=None if checkpoint is None else (lambda lo: checkpoint({**result, "locomo": lo})),
                )
            )
        if use_model:
            result["model"] = harvest_model(model)
            provider = _default_provider(model)
            say(f"coreference ({result['model']})")
            result["coreference"].append(asyncio.run(coreference(tmp, provider=provider, name=result["model"])))
            if data is not None:
                say("locomo: memory tier")
                result["locomo"] = asyncio.run(
                    locomo_tiers(
                        tmp,
                        data,
                        provider=provider,
                        conversations=conversations,
                        progress=say,
                        done=done,
                        checkpoint=None if checkpoint is None else (lambda lo: checkpoint({**result, "locomo": lo})),
                    )
                )
                sweep = []
                for parts in part_sweep:
                    say(f"part budget {parts} tokens")
                    sweep.append(
                        asyncio.run(
                            locomo_tiers(
                                tmp,
                                data,
                                provider=provider,
                                conversations=conversations,
                                part_tokens=parts,
                                raw=False,
                                progress=say,
                            )
                        )
                    )
                if sweep:
                    result["part_sweep"] = [
                        {
                            k: r[k]
                            for k in ("part_tokens", "facts", "dead_letters", "retries", "seconds", "spans_per_min")
                        }
                        | {"memory_states_at": r["memory"]["states"]["recall_at"]}
                        for r in sweep
                    ]
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result
