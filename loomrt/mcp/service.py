"""What `loomrt mcp` does, apart from MCP: spawn, steer and inspect runs in this process.

:class:`RunService` is the front door's logic. It goes through the one :class:`Runtime`
(and so through :func:`~loomrt.toolset.resolve_toolset`): a run spawned here is on the
record like any other, and `loomrt runs ...` sees it. Runs play as tasks of the server's
event loop, so a call may return before its run ends (``wait=false``, or ``timeout_s``)
and the run goes on. Every failure a client can cause is a :class:`ServiceError` with one
message; a run that fails is a result, never an exception.

A client whose token is bound to a user (``loomrt mcp --http --users FILE``; the server sets
:data:`CLIENT_USER` for each of its requests) works only with that user's runs: what it
spawns works for that user (its ``user`` memory scope), and a run that works for anyone else
is, to it, not there (its record, its recall and the durable memory that recall reads). An
unbound client (stdio, or the one operator token) sees every run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from loomrt.children import DEPTH_MAX
from loomrt.errors import LoomError, NotFoundError
from loomrt.events import Event
from loomrt.overrides import narrowed_context
from loomrt.run.loop import check_input
from loomrt.run.state import RunResult, RunState
from loomrt.run.summary import run_summary
from loomrt.runtime import Runtime
from loomrt.spec import AgentsFile, AgentSpec

__all__ = ["RunService", "ServiceError", "Progress", "EVENTS_MAX", "CLIENT_USER"]

EVENTS_MAX = 1000
"""The most events one ``get_events`` page holds."""
PROGRESS_EVERY_S = 1.0
"""A waiting ``spawn_run`` reports progress at most this often."""

Report = Callable[[float, str], Awaitable[None]]

CLIENT_USER: ContextVar[str | None] = ContextVar("loomrt_mcp_client_user", default=None)
"""The user the current request's token is bound to; None for an unbound client (every run)."""


class ServiceError(Exception):
    """A request the service refuses: the message says what is wrong and what to do."""


@dataclass
class Progress:
    """What one run has done so far, counted from its events as they are recorded."""

    iterations: int = 0
    tool_calls: int = 0
    distillations: int = 0
    changed: bool = False

    def hear(self, event: Event) -> None:
        if event.kind == "model_call" and event.data.get("purpose") == "turn":
            self.iterations += 1
        elif event.kind == "tool_call":
            self.tool_calls += 1
        elif event.kind == "distillation":
            self.distillations += 1
        else:
            return
        self.changed = True

    def line(self) -> str:
        return f"{self.iterations} iterations, {self.tool_calls} tool calls, {self.distillations} distillations"


@dataclass
class _Playing:
    task: asyncio.Task[RunResult]
    progress: Progress
    cancel_reason: str | None = None
    started: float = field(default_factory=time.monotonic)


class RunService:
    """Runs of the agents in ``agents`` (loaded from ``agents_file``), on ``runtime``."""

    def __init__(self, agents: AgentsFile, *, agents_file: str | None = None, runtime: Runtime | None = None):
        self.agents = agents
        self.agents_file = agents_file
        self.runtime = runtime or Runtime()
        self.playing: dict[str, _Playing] = {}
        self.lineage = _inherited_lineage()
        """When an agent's run started this server as a tool source: the runs spawned here are its children."""

    # ------------------------------------------------------------------ agents

    def list_agents(self) -> list[dict[str, Any]]:
        return [_agent_row(name, spec) for name, spec in sorted(self.agents.agents.items())]

    def _spec(self, agent: Any, where: str = "agent") -> AgentSpec:
        if not isinstance(agent, str) or agent not in self.agents.agents:
            known = ", ".join(sorted(self.agents.agents)) or "none"
            raise ServiceError(f"{where}: no agent named {agent!r}. Known agents: {known}")
        return self.agents.agent(agent)

    def check_spawn(self, agent: Any, prompt: Any, context: Any, where: str = "") -> dict[str, Any]:
        """The overrides for one spawn, or ServiceError naming what is wrong (``where`` prefixes it)."""
        spec = self._spec(agent, f"{where}agent")
        try:
            check_input(prompt)
            return {"context": narrowed_context(spec, context, where=f"{where}context")} if context else {}
        except LoomError as exc:
            raise ServiceError(f"{where}{exc}" if not str(exc).startswith(where) else str(exc)) from None

    # ------------------------------------------------------------------ playing

    async def spawn(self, agent: str, prompt: str, context: dict[str, Any] | None = None) -> RunState:
        """Start a run of ``agent`` on ``prompt`` in the background; its task is in :attr:`playing`."""
        overrides = self.check_spawn(agent, prompt, context)
        if self.lineage and int(self.lineage.get("depth", 0)) > DEPTH_MAX:
            raise ServiceError(
                f"the run that started this server is at depth {int(self.lineage['depth']) - 1}; "
                f"spawns nest at most {DEPTH_MAX} deep, across MCP too"
            )
        try:
            run = await self.runtime.astart(
                agent,
                agents=self.agents,
                overrides=overrides,
                agents_file=self.agents_file,
                lineage=self.lineage,
                user=CLIENT_USER.get(),
            )
        except LoomError as exc:
            raise ServiceError(str(exc)) from None
        self._play(run, self.runtime.send(run, prompt))
        return run

    async def continue_(self, run_id: str, prompt: str) -> RunState:
        """Add ``prompt`` to a run that is not playing and play it in the background."""
        self.check_mine(run_id)
        self._not_playing(run_id, "continue")
        try:
            check_input(prompt)
            run = await self.runtime.reopen(run_id)
        except LoomError as exc:
            raise ServiceError(str(exc)) from None
        self._play(run, self.runtime.send(run, prompt))
        return run

    def _play(self, run: RunState, turn: Awaitable[RunResult]) -> None:
        progress = Progress()
        run.listeners.append(progress.hear)

        async def play() -> RunResult:
            try:
                return await turn
            except asyncio.CancelledError:
                if playing.cancel_reason is None:  # the server is stopping: the run stays resumable
                    raise
                return await self.runtime.cancel(run, reason=playing.cancel_reason)
            finally:
                self.playing.pop(run.run_id, None)

        playing = _Playing(asyncio.create_task(play(), name=f"run {run.run_id}"), progress)
        self.playing[run.run_id] = playing

    async def wait(self, run_id: str, timeout_s: float | None = None, report: Report | None = None) -> dict[str, Any]:
        """The run's result once it ends, or ``status: running`` when ``timeout_s`` passes
        first (the run goes on). ``report(progress, message)`` hears progress at most once
        a second. If the waiting call itself is cancelled, so is the run."""
        playing = self.playing.get(run_id)
        if playing is None:
            return await self.result(run_id)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not playing.task.done():
                left = PROGRESS_EVERY_S if deadline is None else min(PROGRESS_EVERY_S, deadline - time.monotonic())
                if left <= 0:
                    return {**await self.result(run_id), "status": "running"}
                await asyncio.wait({playing.task}, timeout=left)
                if report is not None and playing.progress.changed and not playing.task.done():
                    playing.progress.changed = False
                    await report(float(playing.progress.iterations), playing.progress.line())
        except asyncio.CancelledError:  # the client gave up on the request: the run stops with it
            self._cancel(playing, "the client cancelled the request that was waiting on the run")
            raise
        return playing.task.result().to_json()

    async def wait_all(self, run_ids: list[str], timeout_s: float | None) -> list[dict[str, Any]]:
        """:meth:`wait` on every run at once, under one deadline."""
        return list(await asyncio.gather(*(self.wait(r, timeout_s) for r in run_ids)))

    async def cancel(self, run_id: str) -> dict[str, Any]:
        """Stop a run: a turn in flight is cancelled, and the record gets ``cancelled``.
        Idempotent: a run that is done or already cancelled is returned as it is."""
        self.check_mine(run_id)
        playing = self.playing.get(run_id)
        if playing is not None:
            self._cancel(playing, "cancel_run")
            return (await asyncio.shield(playing.task)).to_json()
        try:
            return (await self.runtime.cancel(run_id, reason="cancel_run")).to_json()
        except LoomError as exc:
            raise ServiceError(str(exc)) from None

    @staticmethod
    def _cancel(playing: _Playing, reason: str) -> None:
        playing.cancel_reason = playing.cancel_reason or reason
        playing.task.cancel()

    async def compact(self, run_id: str) -> dict[str, Any]:
        self.check_mine(run_id)
        self._not_playing(run_id, "compact")
        try:
            return await self.runtime.compact(run_id)
        except LoomError as exc:
            raise ServiceError(str(exc)) from None

    async def fork(self, run_id: str, at: int | None = None) -> dict[str, Any]:
        """A fork of ``run_id`` at seq ``at`` (default: its last), parked for its next input."""
        self.check_mine(run_id)
        try:
            run = await self.runtime.fork(run_id, at=at)
        except LoomError as exc:
            raise ServiceError(str(exc)) from None
        return {**await self.result(run.run_id), "forked_from": {"run_id": run_id, "seq": run.view.fork_seq}}

    def check_mine(self, run_id: str) -> None:
        """Refuse ``run_id`` to a client bound to a user the run does not work for, as a run
        that is not there (its existence is another user's too)."""
        user = CLIENT_USER.get()
        if user is not None and self._user_of(run_id) != user:
            raise ServiceError(f"no run {run_id} for this client (its token is bound to user {user!r})")

    def _user_of(self, run_id: str) -> str | None:
        try:
            started = self.runtime.store.latest(run_id, "run_started")
        except LoomError:
            return None
        return None if started is None else started.data.get("user")

    def _not_playing(self, run_id: str, what: str) -> None:
        if run_id in self.playing:
            raise ServiceError(f"run {run_id} is playing a turn now: wait for it (get_run) or cancel_run, then {what}")

    async def close(self) -> None:
        """Stop the runs in flight as the server stops. Each is left as the record has it
        (active, not cancelled): `loomrt runs resume RUN_ID` picks it up."""
        tasks = [p.task for p in self.playing.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ the record

    async def result(self, run_id: str) -> dict[str, Any]:
        """The run's result as `loomrt run --json` prints it, from the record."""
        self.check_mine(run_id)
        try:
            run = await self.runtime.aopen(run_id)
        except LoomError as exc:
            raise ServiceError(str(exc)) from None
        status = "running" if run_id in self.playing else run.view.status
        return {**self.runtime.result(run).to_json(), "status": status}

    def get_run(self, run_id: str) -> dict[str, Any]:
        """The run's summary as a reader gets it: its output and Σ without private material."""
        from loomrt.visibility import private_record, redact_events, withhold

        store = self.runtime.store
        self.check_mine(run_id)
        try:
            info = store.get_run(run_id)
        except NotFoundError as exc:
            raise ServiceError(str(exc)) from None
        private = private_record(store, run_id)
        summary = run_summary(info, redact_events(store.events(run_id), private), store)
        if summary.get("state") is not None and private.state_withheld:  # Σ as the run hands it out
            # a fork's Σ is projected from its parent's shared history too, which is not redacted here
            summary["state"], _ = withhold(summary["state"], set(private.state_withheld))
            summary["state_withheld"] = private.state_withheld
        if run_id in self.playing:
            summary["status"] = "running"
        return summary

    def list_runs(self, agent: str | None, status: str | None, limit: int) -> list[dict[str, Any]]:
        if not 1 <= limit <= EVENTS_MAX:
            raise ServiceError(f"limit must be between 1 and {EVENTS_MAX}, not {limit}")
        rows = []
        user = CLIENT_USER.get()
        narrowed = status is not None or user is not None
        for info in self.runtime.store.list_runs(limit=EVENTS_MAX if narrowed else limit, agent=agent):
            if user is not None and self._user_of(info.run_id) != user:
                continue
            row = info.model_dump(mode="json")
            if info.run_id in self.playing:
                row["status"] = "running"
            if status is None or row["status"] == status:
                rows.append(row)
        return rows[:limit]

    def get_events(self, run_id: str, after_seq: int, limit: int, include_private: bool = False) -> dict[str, Any]:
        """A page of the record; private material is its placeholder unless ``include_private``
        (:func:`loomrt.visibility.reader_events`, judged on the whole record)."""
        from loomrt.visibility import reader_events

        if not 1 <= limit <= EVENTS_MAX:
            raise ServiceError(f"limit must be between 1 and {EVENTS_MAX}, not {limit}")
        self.get_run(run_id)  # an unknown run id is one clear error
        events = reader_events(self.runtime.store, run_id, include_private=include_private, after=max(0, after_seq))
        page = events[:limit]
        more = len(events) > limit
        return {
            "run_id": run_id,
            "events": [e.to_json_dict() for e in page],
            "next_seq": page[-1].seq if more else None,
        }

    async def recall(self, run_id: str, query: str, top_k: int, include_private: bool = False) -> dict[str, Any]:
        """Search one run's evicted spans (and its agent's permitted memory), as its Recall tool
        does; a private message's hit carries its placeholder unless ``include_private``."""
        from loomrt.visibility import placeholder

        if not 1 <= top_k <= 50:
            raise ServiceError(f"top_k must be between 1 and 50, not {top_k}")
        self.check_mine(run_id)
        try:
            run = await self.runtime.aopen(run_id)
        except LoomError as exc:
            raise ServiceError(str(exc)) from None
        recall = run.toolset.recall
        if recall is None:
            raise ServiceError(f"run {run_id}'s agent {run.agent!r} has recall off (context.recall: false)")
        hits = await recall.asearch(query, top_k)
        rows = [_hit_row(h) for h in hits]
        if not include_private:
            for row in rows:
                if row["source"] == "run" and row["seq"] in run.view.private:
                    row["text"] = placeholder(row["seq"], row["role"] or "tool")
        return {"run_id": run_id, "query": query, "hits": rows}

    # ------------------------------------------------------------------ durable memory

    def add_memory(self, scope: str, statement: str, cls: str = "fact", subject: str = "") -> dict[str, Any]:
        """Write ``statement`` to durable memory by hand, as `loomrt memory add` does (author:
        operator). A client bound to a user writes only that user's scope (``user`` names it),
        as ``user:NAME``: what a user's client wrote is not the operator's word."""
        from loomrt.harvest.db import has_place
        from loomrt.harvest.manual import add_statement
        from loomrt.harvest.wiring import memory_store

        user = CLIENT_USER.get()
        if scope == "user" and user is not None:
            scope = f"user:{user}"
        if user is not None and scope != f"user:{user}":
            raise ServiceError(
                f"this client's token is bound to user {user!r}: it may add memory to user:{user} only, not {scope!r}"
            )
        store = self.runtime.store
        if not has_place(store):
            raise ServiceError(
                "durable memory needs a record file or PostgreSQL, and this server's record is in memory"
            )
        try:
            added = add_statement(
                memory_store(store, self.runtime.embedder),
                scope,
                statement,
                cls=cls,
                subject=subject,
                by="mcp" if user is None else f"mcp:{user}",
                author="operator" if user is None else f"user:{user}",
            )
        except LoomError as exc:
            raise ServiceError(str(exc)) from None
        return added.to_dict()


def _inherited_lineage() -> dict[str, Any] | None:
    """``$LOOMRT_SPAWN_LINEAGE``, set by the run that started this server, or None."""
    import json
    import os

    from loomrt.mcp.sources import LINEAGE_ENV

    raw = os.environ.get(LINEAGE_ENV)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        return {
            "parent_run_id": str(data["parent_run_id"]),
            "root_run_id": str(data["root_run_id"]),
            "depth": int(data["depth"]),
        }
    except (ValueError, KeyError, TypeError):
        return None  # not ours to refuse: the server serves as a top-level one


def _agent_row(name: str, spec: AgentSpec) -> dict[str, Any]:
    return {
        "name": name,
        "description": spec.description,
        "mode": spec.context.mode,
        "model": spec.model,
        "tools": list(spec.tools),
        "recall": spec.context.recall,
        "harvest": spec.context.harvest_to_memory,
    }


def _hit_row(hit: Any) -> dict[str, Any]:
    row = {
        "text": hit.text,
        "score": round(float(hit.score), 4),
        "source": hit.source,
        "seq": hit.seq,
        "role": hit.role,
        "distillation_seq": hit.distillation_seq,
    }
    if hit.source == "memory":  # whose memory, and who wrote it: an operator by hand, or a run
        row.update({k: hit.extra[k] for k in ("scope", "author") if k in hit.extra})
    return row
