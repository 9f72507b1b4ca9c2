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
    users_file: Path | None = typer.Option(
        None,
        "--users",
        help="With --http: a file of `USER TOKEN` lines; each token's client works only with its user's runs and memory.",
    ),
    allow_origin: list[str] = typer.Option(
        None, "--allow-origin", help="With --http: a browser Origin to accept besides the server's own (repeatable)."
    ),
) -> None:
    """Serve runs of the agents file over MCP. Tools: list_agents, spawn_run, spawn_runs, get_run,
    list_runs, get_events, continue_run, cancel_run, compact_run, fork_run, recall, add_memory; and
    each run as a loomrt://runs/{run_id} resource."""
    from loomrt.mcp.http import allowed_origins, check_listen, read_token, read_user_tokens, serve_http
    from loomrt.mcp.server import build_server
    from loomrt.mcp.service import RunService

    path, defs = load(agents)
    service = RunService(defs, agents_file=str(path.resolve()))
    server = build_server(service)
    if http:
        token = read_token(token_file)
        users = read_user_tokens(users_file) if users_file is not None else None
        check_listen(host, token, users=bool(users))
        if token is None and not users:
            err.print(f"serving on http://{host}:{port}/mcp with no token: only this machine can reach it")
        else:
            bound = f"; {len(users)} user-bound token(s)" if users else ""
            err.print(f"serving on http://{host}:{port}/mcp (bearer token required{bound})")
        origins = allowed_origins(host, port, allow_origin or [])
        serving = serve_http(server, host=host, port=port, token=token, origins=origins, users=users)
        asyncio.run(_serve(service, serving))
    else:
        asyncio.run(_serve(service, server.run_stdio_async()))


async def _serve(service, serving) -> None:  # type: ignore[no-untyped-def]
    try:
        await serving
    finally:
        await service.close()
