"""A small stdio MCP server the chaos harness's ``tools-mcp`` scenario uses as a tool source.

``python -m loomrt.bench.notes_server NOTES_FILE`` offers ``read_notes`` (the file's text)
and ``add`` (a sum of integers). Deterministic, so an interrupted run can be compared with
an uninterrupted one.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["main"]


def main(notes: str) -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("notes", log_level="WARNING")

    @server.tool()
    def read_notes() -> str:
        """The incident notes, as text."""
        return Path(notes).read_text(encoding="utf-8")

    @server.tool()
    def add(numbers: list[int]) -> int:
        """The sum of NUMBERS."""
        return sum(numbers)

    server.run()


if __name__ == "__main__":
    main(sys.argv[1])
