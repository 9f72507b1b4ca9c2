"""Test doubles that ship with loomrt, for your agents' tests and ours.

- :class:`ScriptedProvider`: replies from a script, with ``.calls`` and ``assert_complete()``;
- :class:`FunctionProvider`: replies from a function of the request;
- :func:`scripted_runtime`: a :class:`~loomrt.Runtime` whose every agent uses one provider.

The deterministic test embedder lives with recall: :class:`loomrt.recall.HashEmbedder`
(re-exported here as :data:`HashEmbedder`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loomrt.providers.base import ModelProvider
from loomrt.providers.scripted import FunctionProvider, ScriptedProvider, load_script
from loomrt.record.sqlite import SQLiteStore
from loomrt.runtime import Runtime

__all__ = ["ScriptedProvider", "FunctionProvider", "load_script", "scripted_runtime", "HashEmbedder"]


def scripted_runtime(provider: ModelProvider, *, store_path: str | Path = ":memory:", **kw: Any) -> Runtime:
    """A runtime whose every agent (and summarizer) is answered by ``provider``."""
    return Runtime(SQLiteStore(store_path), providers=lambda spec, model: provider, **kw)


def __getattr__(name: str) -> Any:
    if name == "HashEmbedder":
        from loomrt.recall.embedders import HashEmbedder

        return HashEmbedder
    raise AttributeError(name)
