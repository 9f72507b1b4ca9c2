"""What the web pages read: the runs list, a run's header and timeline pages, a model call's
prompt, the tokens chart, the audit. The same read model as the CLI and MCP: rows through
:func:`loomrt.glance.glances`, events through :func:`loomrt.visibility.redact_events` (the one
redaction every reader goes through, judged on the whole record) unless the server was
started with ``--include-private``, prompts through :func:`loomrt.audit.prompt_of` (as
``runs show --prompt``, from checkpoints of the run's view: :mod:`loomrt.ui.views`), the audit through :func:`loomrt.integrity.verify_run` (as ``runs verify``).
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from loomrt.audit import prompt_of, turn_call
from loomrt.errors import NotFoundError
from loomrt.events import Event, RunInfo
from loomrt.glance import Glance, glances
from loomrt.injection import INJECTED
from loomrt.integrity import Verdict, verify_run
from loomrt.messages import Message
from loomrt.record.store import Store
from loomrt.run.family import Family
from loomrt.tokens import count_messages
from loomrt.ui.cards import CardNode, card_tree
from loomrt.ui.timeline import TIMELINE_PAGE, Item, timeline, tokens_series
from loomrt.ui.views import Views
from loomrt.visibility import PrivateRecord, private_record, redact_events

if TYPE_CHECKING:
    from loomrt.run.projection import RunView
    from loomrt.search_evicted import RecallAnswer

__all__ = [
    "Reader",
    "RunsFilter",
    "Row",
    "RunHeader",
    "Part",
    "RecordCache",
    "PAGE_ROWS",
    "SCAN_RUNS",
    "TIMELINE_PAGE",
]

PAGE_ROWS = 50
"""The runs a runs page lists (the newest that pass its filters)."""
SCAN_RUNS = 5_000
"""The newest runs the runs page filters (one query): older ones are past what a page lists."""


@dataclass(frozen=True)
class RunsFilter:
    agent: str | None = None
    status: str | None = None
    mode: str | None = None
    q: str | None = None
    """A part of the run id."""
    since: float | None = None
    """Only runs created at or after this Unix time."""
    until: float | None = None
    """Only runs created before this Unix time."""
    limit: int | None = None
    """How many rows (None: :data:`PAGE_ROWS`)."""


@dataclass(frozen=True)
class Row:
    info: RunInfo
    glance: Glance


@dataclass(frozen=True)
class RunsPage:
    rows: list[Row]
    matched: int
    agents: list[str]
    statuses: list[str]
    modes: list[str]


@dataclass(frozen=True)
class RunHeader:
    """A run page's top: the run's row, its sums, Σ now, its children, its budget."""

    info: RunInfo
    glance: Glance
    budget: int | None
    state: dict[str, Any] | None
    children: list[RunInfo]
    private_seqs: list[int]
    child_rows: dict[str, Any] = field(default_factory=dict)
    """Each child's Σ row (or answer) as it was handed up, by run id."""
    lineage: list[tuple[str, int]] = field(default_factory=list)
    """A fork's ancestors, nearest first: (run id, the seq it was forked at)."""


@dataclass(frozen=True)
class Part:
    """One message of a prompt, as "what the model saw" shows it."""

    seq: int | None
    role: str
    kind: str
    """head (system), pin, distilled (recap, summary, card, Σ, observation), recalled, raw."""
    label: str
    tokens: int
    html: str
    """The text, escaped, with each ``[#seq]`` pointer a link to that event."""
    href: str | None = None
    """Where its event is shown (a fork's shared history: on the ancestor's page)."""


_POINTER = re.compile(r"\[#(\d+)\]")
_DISTILLED = {"recap", "summary", "card", "state", "observation", "feedback", "external"}


def _kind(m: Message) -> str:
    if m.synthetic == INJECTED:
        return "recalled"
    if m.pinned or m.synthetic == "pin":
        return "pin"
    if m.synthetic in _DISTILLED:
        return "distilled"
    if m.role == "system":
        return "head"
    return "raw"


def _linked(text: str, at: Callable[[int], str]) -> str:
    escaped = html.escape(text)
    return _POINTER.sub(lambda m: f'<a href="{at(int(m[1]))}">[#{m[1]}]</a>', escaped)


def _part(m: Message, at: Callable[[int], str]) -> Part:
    """Message ``m`` as "what the model saw" shows it (``at``: where a seq of the run is shown)."""
    where = f"#{m.seq}" if m.seq is not None and m.synthetic is None else (m.synthetic or "synthetic")
    label = f"{where} {m.role}" + (f" · {m.name}" if m.name else "")
    if m.tool_calls:
        label += " → " + ", ".join(c.name for c in m.tool_calls)
    link = at(m.seq) if m.seq is not None else None
    return Part(m.seq, m.role, _kind(m), label, count_messages([m]), _linked(m.content, at), link)


CACHE_SIZE = 1_024
"""Values the server keeps between requests (two a run shown: its row and its private material)."""

PARTS_KEPT = 100_000
"""Prompt parts the server keeps (:meth:`RecordCache.part`): all are dropped when full."""

T = TypeVar("T")


class RecordCache:
    """What is read from a run's record, kept per state of that record: its private material
    (:func:`private_record`) and its row (:func:`glances`). Exact, not a guess: a record only
    grows, and both are functions of the run's own events and of its family's up to the fork
    points (which never change), so the run's last seq names them. A timeline page of a long
    run then reads its page, not the whole record, and the runs page polled again reads the
    runs, and only the rows of those that moved."""

    def __init__(self, size: int = CACHE_SIZE):
        self.size = size
        self.kept: dict[tuple[str, str, int], Any] = {}
        self.lock = threading.Lock()  # the pages run in Starlette's thread pool
        self.views = Views()
        """Each run's view checkpoints, for "what the model saw" (:mod:`loomrt.ui.views`)."""
        self.parts: dict[tuple[str, int], tuple[Message, Part]] = {}

    def part(self, run_id: str, m: Message, make: Callable[[Message], Part]) -> Part:
        """Message ``m`` of run ``run_id``'s views as a prompt's part (its tokens counted, its text
        escaped and linked), once per message: a view and its checkpoints share their messages
        (frozen values), so the same object is the same part. Kept by identity, with the message
        itself, so an id is never taken for another message's."""
        key = (run_id, id(m))
        with self.lock:
            found = self.parts.get(key)
        if found is not None and found[0] is m:
            return found[1]
        made = make(m)
        with self.lock:
            if len(self.parts) >= PARTS_KEPT:
                self.parts.clear()
            self.parts[key] = (m, made)
        return made

    def get(self, what: str, info: RunInfo, read: Callable[[], T]) -> T:
        """``what`` of run ``info``, read once per state of its record."""
        return self.get_many(what, [info], lambda missing: {info.run_id: read()})[info.run_id]

    def get_many(self, what: str, infos: list[RunInfo], read: Callable[[list[RunInfo]], dict[str, T]]) -> dict[str, T]:
        """``what`` of each of ``infos`` by run id: those kept, and the others read together
        (``read`` of the runs missing, by run id)."""
        found: dict[str, T] = {}
        with self.lock:
            for info in infos:
                key = (what, info.run_id, info.last_seq)
                if key in self.kept:
                    found[info.run_id] = cast(T, self.kept[key])
        missing = [info for info in infos if info.run_id not in found]
        if missing:
            fresh = read(missing)
            with self.lock:
                for info in missing:
                    if len(self.kept) >= self.size:
                        self.kept.pop(next(iter(self.kept)))
                    self.kept[(what, info.run_id, info.last_seq)] = found[info.run_id] = fresh[info.run_id]
        return found


@dataclass
class Reader:
    """The pages' reads over ``store``; private material as placeholders unless ``include_private``."""

    store: Store
    include_private: bool = False
    cache: RecordCache = field(default_factory=RecordCache)

    def info(self, run_id: str) -> RunInfo:
        """The run's row; :class:`NotFoundError` naming the id for an unknown one."""
        try:
            return self.store.get_run(run_id)
        except NotFoundError:
            raise NotFoundError(f"no run {run_id!r} in this record") from None

    def runs(self, f: RunsFilter) -> RunsPage:
        """The newest runs that pass ``f`` (one query for the runs, one for the sums of the rows shown
        that moved since they were last read: :func:`glances`)."""
        runs = self.store.list_runs(limit=SCAN_RUNS, agent=f.agent or None)
        matched = [
            r
            for r in runs
            if (not f.status or r.status == f.status)
            and (not f.mode or r.mode == f.mode)
            and (not f.q or f.q.strip().lower() in r.run_id.lower())
            and (f.since is None or r.created_at >= f.since)
            and (f.until is None or r.created_at < f.until)
        ]
        shown = matched[: f.limit or PAGE_ROWS]
        sums = self.cache.get_many("glance", shown, lambda missing: glances(self.store, missing))
        rows = [Row(r, sums[r.run_id]) for r in shown]
        return RunsPage(
            rows,
            len(matched),
            sorted({r.agent for r in runs} | ({f.agent} if f.agent else set())),
            sorted({r.status for r in runs}),
            sorted({r.mode for r in runs}),
        )

    def _glance(self, info: RunInfo) -> Glance:
        return self.cache.get_many("glance", [info], lambda missing: glances(self.store, missing))[info.run_id]

    def private(self, run_id: str) -> PrivateRecord:
        """The run's private material, judged on its whole record (once per state of it: :class:`RecordCache`)."""
        return self.cache.get("private", self.info(run_id), lambda: private_record(self.store, run_id))

    def _redacted(self, run_id: str, events: list[Event]) -> list[Event]:
        return events if self.include_private else redact_events(events, self.private(run_id))

    def _started(self, info: RunInfo) -> dict[str, Any]:
        """The run's ``run_started`` (a fork's own follows its fork seq)."""
        started = self.store.events(info.run_id, until=(info.fork_seq or 0) + 1, kinds=["run_started"])
        return started[-1].data if started else {}

    def budget(self, info: RunInfo) -> int | None:
        """The run's token budget, as its ``run_started`` recorded it."""
        budget = self._started(info).get("budget")
        return int(budget) if budget else None

    def tools(self, run_id: str) -> list[str]:
        """The tools the run offers with each call, by name (the record does not keep their schemas)."""
        return [str(t) for t in self._started(self.info(run_id)).get("tools") or ()]

    def header(self, run_id: str) -> RunHeader:
        info = self.info(run_id)
        last_state = self.store.latest(run_id, "state_update")
        state = None
        if last_state is not None:
            state = self._redacted(run_id, [last_state])[0].data.get("state")
        handed = self._redacted(run_id, self.store.events(run_id, kinds=["spawn_child_result"]))
        rows = {str(e.data.get("run_id")): e.data.get("state") or e.data.get("output") for e in handed}
        return RunHeader(
            info,
            self._glance(info),
            self.budget(info),
            state,
            self.store.children(run_id),
            [] if self.include_private else sorted(self.private(run_id).seqs),
            rows,
            self.lineage(info),
        )

    def lineage(self, info: RunInfo) -> list[tuple[str, int]]:
        """A fork's ancestors, nearest first: (run id, the seq it was forked at); empty for a run that is no fork."""
        if not info.forked_from:
            return []
        family = Family.of(self.store, {"run_id": info.forked_from, "seq": info.fork_seq})
        return list(family.links) if family is not None else []

    def where(self, run_id: str) -> Callable[[int], str]:
        """Where seq ``s`` of the run's view is shown: its own page, or, for a fork's shared
        history, the page of the ancestor whose record holds it."""
        info = self.info(run_id)
        links = self.lineage(info)
        ranges = [(rid, links[i + 1][1] if i + 1 < len(links) else 0, at) for i, (rid, at) in enumerate(links)]

        def at(seq: int) -> str:
            owner = next((rid for rid, lo, hi in ranges if lo < seq <= hi), run_id)
            return f"/runs/{html.escape(owner)}#e{seq}"

        return at

    def timeline(self, run_id: str, after: int = 0, kinds: list[str] | None = None) -> tuple[list[Item], int | None]:
        """One page of the timeline after seq ``after``: its items, and where the next page starts (None: the end)."""
        info = self.info(run_id)
        until = after + TIMELINE_PAGE
        page = self.store.events(run_id, after=after, until=until, kinds=kinds or None)
        items = timeline(self._redacted(run_id, page))
        return items, until if until < info.last_seq else None

    def distillations(self, run_id: str) -> list[Item]:
        """Every distillation and declined one (the timeline's markers, for the page's index)."""
        found = self.store.events(run_id, kinds=["distillation", "distillation_declined"])
        return timeline(self._redacted(run_id, found))

    def cards(self, run_id: str) -> list[CardNode]:
        """A fold run's card tree now (empty for a run that wrote no card)."""
        found = self.store.events(run_id, kinds=["run_started", "distillation"])
        return card_tree(self.store, self._redacted(run_id, found))

    def state_at(self, run_id: str, seq: int) -> Event | None:
        """The Σ update in force after ``seq`` (its ``state`` then, its ``patch``), or None before the first."""
        self.info(run_id)
        found = self.store.latest(run_id, "state_update", until=seq)
        return None if found is None else self._redacted(run_id, [found])[0]

    def tokens(self, run_id: str) -> dict[str, Any]:
        """The chart's series: every model call's input tokens, and the budget line."""
        budget = self.budget(self.info(run_id))
        return tokens_series(self.store.events(run_id, kinds=["model_call"]), budget)

    def prompt(self, run_id: str, seq: int) -> list[Part]:
        """What the model call at ``seq`` was sent, as ``runs show --prompt SEQ`` derives it (from
        the nearest checkpoint of the run's view before it: :class:`~loomrt.ui.views.Views`)."""
        self.info(run_id)
        call = self._redacted(run_id, self.store.events(run_id, after=seq - 1, until=seq))
        try:
            found = turn_call(call[0] if call else None, seq)  # before any replay
            messages = prompt_of(self._view_before(run_id, seq), found, seq)
        except ValueError as exc:
            raise NotFoundError(f"run {run_id}: {exc}") from None
        at = self.where(run_id)
        return [self.cache.part(run_id, m, lambda m: _part(m, at)) for m in messages]

    def _view_before(self, run_id: str, seq: int) -> RunView:
        """The run's view after its events before ``seq``, as this reader reads them (redacted,
        judged on the whole record, unless ``include_private``)."""
        info = self.info(run_id)
        private = None if self.include_private else self.private(run_id)

        def read(after: int, until: int) -> list[Event]:
            return self._redacted(run_id, self.store.events(run_id, after=after, until=until))

        return self.cache.views.before(self.store, info, seq, private, read)

    def warm(self, run_id: str) -> int:
        """Replay the run's record to its end, checkpointing its view, and make the parts of its
        working context now (what the run page asks for once it is shown, so that "what the model
        saw" at any call replays a few events and renders parts already made); the events it holds."""
        last = self.info(run_id).last_seq
        at = self.where(run_id)
        for m in self._view_before(run_id, last + 1).context:
            self.cache.part(run_id, m, lambda m: _part(m, at))
        return last

    def event(self, run_id: str, seq: int) -> Event:
        self.info(run_id)
        found = self.store.events(run_id, after=seq - 1, until=seq)
        if not found:
            raise NotFoundError(f"run {run_id} has no event #{seq}")
        return self._redacted(run_id, found)[0]

    def recall(self, run_id: str, query: str, k: int = 5, source: str | None = None) -> RecallAnswer:
        """What Recall returns for ``query`` over the run's evicted history (as ``loomrt recall``);
        ``source``: only the run's own hits (``run``) or its family's (``family``, a fork's shared history)."""
        from loomrt.search_evicted import recall_in_record

        self.info(run_id)
        return recall_in_record(self.store, run_id, query, k=k, include_private=self.include_private, source=source)

    def verify(self, run_id: str) -> Verdict:
        """``runs verify``'s every check (the prompts re-derived too)."""
        self.info(run_id)
        return verify_run(self.store, run_id)
