"""The ``spawn`` and ``parallel_spawn`` tools: a run starts sub-agents and gets one row each.

They hold a ``spawn`` callable, :meth:`loomrt.children.Children.spawn`, given to them by
:func:`~loomrt.toolset.resolve_toolset`; they never import the loop. Both are resumable: a
parent resumed after a crash calls them again with the same call id, and the spawn ledger
on its record keeps finished children from running twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from loomrt.tools import Tool

__all__ = ["spawn_tools", "SpawnFn"]

SpawnFn = Callable[[list[dict[str, Any]], float | None], Awaitable[list[dict[str, Any]]]]

_ENTRY = {
    "type": "object",
    "properties": {
        "agent": {"type": "string", "description": "The agent to spawn (one of the spawnable agents)."},
        "prompt": {"type": "string", "description": "The child's task."},
        "context": {"type": "object", "description": "Narrow the child's context block (never widen it)."},
        "timeout_s": {"type": "number", "description": "Seconds the child may take (queued time not counted)."},
    },
    "required": ["agent", "prompt"],
}
_ROW_NOTE = (
    "Each row is {index, agent, run_id, status, ok, output?, state?, error?, truncated?, state_omitted?}; "
    "status is ok, failed, timeout, max_iterations or cancelled. A stateful child gives its final state "
    "as JSON, others their final answer."
)


def spawn_tools(spawn: SpawnFn, spawnable: list[str]) -> dict[str, Tool]:
    """``spawn`` and ``parallel_spawn`` over the ``spawn`` callable."""
    who = ", ".join(spawnable)

    async def one(
        agent: str, prompt: str, context: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {"agent": agent, "prompt": prompt}
        if context:
            entry["context"] = context
        if timeout_s is not None:
            entry["timeout_s"] = timeout_s
        return (await spawn([entry], None))[0]

    async def many(spawns: list[dict[str, Any]], timeout_s: float | None = None) -> dict[str, Any]:
        if not isinstance(spawns, list):
            raise TypeError("spawns must be a list of {agent, prompt, context?, timeout_s?}")
        return {"runs": await spawn(spawns, timeout_s)}

    return {
        "spawn": Tool(
            "spawn",
            f"Run a sub-agent ({who}) on a task and wait for its result row. {_ROW_NOTE}",
            {**_ENTRY},
            one,
            resumable=True,
        ),
        "parallel_spawn": Tool(
            "parallel_spawn",
            f"Run 1 to 32 sub-agents ({who}) at once and wait for all; rows come back in the order given. "
            f"One bad entry refuses the whole call. {_ROW_NOTE}",
            {
                "type": "object",
                "properties": {
                    "spawns": {"type": "array", "items": _ENTRY, "minItems": 1, "maxItems": 32},
                    "timeout_s": {"type": "number", "description": "The default timeout of each entry."},
                },
                "required": ["spawns"],
            },
            many,
            resumable=True,
        ),
    }
