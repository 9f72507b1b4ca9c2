"""RunRecall: one run's recall index, its evicted-span callback, and its Recall tool.

Created by :func:`loomrt.toolset.resolve_toolset` when ``context.recall`` is true. It
lives with the run and is discarded with it; a resumed run (and the CLI) rebuilds it from
the record's distillation events with :meth:`RunRecall.rebuild`.

Optional parts never fail a run: an embedder that cannot load or raises turns recall
lexical-only (one ``notice`` event says so); any other indexing error is recorded as a
``callback_error`` event and the run goes on.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from loomrt.crashpoints import reached
from loomrt.driving import inline_wanted
from loomrt.events import Event, message_of
from loomrt.messages import SEARCH_TOOLS, EvictedSpan, Message
from loomrt.recall.embedders import EmbedderChoice, resolve_embedder
from loomrt.recall.index import CHUNK_OVERLAP, Entry, Fusion, RecallIndex, chunk_text
from loomrt.recall.memory import MemoryHit, MemorySource
from loomrt.recall.tool import OPERATOR, SOURCES, RecallHit, make_recall_tool
from loomrt.visibility import placeholder

__all__ = ["RunRecall", "SOURCES", "INLINE_MAX"]

_BEFORE_WORDS = 60
"""How much of the previous message an entry's window carries (words, from its end)."""

INLINE_MAX = 64
"""The largest backlog a per-call reader (recall injection) indexes before it searches."""

_SLICE = 32
"""Entries indexed at a time in the background, between other runs' work."""

_embedding: ThreadPoolExecutor | None = None
_embedding_lock = threading.Lock()


def _embedding_thread() -> ThreadPoolExecutor:
    """The one thread that embeds evicted entries for every run of the process (torch
    releases the GIL while it multiplies; one thread, because the model's tokenizer must
    not be called from two at once)."""
    global _embedding
    with _embedding_lock:
        if _embedding is None:
            _embedding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loomrt-recall-embedding")
        return _embedding


_MEMORY_READERS = 2
"""Durable-memory reads made off the event loop at once (:meth:`RunRecall.asearch`): fewer
than harvest's pool has connections (4), so a wait on the memory table never holds every
connection while a write that needs one (banking an evicted span) waits on the loop."""
_memory_reading: ThreadPoolExecutor | None = None


def _memory_readers() -> ThreadPoolExecutor:
    """The threads that read durable memory in a shared database for every run of the process."""
    global _memory_reading
    with _embedding_lock:
        if _memory_reading is None:
            _memory_reading = ThreadPoolExecutor(max_workers=_MEMORY_READERS, thread_name_prefix="loomrt-memory-read")
        return _memory_reading


def _said_before(history: Sequence[Event]) -> set[str]:
    """The recall notices a record already holds (each is said once per run)."""
    return {
        e.data["message"]
        for e in history
        if e.kind == "notice" and e.data.get("source") == "recall" and e.data.get("message")
    }


def _tail_words(text: str, n: int) -> str:
    words = text.split()
    return " ".join(words[-n:]) if len(words) > n else text


def _join_chunks(chunks: list[str], overlap: int = CHUNK_OVERLAP) -> str:
    """A message back, exactly, from its chunks: each one after the first begins with the
    last ``overlap`` words of the one before (:func:`~loomrt.recall.index.chunk_text`)."""
    text = chunks[0]
    for chunk in chunks[1:]:
        words = list(re.finditer(r"\S+", chunk))
        text += chunk[words[overlap - 1].end() :] if len(words) > overlap else ""
    return text


class RunRecall:
    """The recall index of run ``run_id``.

    ``context`` is the run's :class:`~loomrt.spec.ContextSpec` (``recall_max_entries``,
    ``recall_max_tokens``); ``emit(kind, data)`` records an event on the run; ``embedder``
    is ``None`` (the default MiniLM), ``False`` (lexical-only) or an
    :class:`~loomrt.recall.embedders.Embedder`; ``memory`` is an optional
    :class:`~loomrt.recall.memory.MemorySource` read with ``scopes``.
    """

    def __init__(
        self,
        *,
        run_id: str,
        context: Any = None,
        emit: Callable[[str, dict[str, Any]], Any] | None = None,
        embedder: EmbedderChoice = None,
        memory: MemorySource | None = None,
        scopes: Sequence[str] | None = None,
        fusion: Fusion | None = None,
        history: Sequence[Event] | None = None,
        shared_runs: Sequence[str] = (),
        family: Sequence[tuple[RunRecall, int]] = (),
    ):
        self.run_id = run_id
        self.shared_runs = {run_id, *shared_runs}
        """This run, and for a fork the runs whose history it shares (their evicted spans up
        to the fork point are in ``history``, or read from ``family``)."""
        self.family = list(family)
        """For a fork: other runs' recall whose index it reads instead of rebuilding its
        shared history, each up to a distillation seq (:mod:`loomrt.recall.shared`)."""
        self.last_distillation = 0
        """The seq of the newest distillation whose span this index holds (or queued)."""
        self.max_tokens = int(getattr(context, "recall_max_tokens", 1200))
        self.memory = memory
        self.scopes = scopes if scopes is not None else getattr(context, "memory_scopes", None)
        self._emit = emit
        self._said: set[str] = _said_before(history or ())
        self._before = ""
        self._backlog: list[Entry] = []
        """Entries evicted (or rebuilt from the record) and not yet indexed."""
        self._draining: asyncio.Task[None] | None = None
        self._embedding: tuple[list[Entry], Future[np.ndarray]] | None = None
        """The slice the background drain is embedding now, and its vectors to come: a query
        that arrives meanwhile waits for them instead of embedding the same entries again."""
        try:
            resolved = resolve_embedder(embedder)
        except TypeError as exc:
            resolved = None
            self._notice(f"recall is lexical-only: {exc}")
        else:
            if resolved is None:
                self._notice("recall is lexical-only (BM25): no embedder is configured")
        try:
            self._index = RecallIndex(
                resolved, max_entries=int(getattr(context, "recall_max_entries", 4096)), fusion=fusion
            )
        except ImportError as exc:
            self._notice(f"recall is lexical-only: faiss is not installed ({exc}); pip install 'loomrt[recall]'")
            self._index = RecallIndex(
                None, max_entries=int(getattr(context, "recall_max_entries", 4096)), fusion=fusion
            )
        self.visible: Callable[[RecallHit], bool] | None = None
        """Whether the run may see a hit (:func:`loomrt.visibility.visible_to`); set by the
        toolset. None: every hit."""
        self.tool = make_recall_tool(self)
        if history:
            self.rebuild(history)

    # ------------------------------------------------------------------ events

    def _notice(self, message: str) -> None:
        """Say ``message`` once per run, as a ``notice`` event."""
        if message in self._said:
            return
        self._said.add(message)
        self._record("notice", {"message": message, "source": "recall"})

    def _record(self, kind: str, data: dict[str, Any]) -> None:
        """Record an event on the run (the run queues it until it has started)."""
        if self._emit is None:
            return
        try:
            self._emit(kind, data)
        except Exception:  # noqa: BLE001 - recording a notice must not fail a run either
            pass

    # ------------------------------------------------------------------ indexing

    @property
    def index(self) -> RecallIndex:
        """The index, with everything evicted so far in it (indexing any backlog now)."""
        self._catch_up()
        return self._index

    def index_as_is(self) -> RecallIndex:
        """The index as a per-call reader wants it: a small backlog (a distillation's span,
        at most :data:`INLINE_MAX` entries) is indexed now, so what just left the working
        context can be found; a large one (a resumed run's whole history) is left to the
        background drain, started here if it is idle, and the search reads what is indexed."""
        if self._backlog:
            if len(self._backlog) <= INLINE_MAX:
                self._catch_up()
            else:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    self._catch_up()
                else:
                    if self._draining is None or self._draining.done():
                        self._draining = loop.create_task(self._drain(), name=f"recall-index-{self.run_id}")
        return self._index

    async def caught_up(self) -> None:
        """Wait until everything evicted so far is indexed: this run's and the shared indexes
        it reads. A small backlog is indexed now; a large one (a resumed run's rebuilt
        history) by the background drain, which embeds off the event loop where the embedder
        allows, so only this run waits. A per-call reader (recall injection) awaits this
        before it searches: the first call after a restart, or in a copy of a run, finds
        what was evicted before it (reading the index as it was, it found nothing)."""
        for holder in [self, *(h for h, _ in self.family)]:
            await holder._settle()

    async def _settle(self) -> None:
        if len(self._backlog) > INLINE_MAX:
            loop = asyncio.get_running_loop()
            if self._draining is None or self._draining.done() or self._draining.get_loop() is not loop:
                self._draining = loop.create_task(self._drain(), name=f"recall-index-{self.run_id}")
            await asyncio.shield(self._draining)
        self._catch_up()  # what is left, or arrived meanwhile

    @property
    def backlog(self) -> int:
        """Entries evicted and not indexed yet (the background drain, or the next query, indexes them)."""
        return len(self._backlog)

    def size(self) -> int:
        """Entries this run can search (after indexing any backlog): its own index's, and
        a fork's share of the indexes it reads (:attr:`family`)."""
        return sum(upto for _, index, upto in self._sources(catch_up=True))

    def _sources(self, *, catch_up: bool) -> list[tuple[RunRecall, RecallIndex, int]]:
        """Each index this run searches, its owner and how many of its oldest entries count:
        its own (all of them), then each shared one up to its distillation seq."""
        out: list[tuple[RunRecall, RecallIndex, int]] = []
        for holder, until in [(self, None), *self.family]:
            index = holder.index if catch_up else holder.index_as_is()
            out.append((holder, index, len(index) if until is None else index.count_until(until)))
        return out

    def rarest(self, text: str, n: int) -> list[str]:
        """The ``n`` tokens of ``text`` rarest in what this run can search (its own index,
        or, while that is empty, the first shared one): without indexing a large backlog."""
        for _, index, upto in self._sources(catch_up=False):
            if upto:
                return index.rarest(text, n)
        return []

    def _drafts(self, distillation_seq: int, messages: Sequence[Message], run_id: str | None = None) -> list[Entry]:
        drafts: list[Entry] = []
        for m in messages:
            if m.synthetic is not None or m.role == "system":
                continue
            text = m.searched_text()  # a search's query and its result are not indexed (SEARCH_TOOLS)
            if not text.strip():
                continue
            tools = (
                (m.name,)
                if m.role == "tool" and m.name
                else tuple(tc.name for tc in m.tool_calls if tc.name not in SEARCH_TOOLS)
            )
            speaker = m.name if m.role != "tool" else None
            pieces = chunk_text(text)
            for i, piece in enumerate(pieces):
                drafts.append(
                    Entry(
                        id=-1,
                        run_id=run_id or self.run_id,
                        seq=m.seq,
                        distillation_seq=distillation_seq,
                        role=m.role,
                        text=piece,
                        speaker=speaker,
                        ts=m.ts,
                        tools=tools,
                        chunk=i,
                        chunks=len(pieces),
                        before=self._before if i == 0 else "",
                    )
                )
            self._before = _tail_words(drafts[-1].label, _BEFORE_WORDS)
        return drafts

    def _add(self, drafts: list[Entry], vectors: np.ndarray | BaseException | None = None) -> None:
        """Index ``drafts`` (with their ``vectors``, when they were embedded already, or the
        error embedding them raised)."""
        try:
            if isinstance(vectors, BaseException):
                raise vectors
            self._index.add(drafts, vectors=vectors)
        except Exception as exc:  # noqa: BLE001 - the embedder failed: go on lexical-only
            if not self._index.dense:
                raise
            name = getattr(self._index.embedder, "name", type(self._index.embedder).__name__)
            self._index.disable_dense()
            self._notice(f"recall degraded to lexical-only: the embedder {name} failed ({type(exc).__name__}: {exc})")
            self._index.add(drafts)

    def on_evicted(self, span: EvictedSpan) -> None:
        """The evicted-span callback: queue each message of ``span`` for indexing. Never raises.

        Inside a running event loop the entries are indexed in the background, in slices
        (the embedding on a worker thread when the embedder ``releases_gil``: a pure-Python
        one would hold the GIL against the loop), so the turn that evicted them, and every other
        run's turn, does not wait for it; a query indexes whatever is still queued first.
        Outside one they are indexed here."""
        try:
            if span.run_id != self.run_id:
                return  # another run's span: never indexed here
            drafts = self._drafts(span.distillation_seq, span.messages)
            self.last_distillation = max(self.last_distillation, span.distillation_seq)
            reached("in_recall_index")
            self._backlog.extend(drafts)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._catch_up()
                return
            if self._draining is None or self._draining.done():
                self._draining = loop.create_task(self._drain(), name=f"recall-index-{self.run_id}")
        except Exception as exc:  # noqa: BLE001 - indexing never fails a run
            self._record(
                "callback_error",
                {
                    "callback": "recall.on_evicted",
                    "error": f"{type(exc).__name__}: {exc}",
                    "distillation_seq": span.distillation_seq,
                },
            )

    async def _drain(self) -> None:
        """Index the backlog a slice at a time, oldest first."""
        while self._backlog:
            batch = self._backlog[:_SLICE]
            vectors: np.ndarray | BaseException | None = None
            if self._index.dense and getattr(self._index.embedder, "releases_gil", False):
                future = _embedding_thread().submit(self._index.embed, batch)
                self._embedding = (batch, future)
                try:
                    vectors = await asyncio.wrap_future(future)
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if not future.cancelled() or (task is not None and task.cancelling()):
                        raise  # the drain itself was cancelled (a loop closing), not the slice
                    continue  # a query took the slice over before the thread reached it
                except Exception as exc:  # noqa: BLE001 - handled where the entries are added
                    vectors = exc
                finally:
                    if self._embedding is not None and self._embedding[1] is future:
                        self._embedding = None
            else:
                await asyncio.sleep(0)  # the turn that evicted them goes on first
            if not self._backlog or self._backlog[0] is not batch[0]:
                continue  # a query indexed them meanwhile
            del self._backlog[: len(batch)]
            self._index_now(batch, vectors)

    def rebuild(self, history: Sequence[Event]) -> int:
        """Queue every span the record's distillation events evicted, in order, for indexing
        (a resumed run recalls what it evicted before the restart). They are indexed before
        the next span or query. Returns the number of entries queued."""
        messages = {e.seq: m for e in history if (m := message_of(e)) is not None and m.role != "system"}
        self._said |= _said_before(history)
        drafts: list[Entry] = []
        for e in history:
            if e.kind != "distillation" or e.run_id not in self.shared_runs:
                continue
            span = [messages[s] for s in e.data.get("span_seqs") or [] if s in messages]
            drafts.extend(self._drafts(e.seq, span, e.run_id))
            self.last_distillation = max(self.last_distillation, e.seq)
        self._backlog.extend(drafts)
        return len(self._backlog)

    def _catch_up(self) -> None:
        """Index what is queued: spans still being indexed in the background, and what
        :meth:`rebuild` queued (embedding waits until recall is first needed, so opening a
        run to inspect it costs nothing)."""
        if not self._backlog:
            return
        embedding, self._embedding = self._embedding, None
        if embedding is not None and embedding[0][0] is self._backlog[0] and not embedding[1].cancel():
            # the background thread is embedding the oldest slice now: take its vectors when
            # they come rather than embed the same entries a second time beside it
            batch, future = embedding
            vectors: np.ndarray | BaseException
            try:
                vectors = future.result()
            except Exception as exc:  # noqa: BLE001 - handled where the entries are added
                vectors = exc
            del self._backlog[: len(batch)]
            self._index_now(batch, vectors)
        drafts, self._backlog = self._backlog, []
        if drafts:
            self._index_now(drafts)

    def _index_now(self, drafts: list[Entry], vectors: np.ndarray | BaseException | None = None) -> None:
        """:meth:`_add`, its failure an event (indexing never fails a run)."""
        try:
            self._add(drafts, vectors)
        except Exception as exc:  # noqa: BLE001 - indexing never fails a run
            self._record("callback_error", {"callback": "recall.index", "error": f"{type(exc).__name__}: {exc}"})

    # ------------------------------------------------------------------ searching

    def memory_waits(self) -> bool:
        """Whether durable memory is read on a worker thread: it lives in a shared database
        (PostgreSQL: a round trip, and a wait on its locks) and the caller is on a running
        event loop, whose other runs must not wait for it (a sync reader, or ``drive()``,
        reads it inline)."""
        return self.memory is not None and bool(getattr(self.memory, "shared", False)) and not inline_wanted()

    async def asearch(
        self, query: str, top_k: int = 5, source: str = "all", *, catch_up: bool = True
    ) -> list[RecallHit]:
        """:meth:`search` from async code: durable memory on a shared database is read on a
        worker thread (:meth:`memory_waits`) while the loop plays on; the run's own index,
        in memory, is searched on the loop."""
        if source in ("all", "memory", "operator") and self.memory_waits():
            author = OPERATOR if source == "operator" else None
            loop = asyncio.get_running_loop()
            read = await loop.run_in_executor(_memory_readers(), self._memory_read, query, top_k, author)
            return self.search(query, top_k, source, catch_up=catch_up, memory_read=read)
        return self.search(query, top_k, source, catch_up=catch_up)

    def search(
        self,
        query: str,
        top_k: int = 5,
        source: str = "all",
        *,
        catch_up: bool = True,
        memory_read: Sequence[Any] | BaseException | None = None,
    ) -> list[RecallHit]:
        """The best ``top_k`` hits for ``query`` from this run's evicted spans, a fork's
        shared history and durable memory (``source``: run, family, memory, operator: the
        durable memory an operator wrote by hand, or all), merged by score, best first (no token cap: the tool applies it). A hit the run may not see
        (:attr:`visible`) comes back as its placeholder. Without ``catch_up`` a large backlog
        is not indexed first (:meth:`index_as_is`). ``memory_read``: what durable memory
        already answered (:meth:`asearch` reads it off the loop), else it is read here."""
        if source not in SOURCES:
            raise ValueError(f"unknown recall source {source!r}: expected one of {', '.join(SOURCES)}")
        hits: list[RecallHit] = []
        wanted = 0 if source in ("memory", "operator") else top_k if source == "all" else top_k * 4
        found: list[Any] = []
        for _, index, upto in self._sources(catch_up=catch_up) if wanted else ():
            try:
                found += index.search(query, wanted, upto=upto)
            except Exception as exc:  # noqa: BLE001 - the query embedding failed: lexical-only
                if not index.dense:
                    raise
                index.disable_dense()
                self._notice(
                    f"recall degraded to lexical-only: the embedder failed on a query ({type(exc).__name__}: {exc})"
                )
                found += index.search(query, wanted, upto=upto)
        for h in found:
            e = h.entry
            kind = "run" if e.run_id == self.run_id else "family"
            if source not in ("all", kind):
                continue
            hits.append(
                RecallHit(
                    text=e.text,
                    score=h.score,
                    source=kind,
                    run_id=e.run_id,
                    cosine=h.cosine,
                    bm25=h.bm25,
                    before=e.before,
                    seq=e.seq,
                    seqs=tuple(e.seqs),
                    ts=e.ts,
                    role=e.role,
                    speaker=e.speaker,
                    tools=e.tools,
                    distillation_seq=e.distillation_seq,
                    chunk=(e.chunk + 1, e.chunks) if e.chunks > 1 else None,
                )
            )
        if source in ("all", "memory", "operator"):
            author = OPERATOR if source == "operator" else None
            read = self._memory_read(query, top_k, author) if memory_read is None else memory_read
            hits.extend(self._memory_hits(read, top_k, author=author))
        hits.sort(key=lambda h: -h.score)
        return [self._seen(h) for h in hits[:top_k]]

    def _seen(self, hit: RecallHit) -> RecallHit:
        """``hit`` as this run may see it: itself, or its placeholder (a fork's parent's private message)."""
        if self.visible is None or self.visible(hit):
            return hit
        return replace(
            hit, text=placeholder(hit.seq, hit.role or "tool"), before="", extra={**hit.extra, "private": True}
        )

    def at_seq(self, seq: int) -> list[RecallHit]:
        """The evicted message at record seq ``seq``, whole (its chunks joined), or nothing."""
        pieces = [
            e
            for _, index, upto in self._sources(catch_up=True)
            for e in list(index.entries.values())[:upto]
            if e.seq == seq
        ]
        if not pieces:
            return []
        first = min(pieces, key=lambda e: e.chunk)
        text = (
            first.text if first.chunks == 1 else _join_chunks([e.text for e in sorted(pieces, key=lambda e: e.chunk)])
        )
        hit = RecallHit(
            text=text,
            score=1.0,
            source="run" if first.run_id == self.run_id else "family",
            seq=seq,
            seqs=(seq,),
            ts=first.ts,
            role=first.role,
            speaker=first.speaker,
            tools=first.tools,
            distillation_seq=first.distillation_seq,
            run_id=first.run_id,
        )
        return [self._seen(hit)]

    def _memory_read(self, query: str, top_k: int, author: str | None) -> Sequence[Any] | BaseException:
        """Durable memory's answer for ``query`` (a wider pool when only ``author``'s is
        wanted), or the error it raised: safe on any thread (nothing is recorded here)."""
        if self.memory is None:
            return []
        try:
            return self.memory.search(query, top_k if author is None else max(8 * top_k, 40), self.scopes)
        except Exception as exc:  # noqa: BLE001 - durable memory is optional
            return exc

    def _memory_hits(
        self, raw: Sequence[Any] | BaseException, top_k: int, *, author: str | None = None
    ) -> list[RecallHit]:
        """Durable memory's best ``top_k`` of what it answered (``raw``; only ``author``'s
        when given), each tagged with its scope, id, author and provenance."""
        if isinstance(raw, BaseException):
            self._notice(f"recall could not read durable memory ({type(raw).__name__}: {raw})")
            return []
        out = []
        for item in raw:
            h = (
                item
                if isinstance(item, MemoryHit)
                else MemoryHit(**{k: v for k, v in dict(item).items() if k in MemoryHit.__dataclass_fields__})
            )
            written_by = h.provenance.get("author") or "run"  # operator: written by hand, not said in a run
            if author is not None and written_by != author:
                continue
            extra: dict[str, Any] = {k: v for k, v in (("scope", h.scope), ("id", h.id)) if v is not None}
            extra["author"] = written_by
            if h.provenance:  # where the fact came from: the runs and record seqs of its original words
                extra["provenance"] = h.provenance
            said = h.provenance.get("said")
            speaker = said.get("speaker") if isinstance(said, dict) else None  # who said its words (injection shows it)
            out.append(
                RecallHit(
                    text=h.text,
                    score=float(h.score),
                    source="memory",
                    ts=h.ts,
                    speaker=speaker if isinstance(speaker, str) else None,
                    extra=extra,
                    cosine=h.cosine,
                    bm25=h.bm25 or 0.0,
                )
            )
        return out[:top_k]
