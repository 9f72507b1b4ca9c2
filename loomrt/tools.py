"""Tools an agent may call, and the built-in ones.

A :class:`Tool` is a name, a description, a JSON Schema for its arguments and an
(async or sync) function. Which tools a run gets is decided in one place,
:func:`loomrt.toolset.resolve_toolset`; the agent's ``tools:`` allowlist is
default-deny.
"""

from __future__ import annotations

import ast
import datetime as _dt
import inspect
import json
import operator
import re
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomrt.messages import EvictedSpanCallback
from loomrt.providers.base import ToolSchema

__all__ = ["Tool", "Toolset", "BUILTIN_TOOLS", "CURRENT_CALL", "tool", "Private"]

ToolFn = Callable[..., Any | Awaitable[Any]]

CURRENT_CALL: ContextVar[str | None] = ContextVar("loomrt_tool_call_id", default=None)
"""The id of the tool call being executed (a tool that records events about itself reads it)."""


class Private(str):
    """A tool result only its own run may see: a tool returns ``Private(text)`` and the
    result is recorded private (see :mod:`loomrt.visibility`)."""

    __slots__ = ()


@dataclass(frozen=True)
class Tool:
    """A callable the model may ask for. ``fn`` takes the arguments as keywords."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: ToolFn
    resumable: bool = False
    """Safe to call again with the same call id after a crash (it reconciles what it already
    did from the record, as spawn does): resume calls it again instead of reporting it
    interrupted."""
    private: bool = False
    """Every result is private: its own run sees it; no summary, memory or other run does."""

    @property
    def schema(self) -> ToolSchema:
        return ToolSchema(self.name, self.description, self.parameters)

    async def call(self, arguments: dict[str, Any]) -> str:
        """Run the tool; the result as text for the model (dicts and lists become JSON)."""
        out = self.fn(**arguments)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, str):
            return out  # a Private result stays Private
        return json.dumps(out, ensure_ascii=False, default=str)


@dataclass
class Toolset:
    """The tools a run may call, the callbacks it registers, and its system prompt lines.
    Resolved in one place, :func:`loomrt.toolset.resolve_toolset`."""

    tools: dict[str, Tool] = field(default_factory=dict)
    callbacks: list[EvictedSpanCallback] = field(default_factory=list)
    prompt_lines: list[str] = field(default_factory=list)
    recall: Any = None
    """The run's recall index (a :class:`loomrt.recall.RunRecall`), when recall is on."""
    sources: list[Any] = field(default_factory=list)
    """Tool sources started on first use (:class:`loomrt.mcp.sources.McpSource`, one per MCP server)."""

    async def open_sources(self) -> None:
        """Start the tool sources that are not running, and offer the tools they have now."""
        for source in self.sources:
            stale = [name for name, t in self.tools.items() if name in source.tools]
            for name in stale:
                del self.tools[name]
            self.tools.update(await source.open())

    async def close_sources(self) -> None:
        """Stop every tool source (the run ended)."""
        for source in self.sources:
            await source.close()


def tool(name: str, description: str, parameters: dict[str, Any]) -> Callable[[ToolFn], Tool]:
    """Decorator: turn a function into a :class:`Tool`."""

    def wrap(fn: ToolFn) -> Tool:
        return Tool(name, description, parameters, fn)

    return wrap


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


@tool("read_file", "Read a UTF-8 text file (at most 20,000 characters).", _obj({"path": {"type": "string"}}, ["path"]))
def _read_file(path: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"no file at {path}")
    text = p.read_text(encoding="utf-8", errors="replace")
    return text[:20000] + ("\n[... truncated]" if len(text) > 20000 else "")


@tool("list_dir", "List the entries of a folder.", _obj({"path": {"type": "string"}}, ["path"]))
def _list_dir(path: str = ".") -> list[str]:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise NotADirectoryError(f"no folder at {path}")
    return sorted(e.name + ("/" if e.is_dir() else "") for e in p.iterdir())[:500]


@tool(
    "search_text",
    "Find lines matching a regular expression in the text files under a folder.",
    _obj({"pattern": {"type": "string"}, "path": {"type": "string"}}, ["pattern", "path"]),
)
def _search_text(pattern: str, path: str = ".") -> list[str]:
    rx = re.compile(pattern)
    hits: list[str] = []
    for f in sorted(Path(path).expanduser().rglob("*")):
        if not f.is_file() or f.stat().st_size > 2_000_000:
            continue
        try:
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{f}:{i}: {line.strip()[:200]}")
                    if len(hits) >= 100:
                        return hits
        except (UnicodeDecodeError, OSError):
            continue
    return hits


_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))  # type: ignore[no-any-return]
    raise ValueError("only numbers and + - * / // % ** ( ) are allowed")


@tool(
    "calculate", "Evaluate an arithmetic expression exactly.", _obj({"expression": {"type": "string"}}, ["expression"])
)
def _calculate(expression: str) -> str:
    return str(_eval(ast.parse(expression, mode="eval").body))


@tool("now", "The current date and time (UTC, ISO 8601).", _obj({}, []))
def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


BUILTIN_TOOLS: dict[str, Tool] = {t.name: t for t in (_read_file, _list_dir, _search_text, _calculate, _now)}
"""The tools every runtime knows by name (grant them with ``tools:``)."""
