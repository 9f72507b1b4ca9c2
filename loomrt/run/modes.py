"""Which retention mode a run uses: ``auto`` is resolved once, at start."""

from __future__ import annotations

from loomrt.providers.base import Capabilities
from loomrt.run.reducers.append import AppendMode
from loomrt.run.reducers.base import RetentionMode
from loomrt.run.reducers.compaction import CompactionMode
from loomrt.run.reducers.recap import RecapMode
from loomrt.run.reducers.stateful import StatefulMode

__all__ = ["resolve_mode", "mode_for", "MODE_CLASSES"]

MODE_CLASSES: dict[str, type[RetentionMode]] = {
    "append": AppendMode,
    "recap": RecapMode,
    "stateful": StatefulMode,
    "compaction": CompactionMode,
}


def resolve_mode(requested: str, capabilities: Capabilities, *, interactive: bool, has_schema: bool) -> str:
    """An explicit mode wins. ``auto`` is recap on a local model or in an interactive run,
    stateful on a frontier model when the agent has a state_schema, else compaction."""
    if requested != "auto":
        return requested
    if capabilities.local or interactive:
        return "recap"
    return "stateful" if has_schema else "compaction"


def mode_for(name: str) -> RetentionMode:
    return MODE_CLASSES[name]()
