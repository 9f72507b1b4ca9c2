"""The words a fact came from: its source lines kept verbatim, the check that holds a fact
to them, and the line a reader is shown beside it.

A fact keeps the lines it was extracted from as they were banked (the words, who said them,
when, and where in the record), not only their seqs, so a reader can check the fact against
the words without the record. Its exact values (numbers, dates, times, paths, identifiers:
:func:`loomrt.exact.values`, the values fold's verified cards check) must each occur in those
lines, in the session date of a line, or in a relative time of a line resolved against that
date ("yesterday" in a line of 8 May 2023 supports "7 May 2023"); a fact with a value that
occurs in none is rejected as ``unverified`` (:func:`unsupported`), and counted.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from loomrt.exact import values
from loomrt.harvest.dates import absolute_dates, day_text

__all__ = ["SourceLine", "stored_line", "support_text", "unsupported", "best_line", "said_of"]

_WORD = re.compile(r"[a-z0-9]{3,}")
_STOP = frozenset(
    "the and for was were with that this have has had from are but not his her their they she him "
    "who what when where which will would about into over after before also just very".split()
)


class SourceLine(Protocol):
    """A line as the extractor saw it (:class:`~loomrt.harvest.extract.Line`)."""

    @property
    def said(self) -> str: ...
    @property
    def ts(self) -> float | None: ...
    @property
    def speaker(self) -> str | None: ...
    @property
    def role(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def seq(self) -> int | None: ...


def stored_line(line: SourceLine) -> dict[str, Any]:
    """A source line as a fact keeps it: run id, seq, role, speaker, time said, the words."""
    return {
        "run_id": line.run_id,
        "seq": line.seq,
        "role": line.role,
        "speaker": line.speaker,
        "ts": line.ts,
        "text": line.said,
    }


def _dates(ts: float | None) -> list[str]:
    """The date of ``ts`` as a statement may write it: ``8 May 2023``, ``May 8, 2023``, ``2023-05-08``."""
    if ts is None:
        return []
    d = _dt.datetime.fromtimestamp(ts, tz=_dt.UTC)
    return [day_text(d), f"{d:%B} {d.day}, {d.year}", f"{d:%Y-%m-%d}"]


def support_text(lines: Sequence[Mapping[str, Any]]) -> str:
    """What a fact from ``lines`` may state exact values from: each line's words and speaker,
    its session date, and its relative times resolved against that date."""
    out: list[str] = []
    for line in lines:
        text, ts = str(line.get("text") or ""), line.get("ts")
        out += [text, str(line.get("speaker") or ""), *_dates(ts)]
        resolved = absolute_dates(text, ts)
        if resolved != text:
            out.append(resolved)
            for m in re.finditer(r"\b(\d{1,2}) (\w+) (\d{4})\b", resolved):  # its ISO form too
                try:
                    day = _dt.datetime.strptime(m.group(0), "%d %B %Y").replace(tzinfo=_dt.UTC)
                except ValueError:
                    continue
                out += _dates(day.timestamp())
    return "\n".join(out)


def unsupported(statement: str, lines: Sequence[Mapping[str, Any]]) -> list[str]:
    """The exact values of ``statement`` that occur in none of ``lines`` (their words, dates
    or resolved relative times): empty when the fact holds to its words."""
    source = support_text(lines)
    return [v for v in dict.fromkeys(values(statement)) if v not in source]


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def best_line(statement: str, lines: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The shortest of ``lines`` that supports ``statement``: of the lines that hold the most
    of its exact values, those that share words with it, the shortest (None without lines)."""
    if not lines:
        return None
    wanted = list(dict.fromkeys(values(statement)))
    words = _words(statement)

    def covered(line: Mapping[str, Any]) -> int:
        source = support_text([line])
        return sum(v in source for v in wanted)

    most = max(covered(line) for line in lines)
    best = [line for line in lines if covered(line) == most]
    sharing = [line for line in best if words & _words(str(line.get("text") or ""))]
    return min(sharing or best, key=lambda line: len(str(line.get("text") or "")))


def said_of(statement: str, lines: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The line a memory hit shows beside its fact (:func:`best_line`), as a reader reads it:
    the words, who said them, the date (ISO), run id and seq."""
    line = best_line(statement, lines)
    if line is None:
        return None
    ts = line.get("ts")
    return {
        "text": line.get("text"),
        "speaker": line.get("speaker") or line.get("role"),
        "date": _dates(ts)[2] if ts is not None else None,
        "run_id": line.get("run_id"),
        "seq": line.get("seq"),
    }
