"""The state of one run while it is in memory: its wiring, and its view of the record.

The record and the working context meet in one place, :meth:`RunState.add`: it appends an
event to the record (awaiting the store) and applies it to the run's
:class:`~loomrt.run.projection.RunView`.
Everything the view holds can be rebuilt from the record (:func:`loomrt.run.projection.project`);
the record is the truth, the view a cache of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrt.activity import Activity, AnswerText, Watcher
from loomrt.crashpoints import reached
from loomrt.errors import MovedOnError
from loomrt.events import Event
from loomrt.messages import EvictedSpanCallback, Message
from loomrt.payloads import check_payload
from loomrt.providers.base import ModelProvider, Usage
from loomrt.record.store import Store
from loomrt.run.projection import MAX_TOKENIZER_SCALE, RunView
from loomrt.spec import AgentSpec
from loomrt.tokens import count_messages, count_tools
from loomrt.tools import Toolset

if TYPE_CHECKING:
    from loomrt.run.reducers.base import RetentionMode

__all__ = ["RunState", "RunResult", "MAX_TOKENIZER_SCALE", "CancelledElsewhere"]


_CHECKED_TRIES = 3
"""A step's checked first write is tried this many times while others keep writing the run."""


class CancelledElsewhere(Exception):
    """A step's first write found the run cancelled by another process (:meth:`RunState.atomic`
    with ``step``): nothing of the step was written, and the loop stops the run."""


@dataclass
class RunState:
    """One run in memory."""

    run_id: str
    agent: str
    spec: AgentSpec
    """The run's own deep clone of the agent definition."""
    mode: RetentionMode
    interactive: bool
    store: Store
    provider: ModelProvider
    summarizer: ModelProvider
    toolset: Toolset = field(default_factory=Toolset)
    callbacks: list[EvictedSpanCallback] = field(default_factory=list)
    listeners: list[Callable[[Event], None]] = field(default_factory=list)
    watchers: list[Watcher] = field(default_factory=list)
    """Told what the run does now (:mod:`loomrt.activity`): never recorded."""
    parent_run_id: str | None = None
    """The run that spawned this one (a sub-agent), if any."""
    root_run_id: str | None = None
    """The run at the top of the spawn tree (None for a top-level run)."""
    depth: int = 0
    """How many spawns deep: a top-level run is 0."""
    view: RunView = None  # type: ignore[assignment]
    """The record so far, applied: working context, the mode's slot, totals."""
    _queue: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Events queued by :meth:`emit`, recorded with the next :meth:`add` (or by :meth:`flush`)."""
    _atomic: int = 0
    _pressure_estimate: tuple[str, int, int] = ("", -1, 0)
    """(the record's last seq, the context's length, the estimate) at the last :meth:`pressure`."""
    _unheard: list[Event] = field(default_factory=list)
    """Events of the open :meth:`atomic` block, told to the listeners once it commits."""
    epoch: int | None = None
    """This worker's claim on the run (:mod:`loomrt.record.owners`), carried by every append
    as a fencing token; None when the runtime claims nothing (a single machine's default)."""
    guarded: bool = False
    """Appends only if the record is as this process last read it (a ``loomrt worker`` folding
    a run whose own process may start a turn meanwhile): else MovedOnError, nothing written."""
    _first_checks: bool = False
    """The next write checks that nobody else wrote since the view's last event (:meth:`atomic`)."""

    def __post_init__(self) -> None:
        if self.view is None:
            self.view = RunView(mode=self.mode)

    async def add(self, kind: str, data: dict[str, Any]) -> Event:
        """Append an event to the record, apply it to the view, and tell the listeners.

        Events queued with :meth:`emit` are written first, in the same transaction: a
        ``model_call`` and what the loop made of its answer are recorded together or not at
        all, so a crash between them cannot keep the cost of a reply and lose the reply."""
        check_payload(kind, data)  # a payload that drifts from its documented shape is a bug, caught here
        if kind == "run_started":
            (event,) = await self._write([(kind, data)])
            await self.flush()
            return event
        if self.view.last_seq == 0:  # nothing may precede run_started: the queue waits for it
            (event,) = await self._write([(kind, data)])
            return event
        if kind == "assistant_message" and self.view.taint.sources:  # the derived-private rule (loomrt.visibility)
            source = self.view.taint.derived_from(Message.from_dict(data["message"]))
            if source is not None:
                async with self.atomic():  # the mark goes in the message's own transaction
                    event = await self._add(kind, data)
                    mark = {"seq": event.seq, "by": "runtime", "derived_from": source}
                    await self._write([("mark_private", mark)])
                    return event
        return await self._add(kind, data)

    async def _add(self, kind: str, data: dict[str, Any]) -> Event:
        batch, self._queue = [*self._queue, (kind, data)], []
        try:
            return (await self._write(batch))[-1]
        except CancelledElsewhere:
            self._queue = [*batch[:-1], *self._queue]  # the call's cost is still to be recorded
            raise

    async def _write(self, items: list[tuple[str, dict[str, Any]]]) -> list[Event]:
        reached("before_append")
        fence = {"epoch": self.epoch} if self.epoch is not None else {}
        if self.guarded:
            events = await self.store.write_many(self.run_id, items, after=self.view.last_seq, **fence)
        elif self._first_checks:
            self._first_checks = False
            events = await self._write_unless_cancelled(items, fence)
        else:
            events = await self.store.write_many(self.run_id, items, **fence)
        reached("after_append")
        applied = events
        if events and events[0].seq > self.view.last_seq + 1:  # someone else wrote meanwhile (an operator's pin)
            applied = (await self.store.read(self.run_id, after=self.view.last_seq))[
                : events[-1].seq - self.view.last_seq
            ]
        for event in applied:
            self.view.apply(event)
        if self._atomic:  # a listener hears of committed events only, with the view as a reader would rebuild it
            self._unheard.extend(applied)
        else:
            self._tell(applied)
        return events

    async def _write_unless_cancelled(
        self, items: list[tuple[str, dict[str, Any]]], fence: dict[str, Any]
    ) -> list[Event]:
        """A step's first write, refused if others wrote since the view's last event: then
        their events are taken in, and a cancel among them stops the step (:meth:`atomic`)."""
        for _ in range(_CHECKED_TRIES):
            try:
                return await self.store.write_many(self.run_id, items, after=self.view.last_seq, **fence)
            except MovedOnError:
                later = await self.store.read(self.run_id, after=self.view.last_seq)
                for event in later:
                    self.view.apply(event)
                self._tell(later)  # committed by others: heard at once
                if self.view.status == "cancelled":
                    raise CancelledElsewhere(self.run_id) from None
        return await self.store.write_many(self.run_id, items, **fence)  # others keep writing: write after them

    @contextlib.asynccontextmanager
    async def atomic(self, *, step: bool = False) -> AsyncIterator[None]:
        """``async with run.atomic():`` the events added inside are committed together (a
        process killed inside records none of them). The loop wraps each step in one: the
        model's answer, what the mode made of it, and the turn's end when it is the last.
        The view applies each event at once; listeners hear of them once they are committed.

        ``step``: the block follows a model call, and on a record others may write (a shared
        store, a claimed run) its first write is refused if anything was written since the
        view's last event; what was is then taken in, and a cancel among it
        (``cancel_run``, ``loomrt runs cancel`` from another process) raises
        :class:`CancelledElsewhere` with nothing of the step written: the model's late answer
        is not played. (The check rides on that write: no query of its own.)"""
        self._atomic += 1
        if step:
            self._first_checks = getattr(self.store, "shared", False) or self.epoch is not None
        raised: BaseException | None = None  # by the block itself (its writes are still committed)
        committed = False
        try:
            async with self.store.transaction():
                try:
                    yield
                except BaseException as exc:
                    raised = exc
                    raise
            committed = True
        except BaseException as exc:
            committed = exc is raised  # else the commit itself failed: nothing of the block is recorded
            raise
        finally:
            if step:
                self._first_checks = False
            self._atomic -= 1
            if not self._atomic:
                pending, self._unheard = self._unheard, []
                if committed:
                    self._tell(pending)

    def _tell(self, events: list[Event]) -> None:
        for event in events:
            for listener in list(self.listeners):
                listener(event)

    def show(self, signal: Activity | AnswerText) -> None:
        """Tell the watchers what the run does now (nothing is recorded). A watcher that
        raises (a terminal gone away) is dropped, with one notice: it never fails the run."""
        for watcher in list(self.watchers):
            try:
                watcher(signal)
            except Exception as exc:  # noqa: BLE001 - an optional part never fails the run
                self.watchers.remove(watcher)
                self.emit(
                    "notice",
                    {"message": f"a watcher failed and was dropped: {type(exc).__name__}: {exc}", "source": "watcher"},
                )

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Queue an event (a notice, a callback error, a model call) from code that is not
        async or that must not record it alone; it is recorded with the run's next event,
        in one transaction (never before ``run_started``)."""
        check_payload(kind, data)
        self._queue.append((kind, data))

    async def flush(self) -> None:
        """Record the queued events now (once the run has started)."""
        if self.view.last_seq == 0 or not self._queue:
            return
        batch, self._queue = self._queue, []
        await self._write(batch)

    # what the view knows, by the names the loop and the tests use
    @property
    def context(self) -> list[Message]:
        return self.view.context

    @property
    def state(self) -> dict[str, Any] | None:
        return self.view.state

    @property
    def usage(self) -> Usage:
        return self.view.usage

    @property
    def model_calls(self) -> int:
        return self.view.model_calls

    @property
    def distillations(self) -> int:
        return self.view.distillations

    @property
    def output(self) -> str | None:
        return self.view.output

    @property
    def last_seq(self) -> int:
        return self.view.last_seq

    @property
    def reported_prompt_tokens(self) -> int:
        return self.view.reported_prompt_tokens

    @property
    def budget(self) -> int:
        """The working-context budget: budget_tokens, or the model's window if smaller, less
        the tokens reserved for recall injection (so an injected block never triggers a
        distillation, and the prompt never passes budget_tokens)."""
        whole = min(self.spec.context.budget_tokens, self.provider.capabilities.context_window)
        return whole - self.spec.context.inject_reserve(whole)

    @property
    def inject_reserve(self) -> int:
        """The tokens of the budget reserved for one call's recalled passages (0: no injection)."""
        whole = min(self.spec.context.budget_tokens, self.provider.capabilities.context_window)
        return self.spec.context.inject_reserve(whole)

    def estimate(self) -> int:
        """The estimated size of the next call: the working context and the tool schemas sent with it."""
        return count_messages(self.context) + count_tools(self.mode.offered_tools(self))

    def pressure(self) -> int:
        """The larger of the estimated size of the next call, the last reported prompt tokens,
        and the estimate scaled by how far the provider's count of the last prompt exceeded
        the runtime's estimate of it: the estimator is not the provider's tokenizer, and a
        turn whose tool results grow the context past the budget must not wait for the
        provider to say so. The scale is at most ``MAX_TOKENIZER_SCALE``: tokenizers differ by
        less, and a larger gap is something else (a provider's own hidden prompt), which the
        reported count alone covers."""
        estimate, reported = self.estimate(), self.view.reported_prompt_tokens
        self._pressure_estimate = (self._context_key(), len(self.context), estimate)
        return max(estimate, reported, int(estimate * self.tokenizer_scale()))

    def tokenizer_scale(self) -> float:
        """How far the provider's count of the last prompt exceeded the runtime's estimate of
        it (1.0 when it did not, at most ``MAX_TOKENIZER_SCALE``), kept across distillations:
        a mode that sizes its own steps against the budget (fold's plan) reads them in the
        provider's tokens with it."""
        return min(self.view.tokenizer_scale, MAX_TOKENIZER_SCALE)

    def judged_estimate(self) -> int | None:
        """The estimate the last :meth:`pressure` took of the context as it still is (no message
        since), else None: what a model call records beside the provider's count, at no cost
        on the per-call path (a mode that never asks for pressure, like append, never scales)."""
        key, size, estimate = self._pressure_estimate
        return estimate if (key, size) == (self._context_key(), len(self.context)) else None

    def _context_key(self) -> str:
        """The working context's identity: its chained hash so far (an event that is not a
        message, such as ``recall_injected``, leaves it as it is)."""
        return self.view.wire_steps[-1] if self.view.wire_steps else ""


@dataclass
class RunResult:
    """What a run (or one turn of an interactive run) produced."""

    run_id: str
    agent: str
    mode: str
    status: str
    """done, parked, or failed."""
    output: str | None
    state: dict[str, Any] | None
    usage: Usage
    model_calls: int
    distillations: int
    error: str | None = None
    state_withheld: tuple[str, ...] = ()
    """Σ's keys left out of ``state``: written from private material (:mod:`loomrt.visibility`)."""

    def to_json(self) -> dict[str, Any]:
        """The object `loomrt run --json` prints."""
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "agent": self.agent,
            "mode": self.mode,
            "status": self.status,
            "output": self.output,
            "state": self.state,
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
                "model_calls": self.model_calls,
            },
            "distillations": self.distillations,
        }
        if self.error:
            out["error"] = self.error
        if self.state_withheld:
            out["state_withheld"] = list(self.state_withheld)
        return out
