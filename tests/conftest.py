"""Test set-up: no network, a private LOOMRT_HOME, offline litellm.

Real model calls are blocked: any socket connection to an address outside the loopback
range fails (as pydantic-ai's ALLOW_MODEL_REQUESTS = False does for its models), and
LOOMRT_ALLOW_MODEL_REQUESTS=0 makes the litellm gateway refuse non-local models before
they try. Local models (llama.cpp in-process) and scripted models need no network.
"""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["LITELLM_OFFLINE_MODE"] = "true"
os.environ["LOOMRT_ALLOW_MODEL_REQUESTS"] = "0"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("LOOMRT_RETRY_BASE_S", "0.001")

_real_connect = socket.socket.connect


def _guarded_connect(self: socket.socket, address: object) -> object:
    host = address[0] if isinstance(address, tuple) else None
    if isinstance(host, str):
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = host == "localhost"
        if not ok:
            raise ConnectionRefusedError(f"tests may not reach the network (tried {host})")
    return _real_connect(self, address)


socket.socket.connect = _guarded_connect  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _loomrt_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own LOOMRT_HOME (record, caches), except the local-model cache,
    which is shared so the model is assembled once per session."""
    home = tmp_path_factory.mktemp("loomrt-home")
    monkeypatch.setenv("LOOMRT_HOME", str(home))
    monkeypatch.setenv("LOOMRT_MODEL_CACHE", str(_shared_model_cache(tmp_path_factory)))


_CACHE: list[str] = []


def _shared_model_cache(factory: pytest.TempPathFactory) -> str:
    if os.environ.get("LOOMRT_TEST_MODEL_CACHE"):
        return os.environ["LOOMRT_TEST_MODEL_CACHE"]
    if not _CACHE:
        _CACHE.append(str(factory.mktemp("model-cache")))
    return _CACHE[0]
