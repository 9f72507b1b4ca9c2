"""The capability registry: every fact loomrt needs about a model, in one place.

:func:`capabilities_for` answers four questions about a model string (and its ``api_base``):

``local``
    Does it run on your own hardware? ``local/*`` (the embedded llama.cpp model) and
    ``scripted/*`` are local. A self-hosted server (ollama, vLLM, llama.cpp's server,
    llamafile, LM Studio, or any OpenAI-compatible endpoint) is local when its
    ``api_base`` is a loopback or private address (or, with no ``api_base``, when the
    provider's own default is ``localhost``). A hosted ollama endpoint is not local.
``context_window``
    litellm's model info where it knows the model; the embedded model's n_ctx; else the
    declared value; else :data:`DEFAULT_CONTEXT_WINDOW`.
``tool_calling``
    Whether the model calls tools natively. Local models default to no: small models
    call tools unreliably, so loomrt asks them for a grammar-constrained JSON decision
    instead (see :mod:`loomrt.providers.decisions`).
``structured_output``
    Whether the model honours a JSON Schema ``response_format``.

Values declared in YAML (``capabilities:`` in an agent definition) override all of these.
No other module inspects model strings to decide these facts.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any
from urllib.parse import urlsplit

from loomrt.providers.base import Capabilities
from loomrt.providers.models import CATALOGUE

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "SELF_HOSTED_PROVIDERS",
    "capabilities_for",
    "provider_of",
    "is_private_endpoint",
    "runs_locally",
    "is_embedded",
    "is_scripted",
]

DEFAULT_CONTEXT_WINDOW = 8192
"""The context window assumed for a model nobody knows anything about."""

SELF_HOSTED_PROVIDERS = frozenset(
    {"ollama", "ollama_chat", "vllm", "hosted_vllm", "llamafile", "lm_studio", "llamacpp", "xinference", "oobabooga"}
)
"""litellm providers that are servers you run yourself (their default api_base is localhost)."""

_PRIVATE_SUFFIXES = (".local", ".lan", ".internal", ".home.arpa", ".localhost")
_log = logging.getLogger(__name__)


def provider_of(model: str) -> str:
    """The provider prefix of a litellm model string (``ollama/llama3`` → ``ollama``).

    A bare name (``gpt-4o``) is litellm's to infer; it is reported as ``openai`` when
    litellm's model list knows it, else as the empty string.
    """
    if "/" in model:
        return model.split("/", 1)[0]
    return "openai" if _model_info(model) else ""


def is_embedded(model: str) -> bool:
    """Whether ``model`` is the embedded llama.cpp model (``local/*``), served in this process."""
    return provider_of(model) == "local"


def is_scripted(model: str) -> bool:
    """Whether ``model`` replays a script (``scripted/*``) instead of calling a model."""
    return provider_of(model) == "scripted"


def is_private_endpoint(api_base: str) -> bool:
    """Whether ``api_base`` points at this machine or a private network.

    Loopback, private and link-local addresses count, as do ``localhost``, single-label
    host names (``ollama``, ``gpu-box``: a compose service or LAN host) and names under
    .local, .lan, .internal, .home.arpa. Nothing is resolved over DNS.
    """
    host = urlsplit(api_base if "://" in api_base else f"http://{api_base}").hostname or ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or "." not in host or host.endswith(_PRIVATE_SUFFIXES)
    return ip.is_loopback or ip.is_private or ip.is_link_local


def runs_locally(model: str, api_base: str | None = None) -> bool:
    """Whether calls to ``model`` stay on this machine or network (declared facts aside).

    This is the fact the request guard (``LOOMRT_ALLOW_MODEL_REQUESTS=0``) checks.
    """
    if is_embedded(model) or is_scripted(model):
        return True
    if api_base:
        return is_private_endpoint(api_base)
    return provider_of(model) in SELF_HOSTED_PROVIDERS


def _model_info(model: str) -> dict[str, Any]:
    from loomrt.providers.offline import import_litellm

    litellm = import_litellm()
    try:
        return dict(litellm.get_model_info(model))
    except Exception:  # noqa: BLE001 - litellm raises several kinds for "not mapped"
        return {}


def capabilities_for(model: str, *, api_base: str | None = None, declared: Any = None) -> Capabilities:
    """The capabilities of ``model`` at ``api_base``, with ``declared`` values winning.

    ``declared`` is an agent definition's ``capabilities`` (a pydantic model), a dict, or
    None; its fields that are None are not declared.
    """
    if hasattr(declared, "model_dump"):
        declared = declared.model_dump()
    overrides = {k: v for k, v in dict(declared or {}).items() if v is not None}
    local = runs_locally(model, api_base)
    if model in CATALOGUE:
        facts = Capabilities(
            local=True,
            context_window=CATALOGUE[model].context_window,
            tool_calling=False,
            structured_output=True,
            one_call_turns=True,  # issue 43: as good or better answers, at about half the input (docs/providers.md)
        )
    elif is_scripted(model):
        facts = Capabilities(local=True, context_window=32768, tool_calling=True, structured_output=True)
    else:
        facts = _from_litellm(model, local=local, declared_window=overrides.get("context_window"))
    return Capabilities(**{**facts.__dict__, **overrides})


def _from_litellm(model: str, *, local: bool, declared_window: int | None) -> Capabilities:
    info = _model_info(model) if not is_embedded(model) else {}
    window = info.get("max_input_tokens") or info.get("max_tokens")
    if not window:
        window = declared_window or DEFAULT_CONTEXT_WINDOW
        if declared_window is None:
            _log.debug("no context window known for %s; assuming %d", model, window)
    tools = info.get("supports_function_calling")
    schema = info.get("supports_response_schema")
    provider = provider_of(model)
    return Capabilities(
        local=local,
        context_window=int(window),
        # self-hosted small models call tools unreliably; hosted APIs generally do it well
        tool_calling=bool(tools) if tools is not None else not local,
        # ollama honours a JSON Schema `format`; for others, trust litellm's model info
        structured_output=bool(schema) if schema is not None else provider in ("ollama", "ollama_chat") or local,
    )
