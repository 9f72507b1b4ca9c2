"""Exact values: the numbers, dates, times, paths, identifiers and quoted strings a text
states, each of which must occur character for character in the words it came from.

A summary that writes "port 5433" for a transcript that said 5432 is worse than none: the
model trusts it. Two checks read values through this one module: fold's verified cards
(:mod:`loomrt.run.reducers.fold.verify`) and harvest's verified facts
(:mod:`loomrt.harvest.evidence`). ``[#seq]`` pointers are not values.
"""

from __future__ import annotations

import re

__all__ = ["values", "invented"]

_POINTER = re.compile(r"\[#\d+\]")
_VALUE = re.compile(
    r'"([^"\n]{1,200})"'  # a double-quoted string
    r"|`([^`\n]{1,200})`"  # a code span
    r"|((?:[\w.~-]*/)+[\w.-]+)"  # a path
    r"|(\b\d[\d.,:/-]*\d\b|\b\d\b)"  # a number, a date, a time, a version
    r"|(\b[A-Za-z]+[_-]?\d[\w-]*\b|\b\w+_\w+\b)"  # an identifier with digits or underscores
)


def values(text: str) -> list[str]:
    """The exact values ``text`` states (quoted strings, paths, numbers, identifiers), in order."""
    out: list[str] = []
    for m in _VALUE.finditer(_POINTER.sub(" ", text)):
        value = next(g for g in m.groups() if g is not None).strip().rstrip(".,:;")
        if value:
            out.append(value)
    return out


def invented(card: str, source: str) -> tuple[int, list[str]]:
    """How many values ``card`` states, and those that do not occur verbatim in ``source``."""
    found = values(card)
    return len(found), [v for v in dict.fromkeys(found) if v not in source]
