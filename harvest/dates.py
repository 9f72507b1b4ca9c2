"""Relative times made absolute against the date of the line that says them.

"Yesterday" in a line of 8 May 2023 is 7 May 2023; "last Tuesday" is the Tuesday before
it. A fact is read long after the conversation, when "yesterday" means nothing, so
statements are rewritten with dates (:func:`absolute_dates`), and the same resolution of a
fact's source lines is what its dates are checked against (:mod:`loomrt.harvest.evidence`).
"""

from __future__ import annotations

import datetime as _dt
import re

__all__ = ["absolute_dates", "day_text"]

_RELATIVE = {
    "yesterday": -1,
    "today": 0,
    "tonight": 0,
    "this morning": 0,
    "this evening": 0,
    "tomorrow": 1,
}
_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_RELATIVE_RE = re.compile(
    r"\b(yesterday|today|tonight|this morning|this evening|tomorrow|last (week|month|year|weekend)|"
    r"next (week|month|year|weekend)|this (week|month|year)|(last|next) (" + "|".join(_DAYS) + r"))\b",
    re.I,
)


def day_text(d: _dt.date | _dt.datetime) -> str:
    """A date as statements write it: ``7 May 2023``."""
    return f"{d.day} {d:%B %Y}"


def absolute_dates(statement: str, ts: float | None) -> str:
    """``statement`` with relative dates ("yesterday", "last year", "last Tuesday", ...) made
    absolute against ``ts``, the time of the line it came from."""
    if ts is None:
        return statement
    when = _dt.datetime.fromtimestamp(ts, tz=_dt.UTC)

    def sub(m: re.Match[str]) -> str:
        word = m.group(0).lower()
        if word in _RELATIVE:
            return "on " + day_text(when + _dt.timedelta(days=_RELATIVE[word]))
        which, unit = word.split()
        if unit in _DAYS:  # the nearest such day before (last) or after (next) the line's date
            gap = (when.weekday() - _DAYS.index(unit)) % 7 or 7
            return "on " + day_text(when + _dt.timedelta(days=-gap if which == "last" else (7 - gap) or 7))
        step = {"last": -1, "next": 1, "this": 0}[which]
        if unit == "year":
            return f"in {when.year + step}"
        if unit == "month":
            month = (when.month - 1 + step) % 12 + 1
            year = when.year + (when.month - 1 + step) // 12
            return "in " + _dt.date(year, month, 1).strftime("%B %Y")
        label = "weekend" if unit == "weekend" else "week"
        return f"in the {label} of {day_text(when + _dt.timedelta(weeks=step))}"

    out = _RELATIVE_RE.sub(sub, statement)
    return re.sub(r"\b(on|in) (on|in) ", r"\2 ", out)
