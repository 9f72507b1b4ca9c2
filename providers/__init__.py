"""Providers: every model call goes through one narrow interface.

- :mod:`.base`: the interface (:class:`ModelProvider`) and its request/response values;
- :mod:`.gateway`: litellm behind that interface (any provider litellm supports);
- :mod:`.registry`: capability facts about models (local or frontier, window, tools);
- :mod:`.local`: the embedded llama.cpp model, registered in litellm as provider ``local``;
- :mod:`.scripted`: deterministic replies for tests and benchmarks;
- :mod:`.retry`: backoff and jitter on 429, 5xx and timeouts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from loomrt.providers.base import (
    Capabilities,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    ToolSchema,
    Usage,
)
from loomrt.providers.offline import configure_offline

if TYPE_CHECKING:
    from loomrt.spec import AgentSpec

__all__ = [
    "Capabilities",
    "ModelProvider",
    "ModelRequest",
    "ModelResponse",
    "ToolSchema",
    "Usage",
    "resolve_provider",
    "configure_offline",
]


def resolve_provider(spec: AgentSpec, model: str | None = None) -> ModelProvider:
    """The provider that serves ``model`` (default: the agent's model) for agent ``spec``."""
    model = model or spec.model
    from loomrt.providers.registry import is_scripted

    if is_scripted(model):
        from loomrt.providers.scripted import load_script
        from loomrt.tokens import count_dicts

        provider = load_script(model.removeprefix("scripted/"), count_tokens=count_dicts)
        declared = {k: v for k, v in spec.capabilities.model_dump().items() if v is not None}
        if declared:
            provider.capabilities = dataclasses.replace(provider.capabilities, **declared)
        return provider
    from loomrt.providers.gateway import LiteLLMProvider

    return LiteLLMProvider.from_spec(spec, model=model)
