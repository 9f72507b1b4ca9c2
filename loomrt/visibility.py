"""Private material: what only its own run may see.

A message is private by provenance, never by matching its text: a tool declared
``private`` (or a private MCP server's tool), a tool result returned as
:class:`loomrt.tools.Private`, or a seq an operator marked (``loomrt runs private RUN_ID
SEQ``, a ``mark_private`` event). The record keeps it whole, and its own run works with it
(the working context, Recall in that run, pins). Everywhere else it is a placeholder:

- a summariser, recap or compaction prompt gets the placeholder (:func:`redact`), so no
  summary can repeat it, whatever the summariser does with its input;
- in stateful mode the model reads a private observation (it is its own run) and may write
  it into Σ: the keys a step's patch set while the step's prompt held private material are
  Σ's private keys, and Σ as the run hands it out (its result, a sub-agent's Σ to its
  parent, MCP, and its output when it is Σ: a run done without ``final``) leaves them out
  and names them in ``state_withheld`` (:func:`withhold`);
- what leaves the run for a reader goes through one function, :func:`redact_events` (through
  :func:`reader_events`, which judges the whole record and a fork's shared history): a private
  message is its placeholder wherever it is carried (its own event, a distillation's inline
  context, a recalled passage, the calls it made), and Σ's private keys are left out wherever
  Σ or a patch appears (``state_update``, ``patch_rejected``, ``distillation``, ``final``, an
  ``emit_state`` call, an output that is Σ). Every reader uses it: ``runs show`` (``--seq``,
  ``--as-of``, ``--prompt`` too), ``runs events``, ``runs export``, MCP ``get_run``,
  ``get_events`` and the resources; ``loomrt recall`` and MCP ``recall`` give a private hit's
  placeholder. Only an explicit ask has it whole (``--include-private``,
  ``include_private: true``): an operator's view is one flag away, never the default.

A message the model writes that repeats private material is **derived private**
(:class:`Taint`): when an assistant message (its text, or its tool calls' arguments)
repeats a distinctive token of a private source, or a run of :data:`RUN_WORDS` of its
words, the runtime marks it (``mark_private`` with ``by: runtime`` and ``derived_from``) in
the message's own transaction, and from then on it is private like its source. An operator
lifts one such mark with ``loomrt runs declassify RUN_ID SEQ`` (a ``declassify`` event).
What the model writes in other words than its source's (a paraphrase, a translation) is
not caught.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrt.events import Event
from loomrt.messages import Message
from loomrt.record.store import Store

if TYPE_CHECKING:
    from loomrt.recall.tool import RecallHit
    from loomrt.run.projection import RunView

__all__ = [
    "placeholder",
    "private_seqs",
    "PrivateRecord",
    "private_record",
    "reader_events",
    "redact",
    "redact_events",
    "mark_private_in_record",
    "withhold",
    "visible_to",
    "Taint",
    "TOKEN_MIN",
    "RUN_WORDS",
    "declassify_in_record",
    "answer_for_another_run",
]


def placeholder(seq: int | None, role: str = "tool") -> str:
    """The words that stand for private message ``seq`` outside its run."""
    what = "tool result" if role == "tool" else "message"
    return f"[private {what} #{seq}: withheld from summaries, memory and other runs]"


def private_seqs(events: Iterable[Event]) -> set[int]:
    """The seqs of the record's private messages (in record order: a ``declassify`` lifts
    the derived mark before it)."""
    out: set[int] = set()
    for e in events:
        if e.kind == "tool_result" and e.data.get("private"):
            out.add(e.seq)
        elif e.kind == "mark_private":
            out.add(int(e.data["seq"]))
        elif e.kind == "declassify":
            out.discard(int(e.data["seq"]))
    return out


TOKEN_MIN = 4
"""The shortest token of a private source whose repetition makes a message derived private."""
RUN_WORDS = 8
"""A run of this many of a private source's words, repeated, makes a message derived private."""
_WORD = re.compile(r"[^\W_](?:[\w\-.:/@]*[^\W_])?")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _runs(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + RUN_WORDS]) for i in range(len(words) - RUN_WORDS + 1)}


@dataclass
class Taint:
    """What the derived-private rule remembers of a run (the view keeps one): each token's
    first non-private message, and each private source's distinctive tokens and word runs.

    A message the model writes (its text and its tool calls' arguments) is **derived
    private** when it repeats a token of a private source that has at least
    :data:`TOKEN_MIN` characters and does not occur in the run's non-private messages
    before that source, or any :data:`RUN_WORDS` consecutive words of the source. The
    runtime records it as a ``mark_private`` event with ``by: runtime`` and ``derived_from``,
    in the message's own transaction; an operator can lift it (``loomrt runs declassify``).
    A derived message is private, but is no source itself (its new words are the model's)."""

    first_seen: dict[str, int] = field(default_factory=dict)
    sources: dict[int, tuple[frozenset[str], frozenset[tuple[str, ...]]]] = field(default_factory=dict)

    def saw(self, message: Message) -> None:
        """A non-private message: its tokens are no longer distinctive of a later source."""
        for w in _words(message.text_for_search()):
            if len(w) >= TOKEN_MIN:
                self.first_seen.setdefault(w, message.seq or 0)

    def source(self, message: Message) -> None:
        """A private message (a private tool's result, an operator's mark): what repeats it."""
        seq = message.seq or 0
        words = _words(message.content)
        tokens = frozenset(w for w in words if len(w) >= TOKEN_MIN and self.first_seen.get(w, seq) >= seq)
        self.sources[seq] = (tokens, frozenset(_runs(words)))

    def derived_from(self, message: Message) -> int | None:
        """The private source ``message`` repeats (the earliest), or None."""
        if not self.sources:
            return None
        words = _words(message.text_for_search())
        found = set(words)
        runs = _runs(words) if len(words) >= RUN_WORDS else set()
        for seq, (tokens, source_runs) in sorted(self.sources.items()):
            if tokens & found or runs & source_runs:
                return seq
        return None


def visible_to(view: RunView) -> Callable[[RecallHit], bool]:
    """Whether run ``view`` (a :class:`~loomrt.run.projection.RunView`) may see a recalled hit
    (a :class:`~loomrt.recall.tool.RecallHit`): its own evicted messages, private ones
    included (it saw them), durable memory (scoped, and never private), and a fork's
    shared history except the parent's private messages. Recall and recall injection both
    ask it, as it is when they ask (a message marked private later is private from then on)."""

    def visible(hit: RecallHit) -> bool:
        if getattr(hit, "source", None) != "family":
            return True
        return hit.seq is None or hit.seq not in view.private

    return visible


def redact(message: Message, private: set[int]) -> Message:
    """``message``, or its placeholder when it is private."""
    if message.seq is None or message.seq not in private:
        return message
    return message.with_(content=placeholder(message.seq, message.role), tool_calls=[])


@dataclass(frozen=True)
class PrivateRecord:
    """What of one run's record is private, by provenance, read from the whole record (a
    ``mark_private`` covers the events before it too) and, for a fork, its shared history."""

    seqs: frozenset[int] = frozenset()
    """The private messages (:func:`private_seqs`)."""
    calls: frozenset[str] = frozenset()
    """The ids of the tool calls a private assistant message made."""
    keys: tuple[tuple[int, frozenset[str]], ...] = ()
    """Σ's private keys after each ``state_update``, ``(seq, keys)`` in record order."""
    outputs: tuple[tuple[int, int], ...] = ()
    """``(seq, message)``: a ``final``, ``parked`` or ``cancelled`` whose output is the text of
    private assistant message ``message`` (the answer repeated a private source)."""

    @classmethod
    def of(cls, events: Iterable[Event]) -> PrivateRecord:
        """The private material ``events`` name (a whole record, its family's shared events first)."""
        events = list(events)
        seqs = private_seqs(events)
        calls: set[str] = set()
        keys: list[tuple[int, frozenset[str]]] = []
        outputs: list[tuple[int, int]] = []
        current: frozenset[str] = frozenset()
        said: int | None = None  # the last assistant message: a turn's answer is its text
        for e in events:
            if e.kind == "assistant_message":
                said = e.seq
                if e.seq in seqs:
                    calls |= {str(c.get("id")) for c in (e.data.get("message") or {}).get("tool_calls") or ()}
            elif e.kind in ("final", "parked", "cancelled") and said in seqs and e.data.get("output"):
                outputs.append((e.seq, int(said or 0)))
            elif e.kind == "state_update":  # as stateful mode replays it: a key stays private while Σ has it
                state = e.data.get("state") or {}
                current = (current | frozenset(e.data.get("private_keys") or ())) & frozenset(state)
                keys.append((e.seq, current))
        return cls(frozenset(seqs), frozenset(calls), tuple(keys), tuple(outputs))

    def keys_at(self, seq: int) -> frozenset[str]:
        """Σ's keys private at ``seq``: those of the state update at or before it, and those of
        the next one (the step it belongs to: an ``emit_state`` call comes before its update)."""
        i = bisect.bisect_right(self.keys, seq, key=lambda k: k[0])
        before = self.keys[i - 1][1] if i else frozenset()
        return before | (self.keys[i][1] if i < len(self.keys) else frozenset())

    @property
    def state_withheld(self) -> list[str]:
        """Σ's keys private now (after the last state update): what Σ handed out leaves out."""
        return sorted(self.keys[-1][1]) if self.keys else []

    def __bool__(self) -> bool:
        return bool(self.seqs or any(k for _, k in self.keys))


def private_record(store: Store, run_id: str) -> PrivateRecord:
    """:class:`PrivateRecord` of run ``run_id``: its whole record, and a fork's shared history
    (the parent's private material is private in the fork too)."""
    from loomrt.run.family import Family

    events = store.events(run_id)
    family = Family.of(store, events[0].data.get("forked_from")) if events else None
    shared = family.events(kinds=["tool_result", "mark_private", "state_update"]) if family is not None else []
    found = PrivateRecord.of([*shared, *events])
    if family is None:
        return found
    return PrivateRecord(found.seqs | family.private(), found.calls, found.keys, found.outputs)


def reader_events(
    store: Store,
    run_id: str,
    *,
    include_private: bool = False,
    after: int = 0,
    kinds: Iterable[str] | None = None,
) -> list[Event]:
    """Run ``run_id``'s events as a reader gets them (``runs show``, ``runs events``, ``runs
    export``, MCP ``get_events`` and resources): private material replaced
    (:func:`redact_events`, judged on the whole record) unless ``include_private``."""
    events = store.events(run_id, after=after, kinds=kinds)
    return events if include_private else redact_events(events, private_record(store, run_id))


def answer_for_another_run(store: Store, run_id: str, output: str | None) -> str | None:
    """Run ``run_id``'s answer ``output`` as it is handed to another run (a sub-agent's to its
    parent): the placeholder of the message it is the text of, when that message is private
    (the answer repeated a private source), else as it is."""
    if output is None:
        return None
    private = private_record(store, run_id)
    ends = [e for e in store.events(run_id, kinds=["final", "parked", "cancelled"]) if e.data.get("output") == output]
    said = dict(private.outputs).get(ends[-1].seq) if ends else None
    return output if said is None else placeholder(said, "assistant")


def redact_events(events: Iterable[Event], private: PrivateRecord | set[int] | None = None) -> list[Event]:
    """``events`` with their private material replaced (``redacted: true``), whatever kind
    carries it: a private message by its placeholder (in its own event, in a distillation's
    context, in a recalled passage, and the arguments of the calls it made); Σ's private keys
    left out wherever Σ or a patch appears (``state_update``, ``patch_rejected``,
    ``distillation``, ``final``, ``parked``, an ``emit_state`` call, an output that is Σ) and
    named in ``withheld``; an answer (``final``, ``parked``) that is a private message's text
    is that message's placeholder. ``private`` is the record's (:func:`private_record`); by default,
    what ``events`` name."""
    events = list(events)
    if private is None:
        private = PrivateRecord.of(events)
    elif not isinstance(private, PrivateRecord):
        private = PrivateRecord(frozenset(private))
    return [_redacted(e, private) for e in events] if private else events


def _redacted(e: Event, private: PrivateRecord) -> Event:
    seqs, keys = set(private.seqs), private.keys_at(e.seq)
    d: dict[str, Any] = dict(e.data)
    withheld: set[str] = set()

    def hide(value: Any) -> Any:
        """``value`` (Σ or a patch) without its private keys."""
        if not isinstance(value, dict) or not keys & set(value):
            return value
        withheld.update(keys & set(value))
        return {k: v for k, v in value.items() if k not in keys}

    if e.kind in ("tool_result", "user_input") and e.seq in seqs:
        d["content"] = placeholder(e.seq, "tool" if e.kind == "tool_result" else "user")
    elif e.kind == "assistant_message" and e.seq in seqs:
        d["message"] = {**d.get("message", {}), "content": placeholder(e.seq, "assistant"), "tool_calls": []}
    elif e.kind == "assistant_message" and keys:
        calls = [_call_without(c, hide) for c in (d.get("message") or {}).get("tool_calls") or ()]
        d["message"] = {**d.get("message", {}), "tool_calls": calls}
    elif e.kind == "tool_call" and str(d.get("id")) in private.calls:
        d["arguments"] = {}
    elif e.kind == "recall_injected" and (
        any(p.get("seq") in seqs or p.get("before_seq") in seqs for p in d.get("passages") or ())
        or any(s in seqs for s in d.get("query_seqs") or ())
    ):
        d["passages"] = [_redacted_passage(p, seqs) for p in d.get("passages") or ()]
        quoted = [s for s in d.get("query_seqs") or () if s in seqs]
        if quoted:
            d["query"] = f"[query withheld: it quotes private message #{quoted[0]}]"
    elif e.kind in ("state_update", "patch_rejected", "final", "parked", "cancelled"):
        for field_ in ("state", "patch"):
            if field_ in d:
                d[field_] = hide(d[field_])
        said = dict(private.outputs).get(e.seq)
        if said is not None:
            d["output"] = placeholder(said, "assistant")
        elif isinstance(d.get("output"), str):
            d["output"] = _output_without(d["output"], hide)
    elif e.kind == "distillation":
        if "state" in d:
            d["state"] = hide(d["state"])
        d["context"] = [_ref_without(r, seqs, hide) for r in d.get("context") or ()]
    if d == e.data and not withheld:
        return e
    if withheld:
        d["withheld"] = sorted(withheld)
    d["redacted"] = True
    return e.model_copy(update={"data": d})


def _call_without(call: dict[str, Any], hide: Callable[[Any], Any]) -> dict[str, Any]:
    """An ``emit_state`` call with Σ's private keys left out of its patch."""
    args = call.get("arguments")
    if call.get("name") != "emit_state" or not isinstance(args, dict) or "patch" not in args:
        return call
    return {**call, "arguments": {**args, "patch": hide(args["patch"])}}


def _output_without(output: str, hide: Callable[[Any], Any]) -> str:
    """A run's output that is Σ itself (a stateful run that finished without ``final``),
    without Σ's private keys."""
    try:
        value = json.loads(output)
    except ValueError:
        return output
    shown = hide(value)
    return output if shown is value else json.dumps(shown, ensure_ascii=False)


def _ref_without(ref: dict[str, Any], seqs: set[int], hide: Callable[[Any], Any]) -> dict[str, Any]:
    """One entry of a distillation's ``context``: a message it holds whole (stateful's
    observation, a cut message's head, Σ) with its private material replaced."""
    message = ref.get("message")
    if not isinstance(message, dict):
        return ref
    if message.get("seq") in seqs:
        return {"message": {**message, "content": placeholder(message["seq"], str(message.get("role") or "tool"))}}
    if message.get("synthetic") == "state":  # "Your state Σ:" and Σ as JSON on the next line
        head, _, body = str(message.get("content") or "").partition("\n")
        try:
            state = json.loads(body)
        except ValueError:
            return ref
        shown = hide(state)
        if shown is not state:
            return {"message": {**message, "content": f"{head}\n{json.dumps(shown, ensure_ascii=False)}"}}
    return ref


def _redacted_passage(passage: dict[str, Any], private: set[int]) -> dict[str, Any]:
    """A recalled passage with its private text (or the private message it quotes before it) withheld."""
    out = dict(passage)
    if out.get("seq") in private:
        out["text"] = placeholder(out["seq"], str(out.get("role") or "tool"))
    if out.get("before_seq") in private:
        out.pop("before", None)
    return out


def withhold(state: dict[str, Any] | None, keys: set[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """Σ without its private keys, and which keys were left out."""
    if state is None or not keys:
        return state, []
    withheld = sorted(k for k in keys if k in state)
    return {k: v for k, v in state.items() if k not in keys}, withheld


def mark_private_in_record(store: Store, run_id: str, seq: int) -> None:
    """An operator's ``loomrt runs private RUN_ID SEQ``: the message at ``seq`` is private from now on."""
    from loomrt.errors import NotFoundError
    from loomrt.events import message_of

    event = next((e for e in store.events(run_id) if e.seq == seq), None)
    message = message_of(event) if event is not None else None
    if message is None or message.role == "system":
        raise NotFoundError(
            f"run {run_id} has no message at #{seq} to mark private (a user input, an assistant "
            "message or a tool result; `loomrt runs events RUN_ID` lists their seqs)"
        )
    store.append(run_id, "mark_private", {"seq": seq, "by": "operator"})


def declassify_in_record(store: Store, run_id: str, seq: int) -> None:
    """An operator's ``loomrt runs declassify RUN_ID SEQ``: the message at ``seq``, marked
    derived private by the runtime, is not private from now on. Only the runtime's mark can
    be lifted: a private tool's result, or a message an operator marked, stays private."""
    from loomrt.errors import NotFoundError

    events = store.events(run_id, kinds=["mark_private", "declassify"])
    marks = [e for e in events if e.kind == "mark_private" and int(e.data["seq"]) == seq]
    if seq not in private_seqs(events) or not marks:
        raise NotFoundError(
            f"run {run_id} has no derived private message at #{seq} to declassify "
            "(`loomrt runs events RUN_ID --kind mark_private` lists the runtime's marks)"
        )
    if any(e.data.get("by") != "runtime" for e in marks):
        raise NotFoundError(
            f"#{seq} of run {run_id} was marked private by an operator: declassify lifts only the "
            "runtime's derived marks (by: runtime)"
        )
    store.append(run_id, "declassify", {"seq": seq, "by": "operator"})
