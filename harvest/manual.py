"""Memory written by hand: ``loomrt memory add SCOPE "statement"`` and the MCP tool
``add_memory``, as mem0's ``add`` (without inference: the statement is stored as written).

A statement written by hand goes through the same placement as an extracted one (it may
merge into a stored fact or supersede one: an operator's "the deploy window is 17:00 to
19:00" replaces the old window), is keyed by its scope and words (adding it twice stores
it once), and is marked ``author: operator`` (``user:NAME`` when an MCP client bound to user
NAME wrote it: that is not the operator's word), so a reader (the Recall tool's ``source:
"operator"``, a hit's ``author`` tag) tells it from what a run said. Its history records
who added it (``by``: ``cli``, ``mcp``, ``mcp:USER``). It holds no secret: one is refused,
never redacted into memory.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from loomrt.errors import SpecError
from loomrt.harvest.memory import CLASSES, Fact, MemoryStore, NewFact
from loomrt.harvest.redact import has_secret
from loomrt.harvest.scopes import ScopeError, parse_scope

__all__ = ["Added", "add_statement", "OPERATOR", "STATEMENT_MAX"]

OPERATOR = "operator"
"""The author of memory written by hand (a run's extraction: ``run``)."""
STATEMENT_MAX = 400
"""The longest statement (as an extracted one)."""


@dataclass(frozen=True)
class Added:
    """What adding a statement did: ``new``, ``merged`` (into a stored fact), ``superseded``
    (a stored fact it replaces), or ``already`` (this scope holds these words); and the fact
    that now holds it."""

    outcome: str
    fact: Fact

    def to_dict(self) -> dict[str, object]:
        return {"outcome": self.outcome, **self.fact.to_dict()}


def add_statement(
    memory: MemoryStore,
    scope: str,
    statement: str,
    *,
    cls: str = "fact",
    subject: str = "",
    by: str = "cli",
    author: str = OPERATOR,
) -> Added:
    """Store ``statement`` in ``scope`` as ``author`` wrote it (the operator, or ``user:NAME``
    for a client bound to a user, whose words Recall's ``source: "operator"`` never reads);
    :class:`SpecError` saying what is wrong with the input (the scope, the statement's
    length, its class, a secret)."""
    try:
        scope = parse_scope(str(scope))
    except ScopeError as exc:
        raise SpecError(str(exc)) from None
    text = " ".join(str(statement).split())
    if not 8 <= len(text) <= STATEMENT_MAX:
        raise SpecError(
            f"a memory statement has 8 to {STATEMENT_MAX} characters, not {len(text)}: "
            'write one self-contained sentence (e.g. "Alice\'s deploy window is 14:00 to 16:00 UTC.")'
        )
    if cls not in CLASSES:
        raise SpecError(f"unknown memory class {cls!r}: expected one of {', '.join(CLASSES)}")
    subject = " ".join(str(subject).split())[:120]
    if has_secret(text) or has_secret(subject):
        raise SpecError("the statement holds a secret (a key, token or password): durable memory never keeps one")
    key = f"{author}:{scope}:{hashlib.sha256(text.casefold().encode()).hexdigest()[:16]}"
    source = {"author": author, "by": by}
    counts = memory.write(
        [NewFact(text, cls, subject, scope, key, sources=[source], author=author)],
    )
    outcome = next(k for k, v in counts.items() if v)
    (fact_id,) = [r[0] for r in memory.db.rows("SELECT fact_id FROM memory_keys WHERE key = ?", (key,))]
    return Added(outcome, memory.get(fact_id))
