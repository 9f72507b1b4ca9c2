"""Harvest: evicted spans become durable facts, through a batched consolidator.

With ``context.harvest_to_memory: true`` each evicted span is banked on a durable queue
(:class:`Bank`, an evicted-span callback beside the recall index); ``loomrt consolidate``
(:class:`Consolidator`) turns batches of spans into facts in durable memory
(:class:`MemoryStore`), beside the spans' lines kept verbatim as passages
(:mod:`loomrt.harvest.passages`), which Recall searches in later runs through the scopes an
agent is granted (:class:`ScopedMemory`). Wired in at the top, by :func:`loomrt.toolset.resolve_toolset`;
``recall/`` and ``run/`` never import it. See docs/memory.md.
"""

from loomrt.harvest.bank import Bank
from loomrt.harvest.consolidator import Consolidator, PassReport
from loomrt.harvest.memory import Fact, MemoryStore, NewFact, ScopedMemory
from loomrt.harvest.scopes import ScopeError, resolve_scopes
from loomrt.harvest.wiring import memory_store

__all__ = [
    "Bank",
    "Consolidator",
    "PassReport",
    "MemoryStore",
    "ScopedMemory",
    "Fact",
    "NewFact",
    "ScopeError",
    "resolve_scopes",
    "memory_store",
]
