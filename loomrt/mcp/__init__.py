"""loomrt and the Model Context Protocol: `loomrt mcp` serves runs (:mod:`.server` over
:mod:`.service`, HTTP guarded by :mod:`.http`), and MCP servers are tool sources
(:mod:`.sources`). Import the submodules; the SDK (the ``mcp`` extra) loads only with them."""

__all__: list[str] = []
