"""Which retention mode a run uses: ``auto`` is resolved once, at start; a mode's class
comes from the one registry, :data:`loomrt.spec.RETENTION_MODES`."""

from __future__ import annotations

import importlib
from typing import Any

from loomrt.providers.base import Capabilities
from loomrt.run.reducers.base import RetentionMode
from loomrt.spec import RETENTION_MODES

__all__ = ["resolve_mode", "mode_for", "mode_class"]


def resolve_mode(requested: str, capabilities: Capabilities, *, interactive: bool, has_schema: bool) -> str:
    """An explicit mode wins. ``auto`` is recap on a local model or in an interactive run,
    stateful on a frontier model when the agent has a state_schema, else compaction."""
    if requested != "auto":
        return requested
    if capabilities.local or interactive:
        return "recap"
    return "stateful" if has_schema else "compaction"


def mode_class(name: str) -> type[RetentionMode]:
    """The class registered for mode ``name`` (imported on first use)."""
    entry: Any = RETENTION_MODES[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
    return entry  # type: ignore[no-any-return]


def mode_for(name: str) -> RetentionMode:
    return mode_class(name)()
