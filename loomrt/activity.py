"""What a run is doing now, as it does it: told to the run's watchers, never recorded.

The record says what happened (:mod:`loomrt.events`). An :class:`Activity` says what is
happening (the model thinks, a tool runs, a recap is being written), and an
:class:`AnswerText` carries the answer as the model writes it, piece by piece. A chat
draws both live (its status line and streamed answer); the record is the same with a
watcher or without one, and holds the whole answer as one ``assistant_message``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Doing", "Activity", "AnswerText", "Watcher"]

Doing = Literal["thinking", "calling", "recalling", "distilling", "retrying"]
"""``thinking``: a model call of a turn; ``calling``: a tool runs (``tool``); ``recalling``:
the runtime searches evicted history for the next call; ``distilling``: the mode shrinks the
working context (``mode``, ``messages``); ``retrying``: a model call failed and is tried again
(``attempt``)."""


@dataclass(frozen=True)
class Activity:
    """What run ``run_id`` does now, until the next activity or event says otherwise."""

    run_id: str
    doing: Doing
    tool: str | None = None
    """The tool being called (``calling``)."""
    mode: str | None = None
    """The retention mode distilling (``distilling``)."""
    messages: int = 0
    """The messages of the working context being distilled (``distilling``)."""
    attempt: int = 0
    """Which retry this is (``retrying``)."""
    kind: Literal["activity"] = "activity"


@dataclass(frozen=True)
class AnswerText:
    """A piece of the answer run ``run_id``'s model is writing. The pieces of one model call
    join into its text; a provider that does not stream sends none."""

    run_id: str
    text: str
    kind: Literal["answer_text"] = "answer_text"


Watcher = Callable[[Activity | AnswerText], None]
"""A run's watcher hears each activity and each piece of answer text as it happens."""
