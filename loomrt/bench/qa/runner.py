"""``loomrt bench qa``: a real model answers LoCoMo questions after its context was distilled.

For each conversation, each configuration answers the same questions:

- ``full``: the whole conversation in the prompt (when it fits the model's window); the
  questions follow one another on the same prefix, so llama.cpp prefills it once;
- ``recall``: only the question and Recall's top-k results (verbatim, dated) over an index
  of every turn;
- a retention mode (``recap``, ``compaction``; ``stateful`` on request): the conversation is
  replayed into a real run of that mode (the model writes every distillation), and each
  question is sent to a fork of the final run, with Recall available and the model
  deciding whether to use it;
- ``MODE/no-recall``: the same forks with Recall off: what the distillations alone kept;
- ``memory`` (and ``memory/passages-only``): a new run of the same user answers from
  durable memory alone (:mod:`loomrt.bench.qa.memory`).

Every answer is appended to ``answers.jsonl`` in the output folder as soon as it exists, and
finished replays are kept in ``runs.db`` there, so an interrupted benchmark continues
where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loomrt.bench.core import NullProgress, Progress
from loomrt.bench.locomo_recall import load_locomo, render_turn, replay, sample_id, turns_of
from loomrt.bench.qa.grade import contains, gold_answer, grade
from loomrt.bench.qa.memory import MEMORY_CONFIGS, ask_memory, banked_turns, memory_spec, remember
from loomrt.bench.qa.parts import QUESTION_PREFIX, Acknowledging, Meter, Metered, QAReader
from loomrt.bench.qa.replay import QA_INSTRUCTION, Asked, ask, qa_spec, queued_distillation, replay_mode, settle_replay
from loomrt.errors import SpecError
from loomrt.providers.base import ModelProvider, ModelRequest
from loomrt.recall.embedders import EmbedderChoice
from loomrt.record.sqlite import SQLiteStore
from loomrt.spec import AgentSpec
from loomrt.tokens import count_text

__all__ = ["QAConfig", "DEFAULT_CONFIGS", "KNOWN_CONFIGS", "run_qa", "run_qa_async", "select_questions", "SCRIPTED"]

DEFAULT_CONFIGS = ["full", "recall", "recap", "recap/no-recall", "compaction", "compaction/no-recall"]
"""Each replay's configurations together, so an interrupted benchmark has whole ones."""
INJECT_CONFIGS = [
    "full/inject",
    "recap/inject",
    "recap/inject-only",
    "compaction/inject",
    "compaction/inject-only",
    "fold",
    "fold/no-recall",
    "fold/inject",
    "fold/inject-only",
]
"""Recall injection's rows (``MODE/inject``: injection and the Recall tool; ``MODE/inject-only``:
injection alone; ``full/inject``: the distractor guard, every answer already in the prompt)."""
KNOWN_CONFIGS = [*DEFAULT_CONFIGS, "stateful", "stateful/no-recall", *INJECT_CONFIGS, *MEMORY_CONFIGS]
SCRIPTED = "scripted"
"""``--model scripted``: the scripted reader (:class:`~loomrt.bench.qa.parts.QAReader`), for tests."""

FULL_SYSTEM = "You have read the conversation below between two people. " + QA_INSTRUCTION
RECALL_SYSTEM = (
    "You answer questions about a long conversation between two people from excerpts of it "
    "that a search found for the question. " + QA_INSTRUCTION
)


@dataclass
class QAConfig:
    """What ``loomrt bench qa`` runs."""

    data: Path
    model: str = "local/qwen2.5-coder-1.5b"
    conversations: list[str] | None = None
    """Sample ids (default: the first conversation of the file)."""
    questions: int | None = 30
    """Questions per conversation, spread evenly over its list (None: all)."""
    configs: list[str] = field(default_factory=lambda: list(DEFAULT_CONFIGS))
    budget_tokens: int = 2048
    """The working-context budget of the replayed runs."""
    top_k: int = 10
    """Recall results the ``recall`` configuration answers from."""
    inject_tokens: int = 640
    """``MODE/inject`` rows: the tokens reserved for injected passages (context.recall_inject_tokens),
    on top of the replay's budget, so every question meets the replay's working context."""
    window: int = 32768
    """The model's context window (the ``full`` configuration runs where the conversation fits)."""
    embedder: str = "default"
    judge: str | None = None
    out: Path | None = None
    one_call_turns: bool | None = None
    """On the embedded model, a question whose run offers a tool (Recall) is decided and
    answered in one generation (``capabilities.one_call_turns``), or in two calls; None is
    the model's own default (one generation on the embedded model)."""

    def one_call(self) -> bool:
        """Whether the asked model decides and answers in one generation (only the embedded
        model has the grammar for it)."""
        if not self.model.startswith("local/"):
            return False
        if self.one_call_turns is not None:
            return self.one_call_turns
        from loomrt.providers.registry import capabilities_for

        return capabilities_for(self.model).one_call_turns

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["data"], out["out"] = str(self.data), str(self.out) if self.out else None
        out["one_call_turns"] = self.one_call()
        return out


def select_questions(sample: dict[str, Any], n: int | None) -> list[tuple[int, dict[str, Any]]]:
    """``n`` questions of the sample, evenly spaced over its list (so the categories keep
    their proportions), each with its index in the list."""
    qa = [(i, q) for i, q in enumerate(sample["qa"]) if isinstance(q, dict) and q.get("question")]
    if n is None or n <= 0 or n >= len(qa):  # 0 is all, as on the command line
        return qa
    step = len(qa) / n
    return [qa[int(i * step)] for i in range(n)]


class _Answers:
    """The answers so far, appended to ``answers.jsonl`` (kept in memory without ``--out``).
    An answer asked another way (one generation or two calls) is not this run's: it is asked
    again."""

    def __init__(self, folder: Path | None, *, one_call_turns: bool = False):
        self.path = folder / "answers.jsonl" if folder else None
        self.one_call_turns = one_call_turns
        self.rows: dict[tuple[str, str, int], dict[str, Any]] = {}
        if self.path and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line cut by an interruption: that answer is asked again
                if bool(row.get("one_call_turns", False)) == one_call_turns:
                    self.rows[(row["conversation"], row["config"], row["qid"])] = row

    def has(self, cid: str, config: str, qid: int) -> bool:
        return (cid, config, qid) in self.rows

    def add(self, row: dict[str, Any]) -> None:
        if self.one_call_turns:
            row = {**row, "one_call_turns": True}
        self.rows[(row["conversation"], row["config"], row["qid"])] = row
        if self.path:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


class _Session:
    """One benchmark: the provider, the meter, the record of replays, the caches."""

    def __init__(self, config: QAConfig, progress: Progress):
        self.config, self.progress = config, progress
        self.meter = Meter()
        self.answers = _Answers(config.out, one_call_turns=config.one_call())
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        if config.out:
            config.out.mkdir(parents=True, exist_ok=True)
            folder = config.out
        else:  # a folder of its own: durable memory (the memory rows) lives beside a record file
            self._scratch = tempfile.TemporaryDirectory(prefix="loomrt-qa-")
            folder = Path(self._scratch.name)
        self.store = SQLiteStore(folder / "runs.db")
        self.replays_path = folder / "replays.json" if config.out else None
        self.replays: dict[str, Any] = {}
        if self.replays_path and self.replays_path.exists():
            self.replays = json.loads(self.replays_path.read_text(encoding="utf-8"))
        from loomrt.recall.embedders import CachedEmbedder, resolve_embedder

        inner = resolve_embedder(None if config.embedder == "default" else config.embedder)
        self.embedder: EmbedderChoice = CachedEmbedder(inner) if inner is not None else False
        self._providers: dict[str, ModelProvider] = {}
        self._judge: ModelProvider | None = None

    def provider(self, spec: AgentSpec) -> ModelProvider:
        if self.config.model == SCRIPTED:
            from loomrt.testing import FunctionProvider

            return FunctionProvider(QAReader(), local=True, context_window=self.config.window, name="bench/scripted")
        if spec.model not in self._providers:
            from loomrt.providers import resolve_provider

            self._providers[spec.model] = resolve_provider(spec)
        return self._providers[spec.model]

    def spec(self, mode: str = "append", recall: bool = True) -> AgentSpec:
        model = "bench/scripted" if self.config.model == SCRIPTED else self.config.model
        local = model.startswith("local/")
        return qa_spec(
            model,
            mode,
            budget_tokens=self.config.budget_tokens,
            recall=recall,
            window=self.config.window if local else None,
            one_call_turns=self.config.one_call() if local else None,
        )

    def close(self) -> None:
        from loomrt.harvest.wiring import release

        release(self.store)  # durable memory's connections, where the memory rows opened it
        self.store.close()
        if self._scratch is not None:
            self._scratch.cleanup()

    def save_replays(self) -> None:
        if self.replays_path:
            self.replays_path.write_text(json.dumps(self.replays, indent=2) + "\n", encoding="utf-8")

    async def judge(self, question: str, gold: str, answer: str) -> bool | None:
        if not self.config.judge:
            return None
        if self._judge is None:
            from loomrt.providers import resolve_provider

            self._judge = resolve_provider(AgentSpec(model=self.config.judge, system_prompt="You grade answers."))
        prompt = (
            f"Question: {question}\nGold answer: {gold}\nAnswer given: {answer}\n"
            "Does the answer given mean the same as the gold answer (for a date: the same date)? "
            "Reply with one word: CORRECT or WRONG."
        )
        response = await self._judge.complete(
            ModelRequest(messages=[{"role": "user", "content": prompt}], max_tokens=4, temperature=0)
        )
        return "CORRECT" in (response.text or "").upper()


async def _direct(
    session: _Session, system: str, context: str, question: str, *, block: str | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """One answer from a prompt built by hand (``full`` and ``recall``), metered; ``block``
    (recalled passages) follows the question, as the runtime places it."""
    provider = Metered(session.provider(session.spec()), session.meter)
    mark = session.meter.mark()
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"{context}\n\n{QUESTION_PREFIX}{question}"},
        *([{"role": "user", "content": block}] if block else []),
    ]
    response = await provider.complete(ModelRequest(messages=messages, max_tokens=64, temperature=0))
    return (response.text or "").strip(), session.meter.since(mark)


def _full_block(recall_index: Any, question: str, tokens: int) -> str | None:
    """The block the runtime would inject for ``question`` from an index of every turn (the
    relevance floor and the token reserve as a run applies them; nothing is left out for being
    in the prompt already, since everything is: this row measures what a block of distractors costs)."""
    from loomrt.injection import BLOCK_FOOTER, BLOCK_HEADER, passage_line, render_block, said_on
    from loomrt.run.inject import TOP_K, relevant

    hits = [h for h in recall_index.search(question, top_k=TOP_K) if relevant(h)]
    passages, used = [], count_text(BLOCK_HEADER) + count_text(BLOCK_FOOTER) + 8
    for h in hits:
        p = {
            "seq": h.seq,
            "speaker": h.speaker or h.role,
            "date": said_on(h.ts),
            "text": h.text,
        }
        cost = count_text(passage_line(p))
        if used + cost <= tokens:
            passages.append(p)
            used += cost
    return render_block(passages) if passages else None


async def _ensure_replay(session: _Session, cid: str, sample: dict[str, Any], mode: str) -> dict[str, Any]:
    """The finished replay of ``sample`` in ``mode`` (played now if there is none yet)."""
    key = f"{cid}:{mode}:{session.config.budget_tokens}:{session.config.model}"
    if key in session.replays:
        info = session.replays[key]
        if queued_distillation(session.store, info["run_id"]):  # a replay finished before settle_replay
            mark, started = session.meter.mark(), time.perf_counter()
            provider = Acknowledging(session.provider(session.spec(mode)), session.meter)
            await settle_replay(session.store, info["run_id"], provider, embedder=session.embedder)
            calls = Meter.totals(session.meter.since(mark))
            info["seconds"] = round(info["seconds"] + time.perf_counter() - started, 1)
            info.update(_distilled(session.store.events(info["run_id"])))
            for k, v in calls.items():
                info[f"distil_{k}"] = round(
                    (max if k.startswith("largest") else sum)((info.get(f"distil_{k}", 0), v)), 2
                )
            session.save_replays()
        return dict(info)
    spec = session.spec(mode)
    provider = Acknowledging(session.provider(spec), session.meter)
    mark, started = session.meter.mark(), time.perf_counter()
    turns = turns_of(sample)
    session.progress.start(f"{cid} · replay in {mode}", len(turns))
    run_id = await replay_mode(
        session.store,
        sample,
        spec,
        provider,
        name=f"qa-{cid}-{mode}",
        embedder=session.embedder,
        on_turn=session.progress.advance,
    )
    info = {
        "run_id": run_id,
        "seconds": round(time.perf_counter() - started, 1),
        **_distilled(session.store.events(run_id)),
        **{f"distil_{k}": v for k, v in Meter.totals(session.meter.since(mark)).items()},
    }
    session.replays[key] = info
    session.save_replays()
    return info


def _distilled(events: list[Any]) -> dict[str, int]:
    """What a replay's record says its distillations came to."""
    kinds = [e.kind for e in events]
    return {
        "distillations": kinds.count("distillation"),
        "declined": kinds.count("distillation_declined"),
        "rejected_summaries": kinds.count("summary_rejected"),
    }


async def _ensure_memory(session: _Session, cid: str, sample: dict[str, Any]) -> dict[str, Any]:
    """The durable memory of ``sample``'s user: its replay banked and consolidated by the
    model (done now if it is not yet; :func:`~loomrt.bench.qa.memory.remember`)."""
    key = f"{cid}:memory:{session.config.budget_tokens}:{session.config.model}"
    if key in session.replays:
        return dict(session.replays[key])
    spec = session.spec("recap")
    if session.config.model == SCRIPTED:
        from loomrt.harvest.scripted import echo_extractor

        extractor: ModelProvider = echo_extractor()
    else:
        extractor = session.provider(spec)
    session.progress.start(f"{cid} · replay in recap, banking to memory, then consolidation", len(turns_of(sample)))
    info = await remember(
        session.store,
        sample,
        spec,
        Acknowledging(session.provider(spec), session.meter),
        extractor,
        session.meter,
        cid=cid,
        embedder=session.embedder,
        on_turn=session.progress.advance,
    )
    session.replays[key] = info
    session.save_replays()
    return info


async def _ask_memory(
    session: _Session, cid: str, sample: dict[str, Any], question: str, *, passages_only: bool
) -> Asked:
    """``question`` put to a new run of the user that reads only durable memory."""
    from loomrt.harvest.wiring import memory_store

    spec = memory_spec(session.spec("recap"), inject_tokens=session.config.inject_tokens, harvest=False)
    return await ask_memory(
        memory_store(session.store, session.embedder),
        cid,
        question,
        spec,
        Metered(session.provider(spec), session.meter),
        embedder=session.embedder,
        tiers=("passages",) if passages_only else ("facts", "passages"),
        turns=banked_turns(sample),
    )


async def _answer_config(
    session: _Session,
    cid: str,
    sample: dict[str, Any],
    config: str,
    questions: list[tuple[int, dict[str, Any]]],
    conversation: str,
) -> dict[str, Any] | None:
    """Answer the pending ``questions`` in ``config``; what the configuration cost once (a replay)."""
    pending = [(i, q) for i, q in questions if not session.answers.has(cid, config, i)]
    base, _, option = config.partition("/")
    setup: dict[str, Any] | None = None
    recall_index: Any = None
    seq_dia: dict[str, str] = {}
    if base == "memory":
        setup = await _ensure_memory(session, cid, sample)
    elif base not in ("full", "recall"):
        setup = await _ensure_replay(session, cid, sample, base)
        inputs = [e.seq for e in session.store.events(setup["run_id"], kinds=["user_input"])]
        seq_dia = {str(s): t.dia_id for s, t in zip(inputs, turns_of(sample), strict=False)}
    if not pending:
        return setup
    if base == "full" and count_text(conversation) * 1.15 + 200 > session.config.window:
        session.progress.note(f"{cid}: full does not fit the {session.config.window}-token window; skipped")
        return {"skipped": f"the conversation ({count_text(conversation)} tokens) does not fit the window"}
    if base == "recall" or config == "full/inject":
        session.progress.start(f"{cid} · index for recall", len(turns_of(sample)))
        _, run, _ = await replay(sample, embedder=session.embedder, on_turn=session.progress.advance)
        recall_index = run.toolset.recall
    session.progress.start(f"{cid} · {config}", len(pending))
    for qid, q in pending:
        question = str(q["question"])
        started = time.perf_counter()
        recall_calls, context_tokens, status = 0, 0, "done"
        category = int(q.get("category", 0))
        gold = gold_answer(q)
        seen: dict[str, Any] = {}  # where the gold answer was, word for word (never shown to the model)

        def has(text: str, category: int = category, gold: str = gold) -> bool | None:
            return None if category == 5 else contains(text, gold.split(";")[0])

        if config == "full/inject":  # the distractor guard: the whole conversation, and a block besides
            block = _full_block(recall_index, question, session.config.inject_tokens)
            answer, calls = await _direct(session, FULL_SYSTEM, f"Conversation:\n{conversation}", question, block=block)
            seen["gold_in_context"] = has(conversation)
            seen["injected_none"] = block is None
        elif base == "full":
            answer, calls = await _direct(session, FULL_SYSTEM, f"Conversation:\n{conversation}", question)
            seen["gold_in_context"] = has(conversation)
        elif base == "memory":
            mark = session.meter.mark()
            asked = await _ask_memory(session, cid, sample, question, passages_only=option == "passages-only")
            answer, calls, status = asked.answer.strip(), session.meter.since(mark), asked.status
            evidence = {str(d) for d in q.get("evidence") or ()}
            seen["injected_none"] = not asked.injections
            seen["evidence_injected"] = any(d in evidence for d in asked.injected_dias)
            seen["gold_in_injected"] = has(asked.injected_text) if asked.injected_text else None
            seen["gold_in_context"] = False
        elif base == "recall":
            hits = recall_index.search(question, top_k=session.config.top_k)
            excerpts = "\n".join(h.text for h in hits) or "(nothing found)"
            answer, calls = await _direct(session, RECALL_SYSTEM, f"Excerpts:\n{excerpts}", question)
            recall_calls = 1
            seen["gold_in_recall"] = has(excerpts)
        else:
            assert setup is not None
            provider = Metered(session.provider(session.spec(base)), session.meter)
            mark = session.meter.mark()
            asked = await ask(
                session.store,
                setup["run_id"],
                question,
                provider,
                embedder=session.embedder,
                recall=option != "no-recall",
                tool=option != "inject-only",
                inject_tokens=session.config.inject_tokens if option in ("inject", "inject-only") else 0,
            )
            answer, calls, status = asked.answer.strip(), session.meter.since(mark), asked.status
            recall_calls, context_tokens = asked.recall_calls, asked.context_tokens
            seen["gold_in_context"] = has(asked.context_text)
            seen["recall_queries"] = list(asked.recall_queries)
            seen["gold_in_recall"] = has("\n".join(asked.recall_results)) if asked.recall_results else None
            if option in ("inject", "inject-only"):
                evidence = {str(d) for d in q.get("evidence") or ()}
                dias = seq_dia
                seen["injected_none"] = not asked.injected_seqs
                seen["evidence_injected"] = any(dias.get(str(s)) in evidence for s in asked.injected_seqs)
                seen["gold_in_injected"] = has(asked.injected_text) if asked.injected_text else None
        row = {
            "conversation": cid,
            "config": config,
            "qid": qid,
            "category": category,
            "question": question,
            "gold": gold,
            "answer": answer,
            "status": status,
            **grade(category, answer, gold),
            "judge": await session.judge(question, gold, answer),
            "recall_calls": recall_calls,
            "context_tokens": context_tokens,
            "seconds": round(time.perf_counter() - started, 2),
            **Meter.totals(calls),
            **seen,
        }
        session.answers.add(row)
        session.progress.advance()
    return setup


async def run_qa_async(config: QAConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run the QA benchmark; the results (also written to ``config.out`` as they come)."""
    from loomrt.bench.qa.summary import summarize

    progress = progress or NullProgress()
    unknown = [c for c in config.configs if c not in KNOWN_CONFIGS]
    if unknown:
        raise SpecError(f"unknown configuration {', '.join(unknown)}; known: {', '.join(KNOWN_CONFIGS)}")
    samples = load_locomo(config.data)
    ids = [sample_id(s, i) for i, s in enumerate(samples)]
    wanted = config.conversations or ids[:1]
    missing = [c for c in wanted if c not in ids]
    if missing:
        raise SpecError(
            f"no conversation {', '.join(missing)} in the file; it has {', '.join(ids)}", where=str(config.data)
        )
    session = _Session(config, progress)
    started = time.perf_counter()
    setups: dict[str, dict[str, Any]] = {}
    sizes: dict[str, int] = {}
    chosen: dict[str, list[int]] = {}
    for cid in wanted:
        sample = samples[ids.index(cid)]
        questions = select_questions(sample, config.questions)
        chosen[cid] = [i for i, _ in questions]
        conversation = "\n".join(render_turn(t) for t in turns_of(sample))
        sizes[cid] = count_text(conversation)
        for name in config.configs:
            setup = await _answer_config(session, cid, sample, name, questions, conversation)
            if setup:
                setups[f"{cid}:{name}"] = setup
    rows = [
        r
        for (cid, name, qid), r in session.answers.rows.items()
        if cid in chosen and qid in chosen[cid] and name in config.configs
    ]
    session.close()
    results = {
        "loomrt_bench_qa": 1,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": config.to_json(),
        "conversation_tokens": sizes,
        "setups": setups,
        "summary": summarize(rows, setups, sizes, config.configs),
        "seconds": round(time.perf_counter() - started, 1),
        "answers": sorted(rows, key=lambda r: (r["conversation"], config.configs.index(r["config"]), r["qid"])),
    }
    return results


def run_qa(config: QAConfig, progress: Progress | None = None) -> dict[str, Any]:
    """:func:`run_qa_async` for code that is not async."""
    return asyncio.run(run_qa_async(config, progress))
