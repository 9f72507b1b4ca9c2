"""The consolidator: drains the queue into durable memory, one scope at a time.

Deterministic code owns the pass; exactly one step calls a model (the extraction). Per
scope: take the lease ``harvest:SCOPE`` (it expires, so a dead worker blocks no one for
long) → read the watermark → finish any batch a dead worker claimed → take pending spans
oldest first, only from runs that have ended or been quiet for ``settle_s`` → claim them as
one batch → build its parts → extract → write the facts, mark the batch done and advance
the watermark in one transaction → renew the lease, next batch → release. Before the
scopes, the sweep (:mod:`loomrt.harvest.sweep`) banks from the record any span a crash kept
from the bank.

Three outcomes stay apart: ``[]`` (nothing worth keeping: the batch is done with no
facts); a reply that never parses after ``retries`` more tries (the batch goes to the
dead letters with the reply's prefix and the watermark moves on: a batch that can never
parse must not pin the queue); a failed write (the batch stays claimed and the watermark
holds; the next pass retries it). A model call that fails (not its reply: the provider
raised) holds the batch the same way, for ``retries`` more passes, then dead-letters it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loomrt.crashpoints import reached
from loomrt.errors import NotFoundError, ProviderError
from loomrt.harvest.backends import memory_of
from loomrt.harvest.db import Tables, harvest_db
from loomrt.harvest.evidence import stored_line
from loomrt.harvest.extract import (
    REPLY_SCHEMA,
    Line,
    Unparseable,
    check_fact,
    distinct,
    extraction_messages,
    parse_reply,
    parts_of,
    repeats_a_statement,
)
from loomrt.harvest.memory import MemoryStore, NewFact, fact_key
from loomrt.harvest.passages import MIN_CHARS, PASSAGE, passage_id, passage_key
from loomrt.harvest.queue import Queue
from loomrt.harvest.sweep import sweep
from loomrt.providers.base import STOPPED_BY_CALLER, ModelProvider, ModelRequest
from loomrt.recall.embedders import EmbedderChoice
from loomrt.record.owners import owner_is_gone, worker_name
from loomrt.visibility import private_record

__all__ = [
    "Consolidator",
    "PassReport",
    "BATCH_TOKENS",
    "PART_TOKENS",
    "MAX_PARTS",
    "SETTLE_S",
    "MODEL_ENV",
    "harvest_model",
]

PART_TOKENS = 1200
"""A part's budget in tokens (see docs/memory.md for where the embedded model broke)."""
MAX_PARTS = 2
"""Parts per extraction call: a batch longer keeps its latest parts and reports the rest."""
BATCH_TOKENS = PART_TOKENS * MAX_PARTS
"""Spans are taken into a batch while their conversation fits this many tokens (at least one span)."""
EXTRACT_MAX_TOKENS = 1024
"""The longest extraction reply (with the prompt and two parts it fits a 4,096-token window)."""
LEASE_S = 30.0
"""How long a consolidator's scope lease lasts without renewal (renewed every third of it)."""
SETTLE_S = 60.0
"""A run that has not ended is consolidated once it has been quiet this long."""
TAIL_AFTER_S = 3600.0
"""A run that has not ended has its tail banked (what its working context still holds, never
evicted: a chat's last words) once it has been quiet this long; an ended run's at once."""
ENDED = ("done", "failed", "cancelled")


@dataclass
class PassReport:
    """What one pass did."""

    batches: int = 0
    spans: int = 0
    facts: Counter[str] = field(default_factory=Counter)
    """new, merged, superseded, already."""
    dropped: Counter[str] = field(default_factory=Counter)
    """Statements dropped by reason: invalid, meta, ids, secret, unresolved, unsourced, and
    ``unverified`` (an exact value occurs neither in its source lines nor in their dates), and
    ``repeated`` (a statement the same reply had already made: dropped before merging)."""
    passages: Counter[str] = field(default_factory=Counter)
    """Passages (the batches' lines, verbatim): new, kept_once (the same words stored already)."""
    empty_batches: int = 0
    dead: int = 0
    parts_dropped: int = 0
    retries: int = 0
    held: list[str] = field(default_factory=list)
    """Scopes whose watermark a failed write held (with the error)."""
    busy: list[str] = field(default_factory=list)
    """Scopes another worker holds the lease of."""
    unsettled: int = 0
    """Pending spans left for later: their runs are still active."""
    swept: int = 0
    """Spans banked from the record by the sweep (a crash kept them from the bank)."""
    stopped_repeating: int = 0
    """Replies stopped where they began to repeat a statement (:func:`repeats_a_statement`)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "spans": self.spans,
            "facts": dict(self.facts),
            "dropped": dict(self.dropped),
            "passages": dict(self.passages),
            "empty_batches": self.empty_batches,
            "dead_letters": self.dead,
            "parts_dropped": self.parts_dropped,
            "retries": self.retries,
            "held": self.held,
            "busy": self.busy,
            "unsettled": self.unsettled,
            "swept": self.swept,
            "stopped_repeating": self.stopped_repeating,
        }


MODEL_ENV = "LOOMRT_HARVEST_MODEL"
"""The deployment's extraction model, where ``--model`` (``model=``) names none."""


def harvest_model(model: str | None = None) -> str:
    """The extraction model: ``model`` (the ``--model`` flag) if given, else
    ``$LOOMRT_HARVEST_MODEL``, else the embedded local model."""
    from loomrt.providers.models import DEFAULT_LOCAL_MODEL

    return (model or "").strip() or os.environ.get(MODEL_ENV, "").strip() or DEFAULT_LOCAL_MODEL


def _default_provider(model: str | None) -> ModelProvider:
    from loomrt.errors import SpecError
    from loomrt.providers import resolve_provider
    from loomrt.spec import AgentSpec

    chosen = harvest_model(model)
    try:
        return resolve_provider(AgentSpec(model=chosen), chosen)
    except (SpecError, ValueError) as exc:
        where = "--model" if (model or "").strip() else f"${MODEL_ENV}" if os.environ.get(MODEL_ENV, "").strip() else ""
        if not where:
            raise
        raise SpecError(
            f"the extraction model {chosen!r} (from {where}) cannot be used: {exc}. Name a model loomrt knows "
            f"(`loomrt doctor` lists the embedded ones), or unset {MODEL_ENV} for the embedded default."
        ) from None


class Consolidator:
    """Drains the harvest queue of the record ``store`` (SQLite or PostgreSQL).

    ``provider`` answers the extraction calls (default: ``model``, else
    ``$LOOMRT_HARVEST_MODEL``, else the embedded local model: :func:`harvest_model`); ``embedder`` is durable memory's (as for recall). ``progress(batches, spans)``
    hears about each batch written.
    """

    def __init__(
        self,
        store: Any,
        *,
        provider: ModelProvider | None = None,
        model: str | None = None,
        embedder: EmbedderChoice = None,
        settle_s: float = SETTLE_S,
        tail_after_s: float = TAIL_AFTER_S,
        part_tokens: int = PART_TOKENS,
        max_parts: int = MAX_PARTS,
        batch_tokens: int | None = None,
        retries: int = 2,
        lease_s: float = LEASE_S,
        holder: str | None = None,
        db: Tables | None = None,
        memory: MemoryStore | None = None,
        progress: Callable[[int, int], None] | None = None,
    ):
        self.store = store
        self.db = db or harvest_db(store)
        self.queue = Queue(self.db)
        self.memory = memory or memory_of(self.db, embedder)
        self._provider, self._model = provider, model
        self.settle_s, self.part_tokens, self.max_parts = settle_s, part_tokens, max_parts
        self.tail_after_s = tail_after_s
        self.batch_tokens = batch_tokens or part_tokens * max_parts
        self.retries, self.lease_s = retries, lease_s
        self.holder = holder or f"consolidator:{uuid.uuid4().hex[:6]}:{worker_name()}"
        """Whose scope leases these are: this consolidator, in this process (its worker name, so
        another consolidator of this machine sees at once when it is gone)."""
        self.progress = progress

    @property
    def provider(self) -> ModelProvider:
        if self._provider is None:
            self._provider = _default_provider(self._model)
        return self._provider

    # ------------------------------------------------------------------ passes

    def run_once(self, scopes: Sequence[str] | None = None) -> PassReport:
        """One pass over ``scopes`` (default: every scope with work queued)."""
        return asyncio.run(self.arun_once(scopes))

    async def arun_once(self, scopes: Sequence[str] | None = None) -> PassReport:
        report = PassReport()
        try:  # spans a crash kept from the bank come from the record first
            report.swept = sweep(self.store, self.db, self._settled, self._tail_settled)
        except Exception as exc:  # noqa: BLE001 - the queue is drained all the same
            report.held.append(f"sweep: {type(exc).__name__}: {exc}")
        for scope in scopes if scopes is not None else self.queue.scopes():
            await self._pass(scope, report)
        return report

    async def watch(
        self,
        scopes: Sequence[str] | None = None,
        *,
        interval_s: float = 5.0,
        on_pass: Callable[[PassReport], None] | None = None,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Pass after pass until ``stop()``, sleeping ``interval_s`` when a pass found nothing to do."""
        while not stop():
            report = await self.arun_once(scopes)
            if on_pass is not None:
                on_pass(report)
            if not report.batches:
                await asyncio.sleep(interval_s)

    def retry_dead(self) -> list[str]:
        """Put every dead letter back on the queue (the next pass extracts it again)."""
        revived = []
        for letter in self.queue.dead_letters():
            self.queue.revive(letter["batch_id"])
            revived.append(letter["batch_id"])
        return revived

    def _take(self, lease: str) -> bool:
        """The scope's lease: free, expired, ours, or held by a consolidator of this machine
        that is gone (a killed one's scope does not wait for its lease to run out)."""
        if self.store.take_lease(lease, self.holder, self.lease_s):
            return True
        other = self.store.lease_holder(lease)
        return bool(
            other and owner_is_gone(other) and self.store.take_lease(lease, self.holder, self.lease_s, replacing=other)
        )

    async def _keep(self, lease: str) -> None:
        """Renew ``lease`` every third of its time while a pass works (an extraction on a
        small local model takes minutes; the lease stays short, so a consolidator that stops
        on another machine holds its scope for ``lease_s`` at most)."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            with contextlib.suppress(Exception):  # a failed renewal: the claim check still guards each batch
                self.store.take_lease(lease, self.holder, self.lease_s)

    async def _pass(self, scope: str, report: PassReport) -> None:
        lease = f"harvest:{scope}"
        if not self._take(lease):
            report.busy.append(scope)
            return
        heartbeat = asyncio.create_task(self._keep(lease))
        try:
            for batch_id, spans in self.queue.claimed(scope):  # a dead worker's batches, as they were
                if not await self._batch(scope, batch_id, spans, report):
                    return
                self.store.take_lease(lease, self.holder, self.lease_s)
            while True:
                spans = self._next_spans(scope, report)
                if not spans:
                    return
                claimed = self.queue.claim(scope, spans)
                if claimed is None:
                    return  # claimed elsewhere meanwhile (a lease that expired under us)
                if not await self._batch(scope, claimed, spans, report):
                    return
                if not self.store.take_lease(lease, self.holder, self.lease_s):
                    return
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            self.store.release_lease(lease, self.holder)

    def _next_spans(self, scope: str, report: PassReport) -> list[dict[str, Any]]:
        """The next batch: pending spans after the watermark from settled runs, oldest
        first, while their conversation fits the batch budget (at least one)."""
        settled: dict[str, bool] = {}
        batch: list[dict[str, Any]] = []
        tokens = 0
        unsettled = 0
        for span in self.queue.pending(scope, after=self.queue.watermark(scope)):
            run = span["run_id"]
            if run not in settled:
                settled[run] = self._settled(run)
            if not settled[run]:
                unsettled += 1
                continue
            if batch and (tokens + span["tokens"] > self.batch_tokens or self._overflows([*batch, span])):
                break  # whole spans only, and never more parts than one call takes
            batch.append(span)
            tokens += span["tokens"]
        report.unsettled = unsettled
        return batch

    def _overflows(self, spans: list[dict[str, Any]]) -> bool:
        """Whether ``spans`` cut into parts would need more than one call's parts."""
        return parts_of(spans, part_tokens=self.part_tokens, max_parts=self.max_parts)[1] > 0

    def _settled(self, run_id: str, quiet_s: float | None = None) -> bool:
        """The run ended, or has been quiet for ``settle_s`` (``quiet_s``)."""
        quiet_s = self.settle_s if quiet_s is None else quiet_s
        try:
            info = self.store.get_run(run_id)
        except Exception:  # noqa: BLE001 - a run the record does not know: its spans are all there is
            return True
        if info.status in ENDED:
            return True
        last = self.store.events(run_id, after=max(0, info.last_seq - 1))
        return not last or time.time() - last[-1].ts >= quiet_s

    def _tail_settled(self, run_id: str) -> bool:
        """Whether run ``run_id``'s tail (what its working context still holds) is banked now:
        it ended, or has been quiet for ``tail_after_s``."""
        return self._settled(run_id, self.tail_after_s)

    # ------------------------------------------------------------------ one batch

    async def _batch(self, scope: str, batch_id: str, spans: list[dict[str, Any]], report: PassReport) -> bool:
        """Extract and write one claimed batch. False if the pass must stop (a failed write)."""
        spans = self._public(spans)
        parts, dropped_parts = parts_of(spans, part_tokens=self.part_tokens, max_parts=self.max_parts)
        lines = {line.n: line for part in parts for line in part}
        reply, items, error, model = "", None, "", None
        for attempt in range(self.retries + 1):
            if attempt:
                report.retries += 1
            try:
                reply, model, cut = await self._extract(parts, retry_after=error)
                items = parse_reply(reply, cut=cut)
                if cut:
                    report.stopped_repeating += 1
                break
            except Unparseable as exc:
                error = str(exc)
            except ProviderError as exc:
                if exc.retryable:  # a timeout, a 5xx: the batch waits for the next pass
                    if not self._hold(batch_id, scope, exc, report):
                        return False
                    reply, error = "", f"the extraction failed {self.retries + 1} times: {exc}"
                    break
                error = str(exc)  # e.g. JSON cut off at max_tokens: as unparseable, retried asking for fewer facts
            except Exception as exc:  # noqa: BLE001 - the model failed (not its reply): the batch waits
                if not self._hold(batch_id, scope, exc, report):
                    return False
                reply, error = "", f"the extraction failed {self.retries + 1} times: {type(exc).__name__}: {exc}"
                break
        base = {"spans": len(spans), "parts": len(parts), "parts_dropped": dropped_parts, "lines": len(lines)}
        report.parts_dropped += dropped_parts
        if items is None:  # no facts; the words are kept all the same (a passage needs no model)
            try:
                counts = self.memory.write(
                    [],
                    passages=passages_of(spans, scope, batch_id),
                    also=lambda conn: self.queue.dead_letter(
                        conn, batch_id, scope, reply, error, {**base, "error": error}
                    ),
                )
            except Exception as exc:  # noqa: BLE001 - the watermark holds; the next pass retries the batch
                report.held.append(f"{scope}: {type(exc).__name__}: {exc}")
                return False
            report.dead += 1
            report.batches += 1
            report.passages.update({k.removeprefix("passages_"): v for k, v in counts.items() if "passages_" in k})
            return True
        facts, dropped = self._facts(items, lines, scope, batch_id, spans, model=model)
        reached("in_consolidate")
        try:
            counts = self.memory.write(
                facts,
                passages=passages_of(spans, scope, batch_id),
                also=lambda conn: self.queue.finish(
                    conn, batch_id, scope, "done", {**base, "items": len(items), "dropped": dict(dropped)}
                ),
            )
        except Exception as exc:  # noqa: BLE001 - the watermark holds; the next pass retries the batch
            report.held.append(f"{scope}: {type(exc).__name__}: {exc}")
            return False
        report.batches += 1
        report.spans += len(spans)
        report.passages.update({k.removeprefix("passages_"): counts.pop(k) for k in list(counts) if "passages_" in k})
        report.facts.update(counts)
        report.dropped.update(dropped)
        report.empty_batches += not items
        if self.progress is not None:
            self.progress(report.batches, report.spans)
        return True

    def _hold(self, batch_id: str, scope: str, exc: Exception, report: PassReport) -> bool:
        """Count a failed model call on ``batch_id``: False while it may wait for the next pass
        (reported as held), True once it has failed ``retries + 1`` passes (a dead letter)."""
        failures = self.queue.failed(batch_id)
        if failures <= self.retries:
            report.held.append(
                f"{scope}: the extraction failed ({type(exc).__name__}: {exc}); "
                f"the batch waits for the next pass ({failures} of {self.retries + 1} tries)"
            )
            return False
        return True

    def _public(self, spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``spans`` without the lines of messages private now: the run's private seqs are
        read again from the record (an operator's ``loomrt runs private`` made after the span
        was banked counts), so neither a fact nor a passage is made of them."""
        private: dict[str, set[int]] = {}
        for run_id in dict.fromkeys(span["run_id"] for span in spans):
            try:
                private[run_id] = set(private_record(self.store, run_id).seqs)
            except NotFoundError:  # a run the record does not know: its spans are all there is
                private[run_id] = set()
        return [
            {**span, "turns": [t for t in span["turns"] if t.get("seq") not in private[span["run_id"]]]}
            if private[span["run_id"]]
            else span
            for span in spans
        ]

    async def _extract(self, parts: list[list[Line]], *, retry_after: str = "") -> tuple[str, str | None, bool]:
        """The extractor's reply, the model that wrote it, and whether it was stopped where it
        began to repeat itself; a retry says what was wrong with the last one and asks for
        fewer facts (the same request again would get the same reply)."""
        messages = extraction_messages(parts)
        if retry_after:
            messages[-1] = {
                **messages[-1],
                "content": messages[-1]["content"].removesuffix("JSON:")
                + f"Your last answer could not be read ({retry_after}). Answer with valid JSON only, "
                "at most 6 facts, the most important ones.\n\nJSON:",
            }
        request = ModelRequest(
            messages=messages,
            max_tokens=EXTRACT_MAX_TOKENS,
            temperature=0.0,
            purpose="extract",
            response_schema=REPLY_SCHEMA,
            stop_when=repeats_a_statement,
        )
        response = await self.provider.complete(request)
        model = response.model or getattr(self.provider, "model", None) or None
        return response.text, model, response.finish_reason == STOPPED_BY_CALLER

    def _facts(
        self,
        items: list[Any],
        lines: dict[int, Line],
        scope: str,
        batch_id: str,
        spans: list[dict[str, Any]],
        *,
        model: str | None = None,
    ) -> tuple[list[NewFact], Counter[str]]:
        by_span = {(s["run_id"], s["distillation_seq"]): s for s in spans}
        items, repeats = distinct(items)
        dropped: Counter[str] = Counter({"repeated": repeats} if repeats else {})
        out: list[NewFact] = []
        for item in items:
            fact, why = check_fact(item, lines)
            if fact is None:
                dropped[why] += 1
                continue
            sources = []
            for key in dict.fromkeys((line.run_id, line.distillation_seq) for line in fact.lines):
                span = by_span[key]
                sources.append(
                    {
                        "run_id": key[0],
                        "seqs": [ln.seq for ln in fact.lines if (ln.run_id, ln.distillation_seq) == key],
                        "distillation_seq": key[1],
                        "agent": span["agent"],
                        "def_hash": span["def_hash"],
                        "batch_id": batch_id,
                    }
                )
            out.append(
                NewFact(
                    statement=fact.statement,
                    cls=fact.cls,
                    subject=fact.subject,
                    scope=scope,
                    key=fact_key(batch_id, fact.statement),
                    observed_at=fact.observed_at,
                    sources=sources,
                    lines=[stored_line(line) for line in fact.lines],
                    model=model,
                )
            )
        return out, dropped


def passages_of(spans: Sequence[dict[str, Any]], scope: str, batch_id: str) -> list[NewFact]:
    """The passages of a batch's spans: each user input and assistant reply, verbatim."""
    out = []
    for span in spans:
        before = None  # the passage of the line said before (its id: the words stay in their own row)
        for turn in span["turns"]:
            text = str(turn.get("text") or "").strip()
            if turn.get("role") not in ("user", "assistant") or len(text) < MIN_CHARS:
                continue  # (an "I see." between a question and its answer carries no words: skipped)
            ts = turn.get("ts")
            line = {
                "run_id": span["run_id"],
                "seq": turn.get("seq"),
                "role": turn["role"],
                "speaker": turn.get("speaker"),
                "ts": ts,
                "text": text,
                **({"before": before} if before else {}),
            }
            before = passage_id(passage_key(scope, text))
            source = {
                "run_id": span["run_id"],
                "seqs": [turn.get("seq")],
                "distillation_seq": span["distillation_seq"],
                "agent": span["agent"],
                "def_hash": span["def_hash"],
                "batch_id": batch_id,
            }
            observed = None if ts is None else _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%Y-%m-%d")
            out.append(
                NewFact(
                    statement=text,
                    cls=PASSAGE,
                    subject=str(turn.get("speaker") or turn["role"]),
                    scope=scope,
                    key=passage_key(scope, text),
                    observed_at=observed,
                    sources=[source],
                    lines=[line],
                )
            )
    return out
