"""Scopes: whose durable memory a fact is, and who may read or write it.

A scope is a kind (``user``, ``agent``, ``project``) and an identity, written
``kind:identity`` (``user:alice``, ``agent:historian``, ``project:shop``). An agent is
granted kinds in ``context.memory_scopes``; a run resolves them to keys from the run's user
(``--user`` / ``LOOMRT_USER``), the agent's name and the agents file's ``project:``. Every
read and write checks the key against the run's grant (:func:`check`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from loomrt.errors import LoomError

__all__ = ["KINDS", "ScopeError", "resolve_scopes", "check", "parse_scope"]

KINDS = ("user", "agent", "project")

_IDENTITY = re.compile(r"^[\w.@+-]{1,200}$")


class ScopeError(LoomError):
    """A scope that is not granted, or cannot be resolved (no user identity, no project)."""


def resolve_scopes(kinds: Sequence[str], *, agent: str, user: str | None, project: str | None) -> list[str]:
    """The scope keys of ``kinds`` for one run, in order; :class:`ScopeError` saying which
    identity is missing and how to give it."""
    out = []
    for kind in kinds:
        identity = {"user": user, "agent": agent, "project": project}.get(kind)
        if kind not in KINDS:
            raise ScopeError(f"unknown memory scope {kind!r}: expected one of {', '.join(KINDS)}")
        if not identity:
            how = {
                "user": "pass --user NAME or set LOOMRT_USER",
                "project": "set project: at the top of the agents file",
                "agent": "give the agent a name",
            }[kind]
            raise ScopeError(f"memory scope {kind!r} has no identity for this run: {how}")
        if not _IDENTITY.match(identity):
            raise ScopeError(
                f"memory scope {kind}:{identity!r} is not a valid identity "
                "(letters, digits and . _ @ + - only, at most 200)"
            )
        out.append(f"{kind}:{identity}")
    return out


def parse_scope(text: str) -> str:
    """``user:alice`` as typed on the command line, checked; :class:`ScopeError` otherwise."""
    kind, sep, identity = text.partition(":")
    if not sep or kind not in KINDS or not _IDENTITY.match(identity):
        raise ScopeError(
            f"scope {text!r}: expected KIND:IDENTITY with KIND one of {', '.join(KINDS)} (e.g. user:alice)"
        )
    return text


def check(wanted: Iterable[str], granted: Iterable[str], *, action: str) -> list[str]:
    """``wanted`` if every key is in ``granted``; :class:`ScopeError` naming the first that is not."""
    allowed = set(granted)
    out = list(wanted)
    for key in out:
        if key not in allowed:
            raise ScopeError(
                f"this agent may not {action} memory scope {key!r} (granted: {', '.join(sorted(allowed)) or 'none'})"
            )
    return out
