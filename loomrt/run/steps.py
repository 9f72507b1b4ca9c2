"""What happens next after one model call: a small tagged value the loop matches on."""

from __future__ import annotations

from dataclasses import dataclass

from loomrt.messages import ToolCall

__all__ = ["FinalOutput", "RunTools", "AskAgain", "NextStep"]


@dataclass(frozen=True)
class FinalOutput:
    """The turn ends with this answer."""

    output: str


@dataclass(frozen=True)
class RunTools:
    """Execute these tool calls, append their results, and call the model again."""

    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class AskAgain:
    """Call the model again (feedback was already appended to the working context)."""


NextStep = FinalOutput | RunTools | AskAgain
