"""The hash a ``model_call`` records of the prompt it sent, chained message by message.

On the bottom floor: the run's view keeps the working context's chain up to date step by
step (:mod:`loomrt.run.projection`), and ``runs verify`` (:mod:`loomrt.audit`) re-derives it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["CHAINED", "message_step", "chained", "prompt_hash"]


CHAINED = "c2:"
"""The prefix of a chained prompt hash: one sha256 step per message, so the working
context's hash is kept up to date message by message and a turn costs the same at any
history length. A hash without it (the first records) is of the whole prompt at once."""


def message_step(prev: str, message: dict[str, Any]) -> str:
    """One step of the chained prompt hash: ``prev`` (the hash so far, or "") and one message."""
    text = json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{prev}\x1f{text}".encode()).hexdigest()


def chained(last_step: str) -> str:
    """The recorded form of a chain whose last step is ``last_step`` ("" for no messages)."""
    return CHAINED + (last_step or hashlib.sha256(b"").hexdigest())[:32]


def prompt_hash(wire: Sequence[dict[str, Any]]) -> str:
    """The hash a ``model_call`` records of the messages it sent (provider format), chained
    message by message (:func:`message_step`): the view keeps it for its working context."""
    step = ""
    for message in wire:
        step = message_step(step, message)
    return chained(step)


def _whole_prompt_hash(wire: Sequence[dict[str, Any]]) -> str:
    """The hash the first records hold (before :data:`CHAINED`): of the whole prompt at once."""
    text = json.dumps(list(wire), sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
