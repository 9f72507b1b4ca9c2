"""A fork's shared history: the runs it was forked from, each up to its fork point.

``loomrt runs fork RUN_ID --at SEQ`` makes a run whose record says ``forked_from {run_id,
seq}`` and whose own seqs continue after SEQ, so a ``[#seq]`` pointer means the same
message in the fork and in its parent up to the fork point. Nothing is copied: the fork
reads its parent's record (and its grandparent's, for a fork of a fork) through a
:class:`Family`, and cards by id from the store's card index. What a fork may read by a
card id the model names is its catalog lineage (:meth:`Family.lineage`), never the whole
index: card ids are content hashes printed everywhere, so knowing one is no grant.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loomrt.events import Event
from loomrt.record.store import Store
from loomrt.run.cards import Card

__all__ = ["Family"]


def _stretches(seqs: list[int], gap: int = 8) -> list[tuple[int, int]]:
    """Sorted ``seqs`` as ``(first, last)`` stretches, split where two are over ``gap`` apart."""
    out: list[tuple[int, int]] = []
    for s in seqs:
        if out and s - out[-1][1] <= gap:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


@dataclass(frozen=True)
class Family:
    """The ancestors of a fork: ``(run_id, last shared seq)``, nearest first."""

    store: Store
    links: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, store: Store, forked_from: dict[str, Any] | None) -> Family | None:
        """The family of a run whose ``run_started`` says ``forked_from`` (None if it says nothing)."""
        links: list[tuple[str, int]] = []
        at = forked_from
        while at:
            links.append((str(at["run_id"]), int(at["seq"])))
            info = store.get_run(at["run_id"])
            at = {"run_id": info.forked_from, "seq": info.fork_seq} if info.forked_from else None
        return cls(store, tuple(links)) if links else None

    @property
    def fork_seq(self) -> int:
        return self.links[0][1]

    def _ranges(self) -> list[tuple[str, int, int]]:
        """``(run_id, after, until)`` for each ancestor, oldest first: the seqs it holds."""
        out = []
        for i, (run_id, until) in enumerate(self.links):
            after = self.links[i + 1][1] if i + 1 < len(self.links) else 0
            out.append((run_id, after, until))
        return out[::-1]

    def events(self, *, kinds: Iterable[str] | None = None) -> list[Event]:
        """Every shared event, oldest first (each ancestor's record up to its fork point)."""
        out: list[Event] = []
        for run_id, after, until in self._ranges():
            out.extend(self.store.events(run_id, after=after, until=until, kinds=kinds))
        return out

    def events_at(self, seqs: Iterable[int]) -> dict[int, Event]:
        """The shared events at ``seqs`` (those above the fork seq are not shared: left out)."""
        wanted = sorted(set(seqs))
        out: dict[int, Event] = {}
        for run_id, after, until in self._ranges():
            mine = [s for s in wanted if after < s <= until]
            for lo, hi in _stretches(mine):  # one read per stretch of nearby seqs, never the gaps between
                for e in self.store.events(run_id, after=lo - 1, until=hi):
                    if e.seq in mine:
                        out[e.seq] = e
        return out

    def cards(self, ids: Iterable[str]) -> dict[str, Card]:
        """Cards by id from the store's index, whoever wrote them: for ids the runtime itself
        took from the family's record (a fork's catalog, a card's children). An id a model
        names goes through :meth:`lineage` instead."""
        return {i: Card.from_dict(d) for i, d in self.store.cards(ids).items()}

    def lineage(self, own: Mapping[str, Card]) -> dict[str, Card]:
        """The cards a fork may read, given ``own`` (its catalog's cards and those it wrote):
        those, the cards each ancestor wrote or started from up to its fork point, and every
        card these roll up, by id. Not another run's cards, nor an ancestor's written after
        the fork point (a card straddling it summarises what the fork never saw)."""
        known: dict[str, Card] = dict(own)
        wanted: list[str] = []
        for e in self.events(kinds=["run_started", "distillation"]):
            for c in e.data.get("cards") or ():
                known.setdefault(str(c["id"]), Card.from_dict(c))
            wanted += [str(r["card"]) for r in e.data.get("catalog") or () if "card" in r]
        wanted += [child for c in known.values() for child in c.children]
        while wanted:
            missing = [i for i in dict.fromkeys(wanted) if i not in known]
            found = self.cards(missing)
            known.update(found)
            wanted = [child for c in found.values() for child in c.children]
        return known

    def private(self) -> set[int]:
        """The shared seqs that are private: results of private tools, and messages an
        operator (or the runtime: derived private) marked and no one declassified (a fold
        fork reads only its catalog's raw messages, so the rest of the shared history's
        private results are named here)."""
        out: set[int] = set()  # as loomrt.visibility.private_seqs reads a record (which imports this module)
        for e in self.events(kinds=["tool_result", "mark_private", "declassify"]):
            if e.kind == "tool_result":
                out |= {e.seq} if e.data.get("private") else set()
            elif int(e.data["seq"]) <= self.fork_seq:
                (out.add if e.kind == "mark_private" else out.discard)(int(e.data["seq"]))
        return out
