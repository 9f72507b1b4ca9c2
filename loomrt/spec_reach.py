"""What an agent definition may reach beyond itself: other MCP servers' tools
(``mcp_servers:``) and child runs (``spawnable:``, ``children_state:``). Part of
:mod:`loomrt.spec`, which re-exports these; kept apart so that file stays one screenful of
concerns."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ChildrenState", "McpServerSpec", "SPAWN_TOOLS", "MCP_SERVER_NAME"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ChildrenState(_Strict):
    """Σ reduce: where a stateful parent's Σ receives each child's final Σ."""

    into: str
    """A JSON Pointer to an object in the parent's Σ, like ``/results``."""
    key: Literal["agent", "index"] = "agent"
    """Each child's Σ goes under its agent's name, or its index in the call."""

    @field_validator("into")
    @classmethod
    def _pointer(cls, into: str) -> str:
        if not into.startswith("/") or into == "/":
            raise ValueError(f"into must be a JSON Pointer below the root, like /results (not {into!r})")
        return into


SPAWN_TOOLS = ("spawn", "parallel_spawn")


MCP_SERVER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,32}$")


class McpServerSpec(_Strict):
    """An MCP server whose tools an agent may use: ``{name, command, args?, env?}`` (stdio)
    or ``{name, url, token_env?}`` (streamable HTTP)."""

    name: str
    """How ``tools:`` names it (``NAME.TOOL`` or ``NAME.*``): letters, digits, ``_`` and ``-``, at most 32."""
    command: str | None = None
    """stdio: the program to start (it speaks MCP on its stdin and stdout)."""
    args: list[str] = Field(default_factory=list)
    """stdio: the program's arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """stdio: extra environment variables for the program."""
    url: str | None = None
    """streamable HTTP: the server's endpoint, like http://127.0.0.1:8765/mcp."""
    token_env: str | None = None
    """streamable HTTP: the environment variable holding its bearer token."""
    timeout_s: float = Field(60.0, gt=0, le=3600)
    """Seconds one tool call may take before it is a tool error."""
    private: bool = False
    """Its tools' results are private: the run sees them; no summary, memory or other run does."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        if not MCP_SERVER_NAME.match(self.name):
            raise ValueError(f"name {self.name!r} must be 1-32 letters, digits, '_' or '-'")
        if (self.command is None) == (self.url is None):
            raise ValueError("give command (a stdio server) or url (a streamable HTTP server), exactly one")
        if self.url is not None and (self.args or self.env):
            raise ValueError("args and env are for a stdio server (command); a url server takes token_env")
        if self.command is not None and self.token_env is not None:
            raise ValueError("token_env is for a url server; a stdio server takes env")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, not {self.url!r}")
        return self
