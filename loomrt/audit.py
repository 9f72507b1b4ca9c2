"""Reading a run back: its transcript with the distillation markers, the working context
as of any seq, and the check that every prompt sent is the one the record rebuilds.

- :func:`transcript`: the run's messages in record order, each marked evicted or not, with
  one :class:`Marker` per distillation between them (its mode, the seqs it covered, the
  tokens before and after, and what the agent worked from afterwards: the recap, summary,
  Σ or pinned blocks the distillation put in the context);
- :func:`context_as_of`: the working context exactly as the model saw it after event
  ``seq`` (the projection, applied to the record up to there);
- :func:`prompt_problems`: re-derive the working context at every turn's model call and
  compare its hash with the ``prompt_hash`` the call recorded;
- :func:`to_markdown` / :func:`to_jsonl`: the transcript for a reviewer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrt.events import Event, message_of
from loomrt.messages import Message
from loomrt.prompt_hash import CHAINED, _whole_prompt_hash, chained, message_step, prompt_hash
from loomrt.record.store import Store

if TYPE_CHECKING:
    from loomrt.run.projection import RunView

__all__ = [
    "Line",
    "Marker",
    "transcript",
    "context_as_of",
    "prompt_hash",
    "message_step",
    "chained",
    "CHAINED",
    "prompt_problems",
    "prompt_as_of",
    "prompt_of",
    "turn_call",
    "to_markdown",
    "to_jsonl",
]


@dataclass(frozen=True)
class Line:
    """One message of the record."""

    seq: int
    role: str
    text: str
    name: str | None = None
    tool_calls: tuple[str, ...] = ()
    evicted_by: tuple[int, ...] = ()
    """The distillations whose span covered it (empty: it never left the working context)."""
    private: bool = False
    """Only its own run may see it (:mod:`loomrt.visibility`)."""

    def to_dict(self) -> dict[str, Any]:
        d = {
            "type": "message",
            "seq": self.seq,
            "role": self.role,
            "name": self.name,
            "text": self.text,
            "tool_calls": list(self.tool_calls),
            "evicted_by": list(self.evicted_by),
        }
        return {**d, "private": True} if self.private else d


@dataclass(frozen=True)
class Marker:
    """One distillation, between the messages it was made after."""

    seq: int
    mode: str
    covered: tuple[int, ...]
    tokens_before: int
    tokens_after: int
    worked_from: tuple[str, ...] = field(default=())
    """The blocks the distillation put in the working context (recap, summary, Σ, pins)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "distillation",
            "seq": self.seq,
            "mode": self.mode,
            "covered": list(self.covered),
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "worked_from": list(self.worked_from),
        }


def _worked_from(event: Event) -> tuple[str, ...]:
    """The synthetic messages of a distillation's new context, and Σ if it carries one."""
    blocks = [
        Message.from_dict(r["message"]).content
        for r in event.data.get("context") or []
        if "message" in r and (r["message"].get("synthetic") or r["message"].get("role") != "system")
    ]
    return tuple(b for b in blocks if b)


def transcript(events: Iterable[Event]) -> list[Line | Marker]:
    """The run's messages (system excluded) and distillations, in record order."""
    from loomrt.visibility import private_seqs

    events = list(events)
    private = private_seqs(events)
    covered: dict[int, list[int]] = {}
    for e in events:
        if e.kind == "distillation":
            for s in e.data.get("span_seqs") or []:
                covered.setdefault(int(s), []).append(e.seq)
    out: list[Line | Marker] = []
    for e in events:
        if e.kind == "distillation":
            d = e.data
            out.append(
                Marker(
                    e.seq,
                    str(d.get("mode")),
                    tuple(int(s) for s in d.get("span_seqs") or []),
                    int(d.get("tokens_before") or 0),
                    int(d.get("tokens_after") or 0),
                    _worked_from(e),
                )
            )
            continue
        m = message_of(e)
        if m is None or m.role == "system":
            continue
        out.append(
            Line(
                e.seq,
                m.role,
                m.content,
                m.name,
                tuple(c.name for c in m.tool_calls),
                tuple(covered.get(e.seq, ())),
                e.seq in private,
            )
        )
    return out


def context_as_of(events: Iterable[Event], seq: int, store: Store | None = None) -> list[Message]:
    """The working context after event ``seq``, rebuilt from the record (a fork's needs ``store``)."""
    from loomrt.run.projection import project

    return project((e for e in events if e.seq <= seq), store=store).context


def prompt_problems(events: Iterable[Event], store: Store | None = None) -> list[str]:
    """One line per turn whose recorded prompt hash differs from the working context the
    record rebuilds at that moment; empty when every prompt checks out (a fork's record
    needs ``store``, where its shared history is)."""
    from loomrt.run.projection import project

    events = list(events)
    if not events:
        return []
    view = project(events[:1], store=store)
    problems = []
    for e in events[1:]:
        d = e.data
        if e.kind == "model_call" and d.get("purpose") == "turn" and d.get("prompt_hash") and not d.get("prompt_from"):
            problems.append(f"#{e.seq}: a turn's model call that says nothing of where its prompt came from")
        if e.kind == "model_call" and d.get("prompt_from") == "context" and d.get("prompt_hash"):
            block = None
            if d.get("recall_injected") is not None:
                if view.injection is None or view.injection[0] != d["recall_injected"]:
                    problems.append(
                        f"#{e.seq}: the call names recalled passages #{d['recall_injected']} that the record "
                        "does not put right before it"
                    )
                    view.apply(e)
                    continue
                block = view.injection[1]
            if d["prompt_hash"].startswith(CHAINED):
                derived = view.prompt_hash(block)
            else:
                derived = _whole_prompt_hash(view.wire)
            if derived != d["prompt_hash"]:
                problems.append(
                    f"#{e.seq}: the prompt sent (hash {e.data['prompt_hash']}) is not the working "
                    f"context the record rebuilds there (hash {derived})"
                )
        view.apply(e)
    return problems


def prompt_as_of(events: Iterable[Event], seq: int, store: Store | None = None) -> list[Message]:
    """The whole prompt the ``model_call`` at ``seq`` sent, as the record derives it: the
    working context then, and the recalled block when one went with it (``synthetic="recall"``).
    ``ValueError`` when ``seq`` is not a turn's model call."""
    from loomrt.run.projection import project

    events = list(events)
    call = next((e for e in events if e.seq == seq), None)
    return prompt_of(project([e for e in events if e.seq < seq], store=store), call, seq)


def prompt_of(view: RunView, call: Event | None, seq: int) -> list[Message]:
    """The whole prompt the model call at ``seq`` (``call``, the event there) sent, from
    ``view``, the record's view after the events before it (:func:`prompt_as_of` projects it;
    ``loomrt ui`` keeps checkpoints of it). ``ValueError`` when ``call`` is no turn's model call."""
    call = turn_call(call, seq)
    prompt = list(view.context)
    if call.data.get("recall_injected") is not None and view.injection is not None:
        prompt.insert(view.injected_at(), view.injection[1])
    return prompt


def turn_call(call: Event | None, seq: int) -> Event:
    """``call`` if it is a turn's model call (one whose prompt the record derives), else ``ValueError``."""
    if call is None or call.kind != "model_call" or call.data.get("prompt_from") != "context":
        raise ValueError(f"#{seq} is not a turn's model call (`runs events RUN_ID --kind model_call` lists them)")
    return call


def _who(line: Line) -> str:
    if line.role == "tool":
        return f"tool result · {line.name}" if line.name else "tool result"
    return line.role


def to_markdown(run_id: str, items: Sequence[Line | Marker], *, full: bool = True) -> str:
    """The transcript as a markdown thread, each distillation a quoted marker."""
    parts = [f"# Run {run_id}\n"]
    for item in items:
        if isinstance(item, Marker):
            span = f"#{item.covered[0]}–#{item.covered[-1]}" if item.covered else "nothing"
            parts.append(
                f"> **Distillation #{item.seq}** ({item.mode}): evicted {span} ({len(item.covered)} messages), "
                f"{item.tokens_before} → {item.tokens_after} tokens. The agent worked from:\n>"
            )
            for block in item.worked_from:
                parts.append("\n".join(f"> {line}" if line else ">" for line in block.splitlines()))
            parts.append("")
            continue
        if item.evicted_by and not full:
            continue
        evicted = f" · evicted by #{', #'.join(map(str, item.evicted_by))}" if item.evicted_by else ""
        evicted += " · private" if item.private else ""
        calls = f" → {', '.join(item.tool_calls)}" if item.tool_calls else ""
        parts.append(f"**#{item.seq} {_who(item)}**{calls}{evicted}\n\n{item.text}\n")
    return "\n".join(parts).rstrip() + "\n"


def to_jsonl(items: Sequence[Line | Marker]) -> str:
    """The transcript as JSON lines, one message or distillation each."""
    return "".join(json.dumps(i.to_dict(), ensure_ascii=False) + "\n" for i in items)
