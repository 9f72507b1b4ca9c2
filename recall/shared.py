"""The recall indexes of this process that forks read instead of rebuilding them.

A fork shares its parent's history up to the fork point. Rebuilding that history into an
index of its own means reading and embedding every shared event: a cost that grows with the
parent's length and is paid again by every fork. Instead, a fork made in the process that
holds an index of its parent's history reads that index, filtered at query time to what the
parent's distillations up to the fork point evicted (entries are added in the order of their
distillations, so that is always the oldest part: :meth:`RecallIndex.count_until`).

An index is offered here by the :class:`~loomrt.recall.run_recall.RunRecall` that owns it:
a run's own (live, or rebuilt when the run was opened), and a fork that had to rebuild its
shared history offers that history for the next fork of the same parent. The last
:data:`KEEP` are kept per thread (an index is not thread-safe), each tied to the store it
was read from: a run id means nothing in another store.

What a fork may see is still decided per hit by its own visibility (a parent's private
messages come back as placeholders), as for hits from its own index.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loomrt.recall.run_recall import RunRecall

__all__ = ["KEEP", "offer", "family_sources", "forget"]

KEEP = 8
"""Indexes kept per thread, newest used last out."""

_lock = threading.Lock()
_held: OrderedDict[tuple[int, str], tuple[weakref.ref[object], RunRecall, int | None]] = OrderedDict()


def offer(store: object, run_id: str, holder: RunRecall, known: int | None = None) -> None:
    """Offer ``holder``'s index as the evicted history of ``run_id`` in ``store``: all of it
    (``known`` None: the holder is that run's own recall, and every later distillation of
    the run in this process reaches it), or up to the distillation at seq ``known`` (a fork's
    rebuilt copy of its parent's history up to the fork point). A run's own offer is not
    displaced by a copy."""
    key = (threading.get_ident(), run_id)
    with _lock:
        current = _held.get(key)
        if current is not None and known is not None and current[2] is None and current[0]() is store:
            return
        _held[key] = (weakref.ref(store), holder, known)
        _held.move_to_end(key)
        mine = [k for k in _held if k[0] == key[0]]
        for old in mine[: max(0, len(mine) - KEEP)]:
            del _held[old]


def forget(run_id: str | None = None) -> None:
    """Drop what is held for ``run_id`` in this thread (every run: None)."""
    me = threading.get_ident()
    with _lock:
        for key in [k for k in _held if k[0] == me and (run_id is None or k[1] == run_id)]:
            del _held[key]


def family_sources(
    store: object,
    links: Sequence[tuple[str, int]],
    distilled_between: Callable[[str, int, int], bool],
    compatible: Callable[[RunRecall], bool],
) -> list[tuple[RunRecall, int]] | None:
    """The indexes a fork whose family is ``links`` (``(run_id, fork seq)``, nearest first)
    reads its shared history from, each with the last distillation seq it may read, or None
    when this process holds none it can use (the fork rebuilds it).

    The nearest ancestor's holder serves if it is ``compatible`` (the same embedder and
    settings) and it knows every distillation of that ancestor up to the fork point:
    ``distilled_between(run_id, after, until)`` asks the record whether there was one past
    what the holder knows. A holder that is itself a fork reading shared indexes passes
    its own sources on, each already limited to its fork point."""
    run_id, until = links[0]
    key = (threading.get_ident(), run_id)
    with _lock:
        held = _held.get(key)
        if held is not None:
            _held.move_to_end(key)
    if held is None:
        return None
    ref, holder, known = held
    if ref() is not store or not compatible(holder):
        return None
    known = holder.last_distillation if known is None else known
    if until > known and distilled_between(run_id, known, until):
        return None
    return [(holder, min(until, known)), *holder.family]
