"""``loomrt mcp``: serve the agents file over the Model Context Protocol (stdio, or streamable HTTP)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from loomrt.cli._common import err, friendly, load

__all__ = ["mcp_cmd"]


@friendly
def mcp_cmd(
    agents: Path | None = typer.Option(
        None, "--agents", help="The agents file (default ./agents.yaml, else $LOOMRT_AGENTS)."
    ),
    http: bool = typer.Option(False, "--http", help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio."),
    host: str = typer.Option("127.0.0.1", "--host", help="With --http: the address to listen on."),
    port: int = typer.Option(8765, "--port", help="With --http: the port to listen on."),
    token_file: Path | None = typer.Option(
        None, "--token-file", help="With --http: a file whose first line is the bearer token (else $LOOMRT_MCP_TOKEN)."
    ),
    allow_origin: list[str] = typer.Option(
        None, "--allow-origin", help="With --http: a browser Origin to accept besides the server's own (repeatable)."
    ),
) -> None:
    """Serve runs of the agents file over MCP. Tools: list_agents, spawn_run, spawn_runs, get_run,
    list_runs, get_events, continue_run, cancel_run, compact_run, fork_run, recall; and each run
    as a loomrt://runs/{run_id} resource."""
    from loomrt.mcp.http import allowed_origins, check_listen, read_token, serve_http
    from loomrt.mcp.server import build_server
    from loomrt.mcp.service import RunService

    path, defs = load(agents)
    service = RunService(defs, agents_file=str(path.resolve()))
    server = build_server(service)
    if http:
        token = read_token(token_file)
        check_listen(host, token)
        if token is None:
            err.print(f"serving on http://{host}:{port}/mcp with no token: only this machine can reach it")
        else:
            err.print(f"serving on http://{host}:{port}/mcp (bearer token required)")
        origins = allowed_origins(host, port, allow_origin or [])
        asyncio.run(_serve(service, serve_http(server, host=host, port=port, token=token, origins=origins)))
    else:
        asyncio.run(_serve(service, server.run_stdio_async()))


async def _serve(service, serving) -> None:  # type: ignore[no-untyped-def]
    try:
        await serving
    finally:
        await service.close()
