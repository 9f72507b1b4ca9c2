"""Named points where the crash harness kills the process, and a trace of the points reached.

``LOOMRT_CRASH_AT=POINT:N`` makes the process SIGKILL itself the N-th time it reaches
``POINT`` (a real kill: no cleanup, no flush, no ``finally``). ``LOOMRT_CRASH_TRACE=FILE``
appends the name of every point reached to FILE, one per line, so a harness can count how
often a run reaches each point before it chooses where to kill. With both set, N counts
from what FILE already holds: a scenario played by several processes in turn (a chat, then
a fork of it, then each input to the fork) is killed the N-th time any of them reaches
POINT, as the trace of an uninterrupted playing counted it. Both are read once per
process; unset, :func:`reached` costs one check of a module-level flag.

The points (:data:`POINTS`) sit where a crash is most likely to lose or duplicate
something: around every record write, inside a distillation and between it and its
callbacks, inside a tool call, inside recall indexing. Later capabilities add theirs here
(and to :mod:`loomrt.bench.chaos`), so the harness kills there too.
"""

from __future__ import annotations

import os
import signal

__all__ = ["POINTS", "CRASH_AT_ENV", "CRASH_TRACE_ENV", "reached", "parse_crash_at"]

CRASH_AT_ENV = "LOOMRT_CRASH_AT"
CRASH_TRACE_ENV = "LOOMRT_CRASH_TRACE"

POINTS: dict[str, str] = {
    "before_append": "an event is about to be written to the record",
    "after_append": "an event is written, and the view has not applied it yet",
    "model_answered": "the model answered, and its model_call event is not written yet",
    "in_distillation": "the reducer made its reduction, and the distillation is not recorded yet",
    "after_distillation": "the distillation is recorded, and its callbacks have not run",
    "in_tool": "the tool call is recorded, and the tool is running (no result yet)",
    "in_recall_index": "recall is indexing an evicted span",
    "after_recall_injected": "recalled passages are recorded (recall_injected), and the model call they go with is not made yet",
    "in_spawn": "a child's result is on the parent's record, and its siblings may still be playing",
    "in_fold": "a card is written (its model call answered), and its fold's distillation is not recorded yet",
    "in_fork": "a fork's run and its first events are written, and not committed yet",
    "in_harvest_bank": "an evicted span is about to be banked for the consolidator",
    "in_consolidate": "the extractor answered a batch, and its facts are not written yet",
}
"""Every named point, with where it is."""

_armed: tuple[str, int] | None = None
_trace: str | None = None
_active = False
_counts: dict[str, int] = {}


def parse_crash_at(value: str) -> tuple[str, int]:
    """``"in_tool:3"`` → ``("in_tool", 3)``; :class:`ValueError` naming the known points otherwise."""
    point, _, n = value.partition(":")
    if point not in POINTS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"{CRASH_AT_ENV}={value!r}: expected POINT:N (N ≥ 1), POINT one of {', '.join(POINTS)}")
    return point, int(n)


def _configure() -> None:
    global _armed, _trace, _active
    at = os.environ.get(CRASH_AT_ENV, "").strip()
    _armed = parse_crash_at(at) if at else None
    _trace = os.environ.get(CRASH_TRACE_ENV, "").strip() or None
    _active = bool(_armed or _trace)
    if _armed and _trace and os.path.exists(_trace):  # the processes before this one reached these
        with open(_trace, encoding="utf-8") as f:
            for point in map(str.strip, f):
                _counts[point] = _counts.get(point, 0) + 1


_configure()


def reached(point: str) -> None:
    """Mark that the process reached ``point``: traced, and killed here if armed for it."""
    if not _active:
        return
    n = _counts[point] = _counts.get(point, 0) + 1
    if _trace:
        with open(_trace, "a", encoding="utf-8") as f:
            f.write(point + "\n")
    if _armed and _armed == (point, n):
        os.kill(os.getpid(), signal.SIGKILL)
