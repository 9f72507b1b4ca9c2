"""Proving a run's history: every check ``loomrt runs verify`` makes, in one place.

- **the chain** (:func:`loomrt.record.ledger.verify_chain`): seqs dense, each hash over its
  content and its predecessor; keyed (v2) runs under the deployment's ledger key, which
  also covers the run's row;
- **the head anchor** (``run_heads``): the chain ends where the store last moved the run's
  head, so a cut tail, or events written around the store, show;
- **the grammar** (:mod:`loomrt.record.grammar`): the events read as a run the runtime played;
- **the cards**: every card a distillation wrote is served by the card index as written;
- **external anchors** (:func:`anchors`): heads written to a file earlier still hold;
- **the prompts** (:func:`loomrt.audit.prompt_problems`): every turn's prompt is the one the
  record derives.

What each check can and cannot detect, by the access an attacker has, is docs/reliability.md's
threat model.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loomrt.audit import prompt_problems
from loomrt.events import Event, RunInfo
from loomrt.record.grammar import grammar_problems
from loomrt.record.ledger import canonical, genesis, verify_chain
from loomrt.record.store import Store

__all__ = ["Verdict", "verify_run", "check_record", "anchors", "ANCHOR_FORMAT"]

ANCHOR_FORMAT = "loomrt-anchors/1"


@dataclass
class Verdict:
    """What ``runs verify`` found for one run."""

    run_id: str
    events: int
    chain: str
    prompts_checked: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the run's record cannot prove (an unkeyed chain), short of a problem."""

    @property
    def clean(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "events": self.events,
            "chain": self.chain,
            "prompts_checked": self.prompts_checked,
            "clean": self.clean,
            "problems": self.problems,
            "notes": self.notes,
        }


def _shared(store: Store, info: RunInfo) -> list[Event]:
    """A fork's history up to its fork point (a fork of a fork: all of it), oldest first."""
    out: list[Event] = []
    while info.forked_from and info.fork_seq is not None:
        parent = store.get_run(info.forked_from)
        out = store.events(parent.run_id, until=info.fork_seq) + out
        info = parent
    return out


def _head_problems(head: tuple[int, str | None, int] | None, events: list[Event]) -> list[str]:
    if head is None:
        return ["no head anchor for the run: its row in run_heads is gone (or it was written around the store)"] * bool(
            events
        )
    seq, hash_, _ = head
    last = events[-1] if events else None
    if last is None or last.seq < seq:
        return [f"the record ends at #{last.seq if last else 0}, but its head anchor says #{seq}: events were cut"]
    if last.seq > seq:
        return [f"events #{seq + 1}-#{last.seq} lie past the head anchor (#{seq}): written around the store"]
    if last.hash != hash_:
        return [f"the last event #{seq} does not hash as its head anchor says: it was rewritten"]
    return []


def _card_problems(events: Iterable[Event], served: dict[str, dict[str, Any]]) -> list[str]:
    written = _cards_written(events)
    problems = []
    for card_id, (seq, card) in written.items():
        if card_id not in served:
            problems.append(f"card {card_id} (written by #{seq}) is missing from the card index")
        elif canonical(served[card_id]) != canonical(card):
            problems.append(
                f"card {card_id} in the card index differs from the one #{seq} wrote: forks are served a forgery"
            )
    return problems


def _cards_written(events: Iterable[Event]) -> dict[str, tuple[int, dict[str, Any]]]:
    """Each card the run's distillations wrote, by id, with the seq that wrote it first."""
    written: dict[str, tuple[int, dict[str, Any]]] = {}
    for e in events:
        for card in e.data.get("cards") or () if e.kind == "distillation" else ():
            if isinstance(card, dict) and card.get("id"):
                written.setdefault(str(card["id"]), (e.seq, card))
    return written


def _anchor_problems(anchored: dict[str, Any] | None, run_id: str, events: list[Event]) -> list[str]:
    mark = (anchored or {}).get("runs", {}).get(run_id)
    if not mark:
        return []
    when = anchored.get("anchored_at", "?") if anchored else "?"
    at = next((e for e in events if e.seq == int(mark["seq"])), None)
    if at is None:
        return [f"the anchor of {when} holds #{mark['seq']}, which the record no longer has"]
    if at.hash != mark["hash"]:
        return [f"#{at.seq} differs from the anchor of {when}: the history before it was rewritten"]
    return []


def check_record(
    info: RunInfo,
    events: list[Event],
    *,
    head: tuple[int, str | None, int] | None,
    key: bytes | None,
    shared: Iterable[Event] = (),
    served: dict[str, dict[str, Any]] | None = None,
    anchored: dict[str, Any] | None = None,
    require_keyed: bool = False,
) -> Verdict:
    """Every check but the prompts' on a run's record as read (:func:`verify_run` reads it):
    ``head`` its head anchor, ``key`` the ledger key, ``shared`` a fork's history, ``served``
    the card index's copies of the cards its distillations wrote, ``anchored`` an anchors file."""
    chain = info.chain or "v1"
    start = genesis(info, key) if chain == "v2" and key is not None else ""
    verdict = Verdict(info.run_id, len(events), chain)
    verdict.problems += verify_chain(events, scheme=chain, key=key, start=start)
    verdict.problems += _head_problems(head, events)
    verdict.problems += grammar_problems(events, shared)
    verdict.problems += _card_problems(events, served or {}) if served is not None else []
    verdict.problems += _anchor_problems(anchored, info.run_id, events)
    if chain == "v1":
        unkeyed = "the chain is unkeyed (v1): anyone who can write the database could re-chain an edit"
        (verdict.problems if require_keyed else verdict.notes).append(unkeyed)
    verdict.prompts_checked = sum(
        1 for e in events if e.kind == "model_call" and e.data.get("prompt_from") == "context"
    )
    return verdict


def verify_run(
    store: Store,
    run_id: str,
    *,
    anchored: dict[str, Any] | None = None,
    require_keyed: bool = False,
    prompts: bool = True,
) -> Verdict:
    """Every check on run ``run_id`` (:func:`check_record`; then, on a record that holds,
    every turn's prompt re-derived). ``anchored``: an anchors file's content (:func:`anchors`);
    ``require_keyed``: an unkeyed (v1) chain is a problem, not a note."""
    info = store.get_run(run_id)
    events = store.events(run_id)
    verdict = check_record(
        info,
        events,
        head=store.head(run_id),
        key=store.ledger_key,
        shared=_shared(store, info),
        served=store.cards(_cards_written(events)),
        anchored=anchored,
        require_keyed=require_keyed,
    )
    if prompts and verdict.clean:
        try:
            verdict.problems += prompt_problems(events, store)
        except Exception as exc:  # noqa: BLE001 - a record the projection cannot replay is a finding, not a crash
            verdict.problems.append(
                f"the record cannot be replayed to re-derive its prompts: {type(exc).__name__}: {exc}"
            )
    return verdict


def anchors(store: Store, run_ids: Iterable[str] | None = None) -> dict[str, Any]:
    """The heads of the chosen runs (default: every run), with the time: kept outside the
    database (another machine, a signed commit, a notary), they let ``runs verify
    --anchors`` prove that nothing anchored was rewritten since, even by a writer with the key."""
    ids = list(run_ids) if run_ids is not None else [r.run_id for r in store.list_runs(limit=2**31)]
    runs: dict[str, Any] = {}
    for run_id in ids:
        info = store.get_run(run_id)
        last = store.events(run_id, after=max(0, info.last_seq - 1))
        if last:
            runs[run_id] = {"seq": last[-1].seq, "hash": last[-1].hash, "chain": info.chain or "v1"}
    now = time.time()
    return {
        "format": ANCHOR_FORMAT,
        "anchored_at": dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="seconds"),
        "ts": now,
        "runs": runs,
    }
