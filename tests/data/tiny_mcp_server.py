"""A small MCP server for the tests (stdio): echo, add, a long result, a nap, and a crash."""

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("tiny", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """Say TEXT back."""
    return f"echo: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def long_report(lines: int = 2000) -> str:
    """A report of LINES lines."""
    return "\n".join(f"line {i}: all systems nominal" for i in range(lines))


@server.tool()
async def nap(seconds: float) -> str:
    """Sleep SECONDS, then say so."""
    import asyncio

    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def crash() -> str:
    """Exit the server process at once."""
    os._exit(3)


if __name__ == "__main__":
    server.run()
