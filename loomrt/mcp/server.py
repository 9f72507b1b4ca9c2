"""`loomrt mcp`: the MCP server's tools and resources, over :class:`~loomrt.mcp.service.RunService`.

Each tool has typed arguments, a docstring the client shows, and a structured result
(a TypedDict, so the SDK publishes its ``outputSchema``). A request the service refuses
is an MCP tool error with one message; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Annotated, Any, NotRequired

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.types import CallToolResult, InputRequiredResult
from mcp.types import Resource as MCPResource
from pydantic import Field, ValidationError
from typing_extensions import TypedDict

from loomrt import __version__
from loomrt.children import SPAWN_MAX, spawn_row
from loomrt.mcp.http import USER_KEY
from loomrt.mcp.service import CLIENT_USER, EVENTS_MAX, RunService, ServiceError

__all__ = ["build_server", "LoomMCPServer", "RESOURCES_LISTED"]

RESOURCES_LISTED = 50
"""How many recent runs ``resources/list`` names (every run is readable by its URI)."""

INSTRUCTIONS = (
    "loomrt runs agents whose context stays under a token budget. list_agents shows what can run; "
    "spawn_run starts one (or spawn_runs, several at once); get_run, get_events and the "
    "loomrt://runs/{run_id} resources show what a run did."
)


SEQ_MAX = 2**53 - 1
"""The largest seq a tool takes (the largest integer JSON carries exactly); a larger one is
refused by the tool's argument check, never passed to the store."""
Seq = Annotated[int, Field(ge=0, le=SEQ_MAX)]
TopK = Annotated[int, Field(ge=1, le=20)]


class Usage(TypedDict):
    input_tokens: int
    output_tokens: int
    model_calls: int


class RunResultOut(TypedDict):
    """A run's result, the same fields as `loomrt run --json`."""

    run_id: str
    agent: str
    mode: str
    status: str
    """running, done, parked, failed or cancelled."""
    output: str | None
    state: dict[str, Any] | None
    usage: Usage
    distillations: int
    error: NotRequired[str]
    state_withheld: NotRequired[list[str]]
    """Σ's keys left out: written from private material."""


class AgentRow(TypedDict):
    name: str
    description: str
    mode: str
    model: str
    tools: list[str]
    recall: bool
    harvest: bool


class AgentsOut(TypedDict):
    agents: list[AgentRow]


class SpawnEntry(TypedDict):
    agent: str
    prompt: str
    context: NotRequired[dict[str, Any]]


class SpawnRow(TypedDict):
    index: int
    agent: str
    run_id: str
    status: str
    """ok, failed, timeout, max_iterations, cancelled or running."""
    ok: bool
    output: NotRequired[str]
    state: NotRequired[dict[str, Any]]
    error: NotRequired[str]
    state_withheld: NotRequired[list[str]]
    """Σ's keys left out: written from private material."""


class SpawnRowsOut(TypedDict):
    runs: list[SpawnRow]


class RunsOut(TypedDict):
    runs: list[dict[str, Any]]


class EventsOut(TypedDict):
    run_id: str
    events: list[dict[str, Any]]
    next_seq: int | None
    """Pass as after_seq for the next page; null when this page is the last."""


class CompactOut(TypedDict):
    run_id: str
    mode: str
    distilled: bool
    tokens_before: int
    tokens_after: int
    reason: str | None


class RecallHitOut(TypedDict):
    text: str
    score: float
    source: str
    seq: int | None
    role: str | None
    distillation_seq: int | None
    scope: NotRequired[str]
    """A memory hit's scope."""
    author: NotRequired[str]
    """A memory hit's author: operator (written by hand), user:NAME (written by a client bound to
    user NAME) or run (extracted from what a run said)."""


class RecallOut(TypedDict):
    run_id: str
    query: str
    hits: list[RecallHitOut]


class LoomMCPServer(MCPServer[Any]):
    """The SDK's server, with service refusals as plain tool errors and runs as resources."""

    service: RunService

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        bound = CLIENT_USER.set(_client_user(context))
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ServiceError):
                raise ToolError(str(cause)) from None
            if isinstance(cause, ValidationError):
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or '(arguments)'}: {e['msg']}" for e in cause.errors()
                )
                raise ToolError(f"invalid arguments for {name}: {problems}") from None
            raise
        finally:
            CLIENT_USER.reset(bound)

    async def read_resource(self, uri: Any, context: Context[Any, Any] | None = None) -> Any:
        bound = CLIENT_USER.set(_client_user(context))
        try:
            return await super().read_resource(uri, context)
        finally:
            CLIENT_USER.reset(bound)

    async def _handle_list_resources(self, ctx: Any, params: Any) -> Any:
        # the SDK's list_resources() hears no request; the client's user is read here
        bound = CLIENT_USER.set(_client_user(Context(request_context=ctx, mcp_server=self)))
        try:
            return await super()._handle_list_resources(ctx, params)
        finally:
            CLIENT_USER.reset(bound)

    async def list_resources(self) -> list[MCPResource]:
        listed = await super().list_resources()
        for row in self.service.list_runs(None, None, RESOURCES_LISTED):
            run_id, what = row["run_id"], f"{row['agent']}, {row['status']}"
            listed.append(
                MCPResource(uri=f"loomrt://runs/{run_id}", name=f"run {run_id} ({what})", mime_type="application/json")
            )
            listed.append(
                MCPResource(
                    uri=f"loomrt://runs/{run_id}/events", name=f"events of run {run_id}", mime_type="application/json"
                )
            )
        return listed


def build_server(service: RunService) -> LoomMCPServer:
    """The MCP server over ``service``: its tools, and each run as a resource."""
    server = LoomMCPServer("loomrt", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    server.service = service

    @server.tool()
    def list_agents() -> AgentsOut:
        """The agents this server can run: name, description, retention mode, model, tools, and whether recall and harvest are on."""
        return {"agents": service.list_agents()}  # type: ignore[typeddict-item]

    @server.tool()
    async def spawn_run(
        agent: str,
        prompt: str,
        context: dict[str, Any] | None = None,
        wait: bool = True,
        timeout_s: float | None = None,
        ctx: Context[Any, Any] | None = None,
    ) -> RunResultOut:
        """Start a run of AGENT on PROMPT and (by default) wait for its result.

        context: a per-run override of the agent's context block, which may narrow what the
        definition allows, never widen it (numbers only decrease; recall and harvest_to_memory
        only turn off; mode may change; no state_schema). wait=false returns at once with
        status "running". timeout_s bounds the wait, not the run: on expiry the result says
        "running" and the run goes on (cancel_run stops it). Progress notifications (iterations,
        tool calls, distillations) come at most once a second when the request asks for them.
        """
        _check_timeout(timeout_s)
        run = await service.spawn(agent, prompt, context)
        if not wait:
            return await service.result(run.run_id)  # type: ignore[return-value]
        return await service.wait(run.run_id, timeout_s, _reporter(ctx))  # type: ignore[return-value]

    @server.tool()
    async def spawn_runs(spawns: list[SpawnEntry], timeout_s: float | None = None) -> SpawnRowsOut:
        """Start 1 to 32 runs at once and wait for them all (the fan-out primitive: they play
        concurrently). Every entry ({agent, prompt, context?}) is checked before any run starts:
        one bad entry refuses the call, naming its index. The result has one row per entry, in
        order: {index, agent, run_id, status, ok, output?, state?, error?}, status one of ok,
        failed, timeout, max_iterations, cancelled, running. A failed run is a row, not a failed call.
        """
        _check_timeout(timeout_s)
        if not 1 <= len(spawns) <= SPAWN_MAX:
            raise ServiceError(f"spawns must have 1 to {SPAWN_MAX} entries, not {len(spawns)}")
        for i, entry in enumerate(spawns):
            service.check_spawn(entry["agent"], entry["prompt"], entry.get("context"), where=f"spawns[{i}].")
        runs = [await service.spawn(e["agent"], e["prompt"], e.get("context")) for e in spawns]
        results = await service.wait_all([r.run_id for r in runs], timeout_s)
        return {"runs": [spawn_row(i, e["agent"], r) for i, (e, r) in enumerate(zip(spawns, results, strict=True))]}  # type: ignore[misc]

    @server.tool()
    def get_run(run_id: str) -> dict[str, Any]:
        """One run as `loomrt runs show --json` prints it: status, mode, usage, distillations, output and state."""
        return service.get_run(run_id)

    @server.tool()
    def list_runs(agent: str | None = None, status: str | None = None, limit: int = 50) -> RunsOut:
        """Recent runs, newest first; only AGENT's, or only those with STATUS (running, active, parked, done, failed, cancelled)."""
        return {"runs": service.list_runs(agent, status, limit)}

    @server.tool()
    def get_events(run_id: str, after_seq: Seq = 0, limit: int = 100, include_private: bool = False) -> EventsOut:
        """A page of the run's record: events with seq above AFTER_SEQ, at most LIMIT (up to 1000).
        next_seq is the after_seq of the next page, or null on the last. Private messages are
        placeholders (redacted: true) unless INCLUDE_PRIVATE."""
        return service.get_events(run_id, after_seq, limit, include_private)  # type: ignore[return-value]

    @server.tool()
    async def continue_run(
        run_id: str,
        prompt: str,
        wait: bool = True,
        timeout_s: float | None = None,
        ctx: Context[Any, Any] | None = None,
    ) -> RunResultOut:
        """Give a run that is not playing (done, parked, failed or cancelled) a new input, and play it."""
        _check_timeout(timeout_s)
        await service.continue_(run_id, prompt)
        if not wait:
            return await service.result(run_id)  # type: ignore[return-value]
        return await service.wait(run_id, timeout_s, _reporter(ctx))  # type: ignore[return-value]

    @server.tool()
    async def cancel_run(run_id: str) -> RunResultOut:
        """Stop a run: a turn in flight is cancelled and the record gets a cancelled event.
        Idempotent: a run that is done or already cancelled is returned unchanged."""
        return await service.cancel(run_id)  # type: ignore[return-value]

    @server.tool()
    async def compact_run(run_id: str) -> CompactOut:
        """Distil a run that is not playing now, whatever its pressure: its context's tokens
        before and after, or why the mode declined (append keeps everything)."""
        return await service.compact(run_id)  # type: ignore[return-value]

    @server.tool()
    async def fork_run(run_id: str, at_seq: Seq | None = None) -> dict[str, Any]:
        """A new run that shares RUN_ID's history up to AT_SEQ (default: all of it) and goes on
        on its own, parked for its first input (continue_run). Its record says forked_from;
        in fold mode no text is copied, whatever the history's length."""
        return await service.fork(run_id, at_seq)

    @server.tool()
    async def recall(run_id: str, query: str, top_k: TopK = 5, include_private: bool = False) -> RecallOut:
        """Search one run's evicted spans for the original words, exactly as its Recall tool
        does (only that run, and its agent's permitted memory). The run's agent must have recall on.
        A private message's hit is its placeholder unless INCLUDE_PRIVATE."""
        return await service.recall(run_id, query, top_k, include_private)  # type: ignore[return-value]

    @server.tool()
    async def add_memory(
        scope: str,
        statement: str,
        fact_class: str = "fact",
        subject: str = "",
    ) -> dict[str, Any]:
        """Write one statement to durable memory by hand, as `loomrt memory add` does: stored as
        written (author: operator; user:NAME for a client whose token is bound to user NAME, which
        Recall's source "operator" does not return), found by later runs' Recall in SCOPE
        (KIND:IDENTITY, e.g. user:alice; a client bound to a user writes only that user's scope,
        and "user" names it). FACT_CLASS: preference, fact, decision, identity, constraint or correction.
        SUBJECT (whom it is about) lets it merge into or supersede stored facts about them.
        Returns the outcome (new, merged, superseded, already) and the fact."""
        # embedding it and writing it (PostgreSQL: a network round trip, a lock) leave the event
        # loop the server's other clients are served on; the client's user goes along (contextvars)
        return await asyncio.to_thread(service.add_memory, scope, statement, fact_class, subject)

    @server.resource(
        "loomrt://runs/{run_id}",
        name="run",
        mime_type="application/json",
        description="A run as `loomrt runs show --json` prints it.",
    )
    def run_resource(run_id: str) -> str:
        return _read(lambda: service.get_run(run_id))

    @server.resource(
        "loomrt://runs/{run_id}/events",
        name="run events",
        mime_type="application/json",
        description=f"A run's record, its first {EVENTS_MAX} events (get_events pages the rest).",
    )
    def events_resource(run_id: str) -> str:
        return _read(lambda: service.get_events(run_id, 0, EVENTS_MAX))

    return server


def _client_user(context: Context[Any, Any] | None) -> str | None:
    """The user the request's bearer token is bound to (:class:`loomrt.mcp.http.Guard` says
    so in the ASGI scope); None for stdio and for an unbound token."""
    try:
        request = context.request_context.request if context is not None else None
    except ValueError:  # outside a request
        return None
    scope = getattr(request, "scope", None)
    user = scope.get(USER_KEY) if isinstance(scope, dict) else None
    return user if isinstance(user, str) else None


def _check_timeout(timeout_s: float | None) -> None:
    if timeout_s is not None and not 0 < timeout_s <= 86_400:
        raise ServiceError(f"timeout_s must be above 0 and at most 86400 (a day), not {timeout_s}")


def _read(page: Callable[[], dict[str, Any]]) -> str:
    try:
        return json.dumps(page(), ensure_ascii=False)
    except ServiceError as exc:
        raise ResourceNotFoundError(str(exc)) from None


def _reporter(ctx: Context[Any, Any] | None) -> Any:
    if ctx is None:
        return None

    async def report(progress: float, message: str) -> None:
        try:
            await ctx.report_progress(progress, None, message)
        except Exception:  # noqa: BLE001 - a client that cannot take progress still gets its result
            pass

    return report
