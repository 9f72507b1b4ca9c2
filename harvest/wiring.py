"""How a run gets its harvest bank and its durable memory (called by
:func:`loomrt.toolset.resolve_toolset`, the one place a run's toolset is resolved).

Misconfiguration is loud, once per run: harvest on with no ``memory_scopes``, a scope with
no identity (``user`` and no ``--user``), or a store without a place for durable memory (an
in-memory record) is
a ``harvest_error`` event (recorded once; ``loomrt agents validate`` warns of the first
two). The run goes on without the part that cannot work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loomrt.events import Event
from loomrt.harvest.backends import memory_of
from loomrt.harvest.bank import Bank
from loomrt.harvest.db import Where, harvest_db, has_place, where_of
from loomrt.harvest.memory import MemoryStore, ScopedMemory
from loomrt.harvest.scopes import ScopeError, resolve_scopes
from loomrt.recall.embedders import EmbedderChoice

if TYPE_CHECKING:
    from loomrt.record.store import Store
    from loomrt.spec import ContextSpec

__all__ = ["HarvestWiring", "wire", "memory_store", "release", "config_problems", "erase_private"]


@dataclass
class HarvestWiring:
    """What a run gets: the bank (an evicted-span callback) and the memory Recall reads."""

    bank: Bank | None = None
    memory: Any = None
    scopes: Sequence[str] = ()
    """The run's granted scope keys (``user:alice``, ...), in ``memory_scopes`` order."""


_stores: dict[tuple[str, str], MemoryStore] = {}
_stores_lock = threading.Lock()


def memory_store(where: Where, embedder: EmbedderChoice = None) -> MemoryStore:
    """The process's durable memory beside a record (``where``: the store, its SQLite file or
    its PostgreSQL URL), one per embedder."""
    key = (where_of(where), repr(embedder) if embedder is not None and not isinstance(embedder, str) else str(embedder))
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = memory_of(harvest_db(where), embedder)
        return store


def erase_private(store: Store, run_id: str, seqs: Sequence[int] | None = None) -> dict[str, int]:
    """Messages ``seqs`` of run ``run_id`` are private (None: every message of the run private
    now, an operator's mark or the runtime's): their words leave the durable memory beside
    ``store`` (:meth:`MemoryStore.erase_said`; none where memory has no place, an in-memory
    record). A batch consolidated later leaves them out by itself."""
    if not has_place(store):
        return {"passages": 0, "facts": 0, "lines": 0}
    if seqs is None:
        from loomrt.visibility import private_record

        seqs = sorted(private_record(store, run_id).seqs)
    return memory_store(store).erase_said(run_id, seqs, by="operator")


def release(where: Where) -> None:
    """Close the process's durable memory beside a record (it is going away)."""
    from loomrt.harvest import db

    resolved = where_of(where)
    with _stores_lock:
        for key in [k for k in _stores if k[0] == resolved]:
            del _stores[key]
    db.release(where)


def config_problems(context: ContextSpec) -> list[str]:
    """What is wrong with an agent's harvest configuration, knowable from the definition alone."""
    problems = []
    if context.harvest_to_memory and not context.memory_scopes:
        problems.append(
            "context.harvest_to_memory is on but context.memory_scopes is empty: nothing can be banked "
            "(add memory_scopes: [user], [agent] or [project]; the first is where facts go)"
        )
    if context.memory_scopes and not context.recall:
        problems.append(
            "context.memory_scopes is set but context.recall is off: this agent never reads its durable "
            "memory (Recall is how it does; set recall: true)"
        )
    return problems


def _said(history: Sequence[Event] | None) -> set[str]:
    return {e.data.get("message", "") for e in history or () if e.kind == "harvest_error"}


def wire(
    spec: Any,
    *,
    run_id: str,
    agent: str,
    store: Any,
    user: str | None,
    project: str | None,
    emit: Callable[[str, dict[str, Any]], Any],
    private: Callable[[], set[int]],
    def_hash: str,
    history: Sequence[Event] | None = None,
    memory: Any = None,
    embedder: EmbedderChoice = None,
) -> HarvestWiring:
    """The bank and memory of run ``run_id``; each problem is a ``harvest_error`` event, once."""
    context = spec.context
    said = _said(history)

    def loud(message: str) -> None:
        if message not in said:
            said.add(message)
            emit("harvest_error", {"message": message})

    out = HarvestWiring()
    if context.harvest_to_memory and not context.memory_scopes:
        loud(config_problems(context)[0])
    if not context.memory_scopes:
        return out
    try:
        out.scopes = resolve_scopes(context.memory_scopes, agent=agent, user=user, project=project)
    except ScopeError as exc:
        loud(f"durable memory is off for this run: {exc}")
        return out
    has_file = has_place(store)
    no_file = (
        "durable memory is off for this run: its store has no file to keep memory in (an in-memory "
        "record); use a file store (LOOMRT_HOME or LOOMRT_DB_URL=sqlite:PATH) or PostgreSQL"
    )
    try:
        if memory is not None and not isinstance(memory, MemoryStore):
            out.memory = memory  # the caller's own MemorySource, read with this run's scope keys
        elif memory is not None or has_file:
            out.memory = ScopedMemory(memory or memory_store(store, embedder), out.scopes, context.memory_scopes)
        if context.harvest_to_memory:
            if not has_file:
                loud(no_file)
            else:
                out.bank = Bank(
                    harvest_db(store),
                    run_id=run_id,
                    agent=agent,
                    def_hash=def_hash,
                    scope=out.scopes[0],
                    max_tokens=context.harvest_max_tokens,
                    private=private,
                    record=emit,
                )
        elif out.memory is None:
            loud(no_file)
    except Exception as exc:  # noqa: BLE001 - durable memory is optional: the run goes on without it
        loud(f"durable memory is off for this run: {type(exc).__name__}: {exc}")
        out.memory = out.bank = None
    return out
