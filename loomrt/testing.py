"""Test doubles that ship with loomrt, for your agents' tests and ours.

- :class:`ScriptedProvider`: replies from a script, with ``.calls`` and ``assert_complete()``;
- :class:`FunctionProvider`: replies from a function of the request;
- :class:`FaultyProvider`: rate limits, 5xx, timeouts and malformed tool calls on purpose,
  through the real litellm gateway, then replies from another provider;
- :func:`scripted_runtime`: a :class:`~loomrt.Runtime` whose every agent uses one provider.

The deterministic test embedder lives with recall: :class:`loomrt.recall.HashEmbedder`
(re-exported here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loomrt.providers.base import ModelProvider
from loomrt.providers.scripted import FunctionProvider, ScriptedProvider, extractive_summary, load_script
from loomrt.recall.embedders import HashEmbedder
from loomrt.record.sqlite import SQLiteStore
from loomrt.runtime import Runtime

__all__ = [
    "extractive_summary",
    "ScriptedProvider",
    "FunctionProvider",
    "FaultyProvider",
    "load_script",
    "scripted_runtime",
    "HashEmbedder",
]


def scripted_runtime(
    provider: ModelProvider, *, store_path: str | Path = ":memory:", store: Any = None, **kw: Any
) -> Runtime:
    """A runtime whose every agent (and summarizer) is answered by ``provider``, on ``store``
    (default: a SQLite store at ``store_path``)."""
    return Runtime(
        store if store is not None else SQLiteStore(store_path), providers=lambda spec, model: provider, **kw
    )


_FAULTS = ("429", "500", "503", "timeout", "connection", "malformed_tool_call", "400", "401", "404")


class FaultyProvider:
    """A provider that fails on purpose, through the real litellm gateway, then recovers.

    Each call takes the next item of ``faults`` and makes litellm raise it (or return it),
    using litellm's own ``mock_response``, so the gateway's real error mapping and reply
    parsing run: ``"429"`` (rate limit), ``"500"``, ``"503"``, ``"timeout"``,
    ``"connection"`` (all retryable), ``"malformed_tool_call"`` (a tool call whose
    arguments are not JSON: retryable), ``"400"``, ``"401"``, ``"404"`` (permanent).
    Once the faults are used up, ``then`` answers (default: a scripted ``"ok"``).
    ``injected`` lists the faults used so far.
    """

    def __init__(self, faults: list[str], then: ModelProvider | None = None, *, model: str = "openai/faulty-model"):
        unknown = [f for f in faults if f not in _FAULTS]
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {', '.join(_FAULTS)}")
        self.faults = list(faults)
        self.then = then or ScriptedProvider(turns=["ok"], summaries=["summary"])
        self.model = model
        self.capabilities = self.then.capabilities
        self.injected: list[str] = []

    async def complete(self, request: Any) -> Any:
        if not self.faults:
            return await self.then.complete(request)
        from loomrt.providers.base import Capabilities
        from loomrt.providers.gateway import LiteLLMProvider

        fault = self.faults.pop(0)
        self.injected.append(fault)
        gateway = LiteLLMProvider(
            self.model, capabilities=Capabilities(tool_calling=True), litellm_params=_mocked(fault, self.model, request)
        )
        return await gateway.complete(request)

    def advance(self, turns: int, summaries: int) -> None:
        """A resumed run picks up where its record left off (see :meth:`ScriptedProvider.advance`)."""
        advance = getattr(self.then, "advance", None)
        if callable(advance):
            advance(turns, summaries)


def _mocked(fault: str, model: str, request: Any) -> dict[str, Any]:
    from loomrt.providers.offline import import_litellm

    litellm = import_litellm()
    kw = {"llm_provider": model.split("/", 1)[0], "model": model}
    if fault == "malformed_tool_call":
        name = request.tools[0].name if request.tools else "calculate"
        bad = {"id": "call_bad", "type": "function", "function": {"name": name, "arguments": '{"expression": "1+'}}
        return {"mock_response": "", "mock_tool_calls": [bad]}
    errors = {
        "429": lambda: litellm.RateLimitError("injected rate limit", **kw),
        "500": lambda: litellm.InternalServerError("injected server error", **kw),
        "503": lambda: litellm.ServiceUnavailableError("injected service unavailable", **kw),
        "timeout": lambda: litellm.Timeout("injected timeout", **kw),
        "connection": lambda: litellm.APIConnectionError("injected connection reset", **kw),
        "400": lambda: litellm.BadRequestError("injected bad request", **kw),
        "401": lambda: litellm.AuthenticationError("injected invalid API key", **kw),
        "404": lambda: litellm.NotFoundError("injected unknown model", **kw),
    }
    return {"mock_response": errors[fault]()}
