"""Projection checkpoints: how "what the model saw" at any call of a long run replays a few
events, not the whole record.

A model call's prompt is the working context the record projects up to the call
(:func:`loomrt.audit.prompt_of`). Replaying a 10,000-event record for each call costs the
whole record each time; the server instead keeps, per run, copies of its
:class:`~loomrt.run.projection.RunView` every :data:`CHECKPOINT_EVERY` events, taken during
the one replay it has to do anyway, and extends that replay as the record grows (a record
only grows, so a view of its first ``n`` events stays true). Any call's prompt is then the
nearest checkpoint before it plus at most :data:`CHECKPOINT_EVERY` events.

The events replayed are the reader's (redacted unless ``--include-private``), and redaction
is judged on the whole record: a later ``mark_private`` can change how an earlier event
reads. So each run's checkpoints are kept with the judgement they were taken under, and
only those its new judgement leaves as they were survive it (:func:`unchanged_until`).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loomrt.events import Event, RunInfo
from loomrt.visibility import PrivateRecord

if TYPE_CHECKING:
    from loomrt.record.store import Store
    from loomrt.run.projection import RunView

__all__ = ["Views", "snapshot", "unchanged_until", "CHECKPOINT_EVERY", "RUNS_KEPT"]

CHECKPOINT_EVERY = 250
"""Events between two checkpoints of a run's view: the most a prompt replays on a warm server."""
RUNS_KEPT = 16
"""Runs whose checkpoints the server keeps (the least recently asked for go first)."""

_SHARED = ("mode", "family")
"""Fields of a view a copy shares: the retention mode (no state of its own: that is the slot)
and a fork's family (the store's shared history, read, never written)."""
_ATOMS = (type(None), bool, int, float, str, tuple, frozenset)
EVER = 2**62


def snapshot(view: RunView) -> RunView:
    """A copy of ``view`` that applying events to either leaves the other as it was, at the
    cost of its containers, not of their messages: messages, pins, cards and usage are frozen
    values shared by both; lists, dicts and sets are copied; the mode's slot (Σ, a fold's queue:
    small) is deep-copied. A field of a kind this does not know is refused (``TypeError``), so a
    new mutable field of :class:`RunView` cannot be shared by mistake."""
    copied: RunView = _copied(view, top=True)
    return copied


def _copied(obj: Any, top: bool = False) -> Any:
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if top and f.name in _SHARED:
            continue
        if top and f.name == "slot":
            changes[f.name] = copy.deepcopy(value)
        elif isinstance(value, (list, dict, set)):
            changes[f.name] = type(value)(value)
        elif isinstance(value, _ATOMS) or _frozen(value):
            continue
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes[f.name] = _copied(value)  # the taint: its dicts copied
        else:
            raise TypeError(
                f"snapshot: {type(obj).__name__}.{f.name} is a {type(value).__name__}, which it cannot copy"
            )
    out = copy.copy(obj)  # not dataclasses.replace: no __post_init__ again
    for name, value in changes.items():
        setattr(out, name, value)
    return out


def _frozen(value: Any) -> bool:
    params = getattr(type(value), "__dataclass_params__", None)
    return bool(params is not None and params.frozen)


def unchanged_until(old: PrivateRecord | None, new: PrivateRecord | None) -> int:
    """The last seq up to which the record's events read the same under judgement ``new`` as
    under ``old`` (:func:`loomrt.visibility.redact_events`): every seq when both are the same
    or neither redacts (``--include-private``); none (0) when the private messages or calls
    changed; when Σ's private keys gained updates after ``old``'s last one at seq ``L``, up to
    ``L - 1`` (the events from ``L`` on read the keys of the update after them)."""
    if old is None or new is None:
        return EVER if old is new else 0
    if old.seqs != new.seqs or old.calls != new.calls:
        return 0
    if new.outputs[: len(old.outputs)] != old.outputs or new.keys[: len(old.keys)] != old.keys:
        return 0
    if len(new.keys) == len(old.keys):
        return EVER
    return old.keys[-1][0] - 1 if old.keys else 0


@dataclass
class _Replay:
    private: PrivateRecord | None
    checkpoints: list[RunView]
    """Copies of the view, oldest first: after the first event, then every CHECKPOINT_EVERY."""
    view: RunView
    """The furthest the record has been replayed (extended in place)."""


Read = Callable[[int, int], list[Event]]
"""``read(after, until)``: the run's events ``after < seq <= until``, as the reader gets them."""


class Views:
    """Each run's checkpoints (per redaction: with or without private material), for a server's
    life: every ``every`` events (default :data:`CHECKPOINT_EVERY`), for the ``size`` runs last
    asked for (default :data:`RUNS_KEPT`)."""

    def __init__(self, every: int | None = None, size: int | None = None):
        self.every = every or CHECKPOINT_EVERY
        self.size = RUNS_KEPT if size is None else size
        self.replayed = 0
        """Events applied to a view so far, every run's (the ui measure counts them)."""
        self.runs: dict[tuple[str, bool], _Replay] = {}
        self.lock = threading.Lock()  # the pages run in a thread pool

    def before(self, store: Store, info: RunInfo, seq: int, private: PrivateRecord | None, read: Read) -> RunView:
        """A copy of run ``info``'s view after its events before ``seq`` (what a model call at
        ``seq`` was sent), ``private`` the reader's judgement (None: nothing redacted)."""
        with self.lock:
            r = self._replay(store, info, private, read)
            target = seq - 1
            if target >= r.view.last_seq:
                self._extend(r, r.view, target, read)
                return snapshot(r.view)
            base = [c for c in r.checkpoints if c.last_seq <= target]
            if not base:
                raise ValueError(f"#{seq} is not after the first event of run {info.run_id}'s own record")
            view = snapshot(base[-1])
            self._extend(None, view, target, read)
            return view

    def _replay(self, store: Store, info: RunInfo, private: PrivateRecord | None, read: Read) -> _Replay:
        from loomrt.run.projection import project

        key = (info.run_id, private is None)
        r = self.runs.pop(key, None)
        if r is not None:
            kept = unchanged_until(r.private, private)
            r.checkpoints = [c for c in r.checkpoints if c.last_seq <= kept]
            if not r.checkpoints:
                r = None
            elif r.view.last_seq > kept:
                r.view = snapshot(r.checkpoints[-1])
        if r is None:
            start = info.fork_seq or 0  # a fork's own record follows its fork point
            first = read(start, start + 1)
            view = project(first, store=store)
            self.replayed += len(first)
            r = _Replay(private, [snapshot(view)], view)
        r.private = private
        self.runs[key] = r  # the newest asked for last
        while len(self.runs) > self.size:
            self.runs.pop(next(iter(self.runs)))
        return r

    def _extend(self, r: _Replay | None, view: RunView, target: int, read: Read) -> None:
        """Apply the events after ``view``'s up to ``target``; with ``r``, checkpointing as it goes."""
        if target <= view.last_seq:
            return
        for e in read(view.last_seq, target):
            view.apply(e)
            self.replayed += 1
            if r is not None and view.last_seq - r.checkpoints[-1].last_seq >= self.every:
                r.checkpoints.append(snapshot(view))
