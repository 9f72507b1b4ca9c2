"""The run's view of its record: the working context, the mode's state and the totals,
folded event by event.

:class:`RunView` is the only place where the record turns into a working context. A live
run applies each event right after it records it (:meth:`loomrt.run.state.RunState.add`);
:func:`project` applies a whole record to a fresh view. Both go through
:meth:`RunView.apply`, so a context rebuilt from the record equals the live one by
construction. Messages come from :func:`loomrt.events.message_of` (the one reader); a
mode's own events are replayed by the mode (:meth:`RetentionMode.replay`), into the slot
it owns (``view.slot``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrt.events import LIFECYCLE_KINDS, Event, message_of, run_status
from loomrt.messages import Message
from loomrt.prompt_hash import chained, message_step
from loomrt.providers.base import Usage
from loomrt.run.cards import CARD_BLOCK, Card, card_message
from loomrt.run.pins import Pin
from loomrt.tokens import count_text
from loomrt.visibility import Taint

if TYPE_CHECKING:
    from loomrt.record.store import Store
    from loomrt.run.family import Family
    from loomrt.run.reducers.base import RetentionMode

__all__ = ["RunView", "project", "context_refs", "message_limit", "MAX_TOKENIZER_SCALE"]

MAX_TOKENIZER_SCALE = 1.5
"""The most :meth:`~loomrt.run.state.RunState.pressure` scales the estimate by (the provider's
count of the last prompt over the runtime's estimate of it): tokenizers differ by less, and a
larger gap is something else (a provider's own hidden prompt), which the reported count covers."""


def message_limit(context: dict[str, Any], budget: int) -> int:
    """``context.message_max_tokens``, else a quarter of the run's budget."""
    return int(context.get("message_max_tokens") or max(64, budget // 4))


def context_refs(context: list[Message]) -> list[dict[str, Any]]:
    """The working context as a distillation event stores it: record messages by seq,
    cards by id, other synthetic ones whole."""
    refs: list[dict[str, Any]] = []
    for m in context:
        if m.synthetic == CARD_BLOCK and m.ref:
            refs.append({"card": m.ref})
        elif m.seq is not None and m.synthetic is None:
            refs.append({"seq": m.seq, "pinned": True} if m.pinned else {"seq": m.seq})
        else:
            refs.append({"message": m.to_dict()})
    return refs


@dataclass
class RunView:
    """What a run's record says, applied event by event."""

    mode: RetentionMode
    slot: Any = None
    """The retention mode's own state (Σ and its patch attempts, in stateful mode)."""
    run_id: str = ""
    keep_first: bool = True
    max_message_tokens: int = 0
    """Messages over this many tokens are cut in the working context (0: not yet known)."""
    context: list[Message] = field(default_factory=list)
    wire: list[dict[str, Any]] = field(default_factory=list)
    """The working context in the provider's format, kept in step with ``context`` (append
    :meth:`push`, replace :meth:`replace`), so a turn's request costs no rebuild."""
    wire_steps: list[str] = field(default_factory=list)
    """The chained prompt hash after each message of ``wire`` (:func:`loomrt.audit.message_step`)."""
    messages: dict[int, Message] = field(default_factory=dict)
    """Every record message by seq, as the working context holds it (cut if too large)."""
    originals: dict[int, Message] = field(default_factory=dict)
    """The full message, for each one that was cut."""
    usage: Usage = field(default_factory=Usage)
    model_calls: int = 0
    turn_calls: int = 0
    summary_calls: int = 0
    distillations: int = 0
    declines: int = 0
    rejections: int = 0
    """Recaps or summaries the prose check rejected (``summary_rejected`` events)."""
    fallback_streak: int = 0
    """Distillations in a row whose block is a fallback extract (the summariser failed)."""
    output: str | None = None
    last_seq: int = 0
    lifecycle: str | None = None
    """The kind of the last lifecycle event (the run's status derives from it)."""
    reported_prompt_tokens: int = 0
    """Prompt tokens the provider reported on the last turn call (0 after a distillation)."""
    estimated_prompt_tokens: int = 0
    """The runtime's estimate of that call's prompt (0 when unknown, or after a distillation)."""
    tokenizer_scale: float = 1.0
    """The last turn call's reported prompt tokens over the estimate of it, where both are
    known and the report is the larger (else 1.0). Kept across a distillation when it is at
    most ``MAX_TOKENIZER_SCALE``, since it then tells how the provider counts, not how large
    the context was; a larger gap (a hidden prompt) is not carried over."""
    pins: dict[str, Pin] = field(default_factory=dict)
    """The pins in force (``pin`` events not undone by an ``unpin``), by id, oldest first."""
    pin_count: int = 0
    request_seq: int | None = None
    """The current user request, pinned until it is answered (a parked or final)."""
    private: set[int] = field(default_factory=set)
    """Seqs of the private messages (:mod:`loomrt.visibility`)."""
    taint: Taint = field(default_factory=Taint)
    """What makes a message the model writes derived private (:class:`loomrt.visibility.Taint`)."""
    cards: dict[str, Card] = field(default_factory=dict)
    """Every card this run's record holds (fold mode writes them), by id, oldest first."""
    family: Family | None = None
    """A fork's shared history (:class:`loomrt.run.family.Family`); None for a run that is not a fork."""
    fork_seq: int = 0
    """The parent's last seq a fork shares (0: not a fork)."""
    _sharing: bool = False
    declined_at: int = -1
    """Length of the context when the last distillation was declined (no retry until it grows)."""
    declined_size: int = -1
    """Estimated size when a paid distillation last bought nothing: the next one waits until
    the context, or the pressure, has grown by 5% of the budget. Reset by every distillation."""
    declined_pressure: int = -1
    distilled_len: int = -1
    """Length of the context right after the last distillation: while it is unchanged,
    nothing is distilled or queued again (a run resumed right after a distillation does what
    the uninterrupted run did there: it calls the model)."""
    queued_at: int | None = None
    """The seq of the ``distillation_queued`` event not yet settled by a distillation or a
    decline: a recap or compaction due between turns."""
    seen_user: bool = False
    task_seq: int | None = None
    """The first user input (the task: pinned by ``keep_first``, not as the current request)."""
    parked_after_error: bool = False
    """An interactive run parked because its turn failed: resume plays that turn again."""
    turns: int = 0
    """User inputs so far (a turn begins with each)."""
    input_seq: int | None = None
    """The newest user input (the query recall injection searches with)."""
    injection: tuple[int, Message, tuple[dict[str, Any], ...]] | None = None
    """The last ``recall_injected`` event's seq and block, while no turn call has used it and
    the working context has not changed since: the next turn call sends it (a run resumed
    between the event and the call sends the same block, and injects nothing new)."""
    injection_sent: frozenset[int] = frozenset()
    """The record seqs of the passages the last turn call's prompt held (stateful mode: a
    private one makes the keys that step sets private)."""
    injected: dict[tuple[str, Any], int] = field(default_factory=dict)
    """(source, seq or memory id) of each injected passage, and the turn it was injected in."""

    def __post_init__(self) -> None:
        if self.slot is None:
            self.slot = self.mode.new_slot()

    @property
    def distillation_queued(self) -> bool:
        """Whether a recap or compaction is due between turns (:attr:`queued_at`)."""
        return self.queued_at is not None

    @property
    def status(self) -> str:
        return run_status(self.lifecycle)

    @property
    def state(self) -> dict[str, Any] | None:
        """Σ, in stateful mode; None in the others."""
        return self.mode.state_of(self.slot)

    def original(self, message: Message) -> Message:
        """``message`` with its full text (the record's), if the working context holds it cut
        or as a reference (``synthetic="external"``)."""
        if message.seq is None:
            return message
        if message.seq in self.originals:
            return self.originals[message.seq]
        return self.messages.get(message.seq, message) if message.synthetic == "external" else message

    def apply(self, e: Event) -> None:
        """Fold one event into the view."""
        self.last_seq = e.seq
        if e.kind in LIFECYCLE_KINDS:
            self.lifecycle = e.kind
        d = e.data
        if e.kind == "run_started" and d.get("forked_from"):
            self._start_fork(e)
            self.mode.replay(e, self)
            return
        match e.kind:
            case "run_started":
                self.run_id = e.run_id
                ctx = (d.get("definition") or {}).get("context") or {}
                self.keep_first = bool(ctx.get("keep_first", True))
                self.max_message_tokens = int(
                    d.get("message_max_tokens") or message_limit(ctx, ctx.get("budget_tokens") or 8192)
                )
            case "distillation":
                for c in d.get("cards") or ():
                    self.cards[c["id"]] = Card.from_dict(c)
                self.replace([self._ref(r) for r in d["context"]])
                self.distillations += 1
                self.fallback_streak = self.fallback_streak + 1 if d.get("fallback") else 0
                self.reported_prompt_tokens = self.estimated_prompt_tokens = 0
                if self.tokenizer_scale > MAX_TOKENIZER_SCALE:
                    self.tokenizer_scale = 1.0
                self.declined_at = self.declined_size = self.declined_pressure = -1
                self.queued_at = None
                self.distilled_len = len(self.context)
            case "distillation_queued":
                self.queued_at = e.seq
            case "distillation_declined":
                self.declines += 1
                self.queued_at = None
                self.declined_at = len(self.context)
                if d.get("paid", d.get("reason") == "result not smaller"):
                    self.declined_size = int(d.get("tokens_before", -1))
                    self.declined_pressure = int(d.get("pressure", self.declined_size))
            case "model_call":
                u = d.get("usage") or {}
                self.usage = self.usage + Usage(
                    u.get("input_tokens", 0), u.get("output_tokens", 0), u.get("cached_tokens", 0)
                )
                self.model_calls += 1
                if d.get("purpose") == "turn":
                    self.turn_calls += 1
                    sent = self.injection[2] if self.injection and d.get("recall_injected") else ()
                    # what the prompt held (a passage, and the message before a short one);
                    # a passage counts as injected once a call sent it
                    self.injection_sent = frozenset(
                        s
                        for p in sent
                        if p.get("source") != "memory"
                        for s in (p.get("seq"), p.get("before_seq"))
                        if s is not None
                    )
                    for p in sent:
                        key = p.get("seq") if p.get("seq") is not None else p.get("id")
                        self.injected[(str(p.get("source")), key)] = self.turns
                    self.injection = None
                    self.reported_prompt_tokens = u.get("input_tokens", 0)
                    self.estimated_prompt_tokens = int(d.get("estimated_tokens") or 0)
                    if self.estimated_prompt_tokens:
                        self.tokenizer_scale = max(1.0, self.reported_prompt_tokens / self.estimated_prompt_tokens)
                    injected = int(d.get("injected_tokens") or 0)
                    if injected and self.estimated_prompt_tokens > injected:
                        # pressure judges the working context: the block was in this prompt only
                        share = 1 - injected / self.estimated_prompt_tokens
                        self.reported_prompt_tokens = int(self.reported_prompt_tokens * share)
                        self.estimated_prompt_tokens -= injected
                    elif injected:  # the block in the provider's tokens, as pressure scales the estimate
                        scaled = int(injected * min(self.tokenizer_scale, MAX_TOKENIZER_SCALE))
                        self.reported_prompt_tokens = max(0, self.reported_prompt_tokens - scaled)
                else:
                    self.summary_calls += 1
            case "summary_rejected":
                self.rejections += 1
            case "final" | "parked":
                self.output = d.get("output")
                self.parked_after_error = bool(d.get("after_error"))
                self.request_seq = None
            case "user_input":
                self.request_seq = self.input_seq = e.seq
                self.turns += 1  # a passage injected this turn or the previous one is not injected again
                self.injected = {k: t for k, t in self.injected.items() if t >= self.turns - 1}
            case "recall_injected":
                from loomrt.injection import block_message

                self.injection = (e.seq, block_message(d), tuple(d.get("passages") or ()))
            case "pin":
                self.pin_count += 1
                seq = d.get("seq")
                if seq is None:
                    self.pins[d["pin"]] = Pin(
                        d["pin"], None, d.get("text") or "", d.get("note") or "", d.get("by") or ""
                    )
                elif seq in self.messages:
                    body = self.original(self.messages[seq]).content
                    self.pins[d["pin"]] = Pin(d["pin"], seq, body, d.get("note") or "", d.get("by") or "")
            case "unpin":
                self.pins.pop(d["pin"], None)
            case "tool_result" if d.get("private"):
                self.private.add(e.seq)
            case "mark_private":
                self.private.add(int(d["seq"]))
                marked = self.messages.get(int(d["seq"]))
                if d.get("by") != "runtime" and marked is not None:  # a derived message is no source itself
                    self.taint.source(self.original(marked))
            case "declassify":
                self.private.discard(int(d["seq"]))
        message = message_of(e)
        if message is not None and message.role != "system":
            (self.taint.source if e.seq in self.private else self.taint.saw)(message)
        if message is not None:
            if e.kind == "user_input":  # the first input is the task, pinned when keep_first is on
                message = message.with_(pinned=self.keep_first and not self.seen_user)
                if not self.seen_user:
                    self.task_seq = e.seq
                self.seen_user = True
            self._enter(message)
        self.mode.replay(e, self)

    def _ref(self, ref: dict[str, Any]) -> Message:
        """One entry of a distillation's ``context``, as a working-context message."""
        if "seq" in ref:
            return self.messages[ref["seq"]].with_(pinned=bool(ref.get("pinned")))
        if "card" in ref:
            return card_message(self.cards[ref["card"]])
        return Message.from_dict(ref["message"])

    def _enter(self, message: Message, *, push: bool = True) -> None:
        """Append a record message to the working context, cut if it is too large."""
        limit = self.max_message_tokens
        # a token is at least one character: a message no longer than the limit in characters fits
        if limit and message.role != "system" and len(message.content) > limit and count_text(message.content) > limit:
            self.originals[message.seq] = message  # type: ignore[index]
            message = message.with_(content=self.mode.cut_note(message, limit))
        self.messages[message.seq] = message  # type: ignore[index]
        if push:
            self.push(message)

    def _start_fork(self, e: Event) -> None:
        """A fork's ``run_started``: its working context starts as its parent's at the fork
        point (fold: the trimmed ``catalog``; other modes: the shared record replayed), the
        parent's private material as placeholders, and the fork's own system prompt."""
        d = e.data
        if self._sharing:  # a fork of a fork, replayed: only its system prompt changes
            system = message_of(e)
            self.replace([m for m in self.context if m.role != "system"])
            if system is not None:
                self.messages[e.seq] = system
                self.replace([system, *self.context])
            return
        if self.family is None:
            raise ValueError(
                f"run {e.run_id} is a fork of run {d['forked_from']['run_id']}: rebuilding its view needs "
                "the store its family is in (project(events, store=store))"
            )
        from loomrt.visibility import PrivateRecord, redact, redact_events

        self._sharing = True
        if "catalog" in d:
            self._load_catalog(d["catalog"])
        else:  # redacted as a reader gets it: Σ's private keys too (the fork's Σ is the shared one)
            shared = self.family.events()
            for event in redact_events(shared, PrivateRecord.of(shared)):
                self.apply(event)
        self._sharing = False
        self.private |= self.family.private()
        self.messages = {s: redact(m, self.private) for s, m in self.messages.items()}
        self.originals = {s: m for s, m in self.originals.items() if s not in self.private}
        base = [redact(m, self.private) for m in self.context if m.role != "system"]
        ctx = (d.get("definition") or {}).get("context") or {}
        self.run_id, self.fork_seq, self.last_seq = e.run_id, self.family.fork_seq, e.seq
        self.keep_first = bool(ctx.get("keep_first", True))
        self.max_message_tokens = int(
            d.get("message_max_tokens") or message_limit(ctx, ctx.get("budget_tokens") or 8192)
        )
        self.lifecycle, self.output, self.request_seq = e.kind, None, None
        self.usage, self.model_calls, self.turn_calls, self.summary_calls = Usage(), 0, 0, 0
        self.distillations = self.declines = self.rejections = 0
        self.injected, self.injection_sent, self.input_seq, self.turns = {}, frozenset(), None, 0
        self.declined_at = self.declined_size = self.declined_pressure = -1
        system = message_of(e)
        if system is not None:
            self.messages[e.seq] = system
        self.replace([system, *base] if system is not None else base)

    def _load_catalog(self, refs: list[dict[str, Any]]) -> None:
        """A fold fork's starting context: its catalog's cards and raw messages, read from the family."""
        family = self.family
        assert family is not None  # _start_fork checked
        seqs = [int(r["seq"]) for r in refs if "seq" in r]
        shared = family.events_at(seqs)
        self.private |= {s for s, ev in shared.items() if ev.kind == "tool_result" and ev.data.get("private")}
        for s in seqs:
            message = message_of(shared[s]) if s in shared else None
            if message is not None:
                if shared[s].kind == "user_input" and not self.seen_user:
                    self.task_seq, self.seen_user = s, True
                self._enter(message, push=False)
        self.cards.update(family.cards([r["card"] for r in refs if "card" in r]))
        self.replace([self._ref(r) for r in refs if "card" in r or "message" in r or int(r["seq"]) in self.messages])

    def push(self, message: Message) -> None:
        """Append ``message`` to the working context (a mode's replay adds its own this way)."""
        self.injection = None  # a block follows the context it was searched for
        self.context.append(message)
        self.wire.append(message.to_litellm())
        self.wire_steps.append(message_step(self.wire_steps[-1] if self.wire_steps else "", self.wire[-1]))

    def replace(self, context: list[Message]) -> None:
        """Make ``context`` the working context (a distillation)."""
        self.injection = None
        self.context = context
        self.wire = [m.to_litellm() for m in context]
        self.wire_steps = []
        for wire in self.wire:
            self.wire_steps.append(message_step(self.wire_steps[-1] if self.wire_steps else "", wire))

    def injected_at(self) -> int:
        """Where a recalled block goes in the prompt: right before the newest message when it
        is the user's input, so the question is the last thing the model reads (a small model
        answers the last question-like text it sees: after the question, a block's last
        passage was answered instead); else at the end, after the newest tool result (never
        between a tool call and its result). Either way everything before it is the stable
        prefix the last call sent."""
        last = self.context[-1] if self.context else None
        if last is not None and last.role == "user" and last.synthetic is None:
            return len(self.context) - 1
        return len(self.context)

    def prompt_hash(self, injected: Message | None = None) -> str:
        """The hash of the working context as a turn sends it (``model_call.prompt_hash``),
        with ``injected`` (a recalled block) where :meth:`injected_at` puts it."""
        if injected is None:
            return chained(self.wire_steps[-1] if self.wire_steps else "")
        at = self.injected_at()
        step = message_step(self.wire_steps[at - 1] if at > 0 else "", injected.to_litellm())
        for wire in self.wire[at:]:
            step = message_step(step, wire)
        return chained(step)


def project(events: Iterable[Event], *, mode: RetentionMode | None = None, store: Store | None = None) -> RunView:
    """Apply ``events`` (one run's record, in seq order) to a fresh view. The retention
    mode is the one the record's ``run_started`` names, unless given. A fork's record
    needs ``store``, where its family's history is."""
    events = list(events)
    if mode is None:
        from loomrt.run.modes import mode_for

        mode = mode_for(events[0].data.get("mode", "append") if events else "append")
    view = RunView(mode=mode)
    if events and events[0].data.get("forked_from") and store is not None:
        from loomrt.run.family import Family

        view.family = Family.of(store, events[0].data["forked_from"])
    for e in events:
        view.apply(e)
    return view
