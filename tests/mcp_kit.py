"""Shared by the MCP tests: an agents file of scripted agents, and real MCP clients
(stdio and streamable HTTP) connected to `loomrt mcp` started as a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

AGENTS = """\
agents:
  quick:
    description: answers at once
    model: scripted/quick.yaml
  slow:
    description: thinks for a while
    model: scripted/slow.yaml
  hang:
    description: never answers in time
    model: scripted/hang.yaml
  calc:
    description: uses a tool, then answers
    model: scripted/calc.yaml
    tools: [calculate]
    context: {mode: compaction, budget_tokens: 4096, keep_last_n: 2, recall: false}
"""

SCRIPTS = {
    "quick.yaml": "turns:\n  - text: 'quick answer'\n  - text: 'second answer'\n",
    "slow.yaml": "turns:\n  - {text: 'slow answer', delay_s: 0.8}\n",
    "hang.yaml": "turns:\n  - {text: 'too late', delay_s: 60}\n",
    "calc.yaml": (
        "turns:\n"
        "  - tool_call: {name: calculate, arguments: {expression: '6*7'}}\n"
        "  - text: 'It is 42, after working through the arithmetic step by step with the calculator tool.'\n"
        "  - text: 'Noted, and the answer stays 42.'\n"
        "summaries:\n  - '6*7 = 42.'\n"
    ),
}


def agents_folder(folder: Path) -> Path:
    for name, text in SCRIPTS.items():
        (folder / name).write_text(text)
    path = folder / "agents.yaml"
    path.write_text(AGENTS)
    return path


def server_env() -> dict[str, str]:
    keep = ("LOOMRT_", "LITELLM_", "HF_", "TRANSFORMERS_", "PATH", "HOME", "PYTHON")
    return {k: v for k, v in os.environ.items() if k.startswith(keep) and k != "LOOMRT_MCP_TOKEN"}


@contextlib.asynccontextmanager
async def stdio_session(agents: Path) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "loomrt", "mcp", "--agents", str(agents)],
        env=server_env(),
        cwd=str(agents.parent),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def http_server(agents: Path, *, token: str | None, extra: list[str] | None = None) -> Any:
    """`loomrt mcp --http` as a real subprocess on 127.0.0.1; yields its base URL."""
    port = free_port()
    env = {**server_env(), **({"LOOMRT_MCP_TOKEN": token} if token else {})}
    if not token:
        env.pop("LOOMRT_MCP_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "loomrt", "mcp", "--http", "--port", str(port), "--agents", str(agents), *(extra or [])],
        env=env,
        cwd=str(agents.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"the server exited: {proc.stderr.read() if proc.stderr else ''}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.asynccontextmanager
async def http_session(base: str, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    async with create_mcp_http_client(headers=headers) as client:
        async with streamable_http_client(f"{base}/mcp", http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def structured(result: Any) -> dict[str, Any]:
    """A tool call's structured result; fails with the error text if it was an error."""
    assert not result.is_error, result.content[0].text
    return dict(result.structured_content or json.loads(result.content[0].text))


def error_text(result: Any) -> str:
    assert result.is_error, f"expected a tool error, got {result.structured_content}"
    return str(result.content[0].text)
