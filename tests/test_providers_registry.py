"""The capability registry: every fact about a model comes from one place."""

from __future__ import annotations

import pytest

from loomrt.providers.registry import (
    DEFAULT_CONTEXT_WINDOW,
    capabilities_for,
    is_private_endpoint,
    provider_of,
    runs_locally,
)
from loomrt.spec import Capabilities as DeclaredCapabilities


def test_embedded_models_are_local_with_their_n_ctx_and_use_constrained_decisions() -> None:
    qwen = capabilities_for("local/qwen2.5-coder-1.5b")
    smol = capabilities_for("local/smollm2-135m")
    assert (qwen.local, qwen.context_window, qwen.tool_calling, qwen.structured_output) == (True, 4096, False, True)
    assert (smol.local, smol.context_window) == (True, 2048)


def test_scripted_models_are_local() -> None:
    assert capabilities_for("scripted/script.yaml").local is True


@pytest.mark.parametrize(
    ("model", "api_base", "local"),
    [
        ("ollama/llama3", None, True),  # litellm's default ollama endpoint is localhost
        ("ollama_chat/llama3.1", "http://127.0.0.1:11434", True),
        ("ollama/llama3", "https://ollama.com", False),  # a hosted ollama endpoint is not local
        ("hosted_vllm/qwen", "http://10.0.0.5:8000/v1", True),
        ("hosted_vllm/qwen", "https://vllm.example.com/v1", False),
        ("openai/my-model", "http://192.168.1.20:8080/v1", True),  # OpenAI-compatible, private address
        ("openai/my-model", "http://gpu-box:8080/v1", True),  # a single-label LAN / compose host
        ("openai/gpt-4o", None, False),
        ("anthropic/claude-3-5-sonnet-20240620", None, False),
    ],
)
def test_local_means_your_own_hardware(model: str, api_base: str | None, local: bool) -> None:
    assert runs_locally(model, api_base) is local
    assert capabilities_for(model, api_base=api_base).local is local


def test_private_endpoints() -> None:
    assert is_private_endpoint("http://localhost:11434")
    assert is_private_endpoint("http://[::1]:8000")
    assert is_private_endpoint("http://llm.internal:8000")
    assert is_private_endpoint("172.16.0.3:8000")
    assert not is_private_endpoint("https://api.openai.com/v1")
    assert not is_private_endpoint("http://8.8.8.8")


def test_context_window_comes_from_litellm_where_it_knows_the_model() -> None:
    caps = capabilities_for("openai/gpt-4o")
    assert caps.context_window == 128000
    assert caps.tool_calling is True and caps.local is False


def test_unknown_models_get_the_declared_window_else_the_stated_default() -> None:
    assert capabilities_for("openai/some-private-finetune").context_window == DEFAULT_CONTEXT_WINDOW
    declared = DeclaredCapabilities(context_window=32768)
    assert capabilities_for("openai/some-private-finetune", declared=declared).context_window == 32768


def test_declared_values_override_the_registry() -> None:
    declared = DeclaredCapabilities(local=True, tool_calling=True, context_window=16384)
    caps = capabilities_for("hosted_vllm/qwen2.5-72b", api_base="https://gpu.example.com/v1", declared=declared)
    assert (caps.local, caps.tool_calling, caps.context_window) == (True, True, 16384)
    # an embedded model given a bigger window by its agent definition
    assert capabilities_for("local/smollm2-135m", declared={"context_window": 4096}).context_window == 4096


def test_self_hosted_models_default_to_constrained_decisions() -> None:
    assert capabilities_for("ollama/some-small-model").tool_calling is False
    assert capabilities_for("ollama/some-small-model").structured_output is True


def test_provider_prefix() -> None:
    assert provider_of("ollama/llama3") == "ollama"
    assert provider_of("openrouter/openai/gpt-4o") == "openrouter"
    assert provider_of("gpt-4o") == "openai"
    assert provider_of("local/smollm2-135m") == "local"
