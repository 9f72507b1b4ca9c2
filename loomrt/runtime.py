"""The runtime: start, play, resume and continue runs.

One async core (:meth:`Runtime.astart`, :meth:`Runtime.send`, :meth:`Runtime.aopen`, ...);
:meth:`Runtime.run_sync`, :meth:`Runtime.stream`, and the sync :meth:`Runtime.start`,
:meth:`Runtime.open` and :meth:`Runtime.finish` are thin wrappers over it. The store is
awaited (:class:`loomrt.record.Store`'s async face). Every run works on a deep clone of its
agent definition, resolves its retention mode once, and resolves its toolset in
:func:`loomrt.toolset.resolve_toolset`; putting a run together (new, forked, or rebuilt
from its record) is :func:`loomrt.runtime_assembly.assemble`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar, cast

from pydantic import ValidationError

from loomrt._log import get_logger
from loomrt.activity import Watcher
from loomrt.driving import drive, inline_wanted
from loomrt.errors import (
    LoomError,
    NotFoundError,
    RunOwnedError,
    SpecError,
)
from loomrt.events import Event
from loomrt.messages import EvictedSpanCallback
from loomrt.providers import resolve_provider
from loomrt.providers.base import ModelProvider
from loomrt.recall.embedders import EmbedderChoice
from loomrt.record.coordination import Coordination
from loomrt.record.owners import (
    RUN_LEASE_S,
    Heartbeat,
    Heartbeats,
    append_out_of_band,
    owner_is_gone,
    worker_name,
)
from loomrt.record.sqlite import default_store
from loomrt.record.store import Store
from loomrt.run.between_turns import between_turns
from loomrt.run.distil import maybe_distil
from loomrt.run.loop import add_user_input, close_interrupted_calls, play_turn
from loomrt.run.modes import mode_for
from loomrt.run.state import RunResult, RunState
from loomrt.runtime_assembly import assemble
from loomrt.spec import AgentsFile, AgentSpec
from loomrt.tools import Tool
from loomrt.visibility import withhold

__all__ = ["Runtime", "drive"]

ProviderFactory = Callable[[AgentSpec, str], ModelProvider]
T = TypeVar("T")


def _coordination_of(store: Store) -> Coordination:
    """The store's own leases and claims (both stores keep them). A store of your own without
    them still plays runs that nothing claims: a claim or a lease on it is what fails."""
    return cast(Coordination, store)


class Runtime:
    """Runs agents against a store.

    ``providers`` maps an agent definition and model string to a provider (default:
    :func:`loomrt.providers.resolve_provider`); ``tools`` adds tools to the built-ins;
    ``callbacks`` receive every evicted span of every run; ``listeners`` receive every
    event every run records (the CLI renders them live); ``watchers`` hear what every run
    does now and its answer as it is written (:mod:`loomrt.activity`; the CLI's status line
    and streamed answer); ``embedder`` and ``memory`` are
    handed to Recall; ``user`` names the ``user`` memory scope of its runs (default
    ``$LOOMRT_USER``; ``astart(user=...)`` for one run).
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        providers: ProviderFactory | None = None,
        tools: dict[str, Tool] | list[Tool] | None = None,
        callbacks: list[EvictedSpanCallback] | None = None,
        embedder: EmbedderChoice = None,
        memory: Any = None,
        listeners: list[Callable[[Event], None]] | None = None,
        watchers: list[Watcher] | None = None,
        user: str | None = None,
        owner: str | None = None,
        coordination: Coordination | None = None,
    ):
        self.store = store or default_store()
        self.coordination: Coordination = coordination or _coordination_of(self.store)
        """Leases and run claims (:mod:`loomrt.record.coordination`): the store's own by default
        (both stores keep them beside the log, in the same database)."""
        self.owner = owner or (worker_name() if getattr(self.store, "shared", False) else None)
        """The worker name this runtime claims the runs it plays under (:mod:`loomrt.record.owners`):
        ``owner``, else this process's on a store that several machines share (PostgreSQL),
        else None (one machine: nothing to claim)."""
        self.claim_ttl_s = RUN_LEASE_S
        """How long a claim holds without an append or a heartbeat."""
        self.heartbeat_s = RUN_LEASE_S / 3
        """How often a playing turn renews its run's claim (apart from its appends)."""
        self._heartbeats: Heartbeats | None = None
        """The one thread that renews the claims of the turns playing now (started on first use)."""
        self.providers = providers or (lambda spec, model: resolve_provider(spec, model))
        self.tools = {t.name: t for t in tools} if isinstance(tools, list) else dict(tools or {})
        self.callbacks = list(callbacks or [])
        self.embedder = embedder
        self.memory = memory
        self.listeners = list(listeners or [])
        self.watchers = list(watchers or [])
        self.user = (user or os.environ.get("LOOMRT_USER") or "").strip() or None
        """Whom runs work for (the ``user`` memory scope): ``user``, else ``$LOOMRT_USER``."""

    # ------------------------------------------------------------------ starting

    def start(self, agent: AgentSpec | str, **kw: Any) -> RunState:
        """:meth:`astart` for code that is not async (with a store that completes inline)."""
        return drive(self.astart(agent, **kw))

    async def astart(
        self,
        agent: AgentSpec | str,
        *,
        agents: AgentsFile | None = None,
        mode: str | None = None,
        overrides: dict[str, Any] | None = None,
        interactive: bool = False,
        agents_file: str | None = None,
        name: str | None = None,
        parent: RunState | None = None,
        lineage: dict[str, Any] | None = None,
        user: str | None = None,
    ) -> RunState:
        """Create a run: clone the definition, resolve mode and toolset, record ``run_started``.
        ``parent`` makes it a sub-agent of that run (lineage and depth on the record);
        ``lineage`` says the same of a parent in another process (``loomrt mcp`` spawned by
        an agent): ``{parent_run_id, root_run_id, depth}``."""
        name, spec = self._definition(agent, agents, name)
        changes = dict(overrides or {})
        if mode:
            changes["context"] = {**changes.get("context", {}), "mode": mode}
        try:
            spec = spec.clone(**changes)  # the shared definition is never mutated
        except ValidationError as exc:
            err = exc.errors()[0]
            raise SpecError(err["msg"].removeprefix("Value error, "), path=".".join(map(str, err["loc"]))) from None
        run_id = uuid.uuid4().hex[:12]
        lineage = dict(lineage or {})
        if parent is not None:
            lineage = {
                "parent_run_id": parent.run_id,
                "root_run_id": parent.root_run_id or parent.run_id,
                "depth": parent.depth + 1,
            }
        if parent is not None and user is None:  # a sub-agent works for its parent's user
            started = await self.off_loop(self.store.latest, parent.run_id, "run_started")
            user = started.data.get("user") if started is not None else None
        identity = {
            k: v for k, v in (("user", user or self.user), ("project", agents.project if agents else None)) if v
        }
        return await assemble(
            self,
            run_id,
            name,
            spec,
            interactive=interactive,
            agents_file=agents_file,
            history=None,
            agents=agents,
            lineage=lineage,
            identity=identity,
        )

    def _definition(self, agent: AgentSpec | str, agents: AgentsFile | None, name: str | None) -> tuple[str, AgentSpec]:
        if isinstance(agent, AgentSpec):
            return name or "agent", agent
        if agents is None or agent not in agents.agents:
            known = ", ".join(sorted(agents.agents)) if agents else "none loaded"
            raise NotFoundError(f"no agent named {agent!r}. Known agents: {known}")
        return agent, agents.agent(agent)

    # ------------------------------------------------------------------ playing

    async def send(self, run: RunState, text: str, *, said_at: float | None = None) -> RunResult:
        """Add one user input to ``run`` and play until it answers (or parks). A run that has
        ended (done, failed or cancelled) is opened again first: ``resumed`` is recorded, as
        :meth:`reopen` does (the event grammar, :mod:`loomrt.record.grammar`). ``said_at``:
        when the words were said (epoch seconds), replaying a history from elsewhere."""
        if run.view.status in ("done", "failed", "cancelled"):
            await run.add("resumed", {"from_seq": run.last_seq, "input": "continue"})
        if run.mode.between_turns and run.mode.queued(run.view):  # no chat wrote it while the user typed
            await between_turns(run, self.coordination)
        await add_user_input(run, text, said_at=said_at)
        return await self._play(run)

    async def _play(self, run: RunState) -> RunResult:
        log = get_logger(run_id=run.run_id, agent=run.agent, mode=run.mode.name)
        try:
            with self._turn_heartbeat(run):
                await play_turn(run)
        except LoomError as exc:
            log.info("turn failed", error=str(exc), last_seq=run.last_seq)
            if run.interactive:  # one failed turn never ends a chat: the run parks for the next input
                await close_interrupted_calls(run)
                await run.add("parked", {"output": run.output, "after_error": str(exc)})
            return self.result(run, error=str(exc))
        finally:
            if run.view.status != "parked":  # the run ended (or failed): its tool sources stop
                await run.toolset.close_sources()
            if self.owner is not None and run.epoch is not None and run.view.status in ("done", "failed", "cancelled"):
                # an ended run holds no worker
                await self.off_loop(self.coordination.release_run, run.run_id, self.owner, run.epoch)
                run.epoch = None
        log.info("turn done", model_calls=run.model_calls, distillations=run.distillations)
        return self.result(run)

    async def run(self, agent: AgentSpec | str, prompt: str, **kw: Any) -> RunResult:
        """A one-shot run: start, send ``prompt``, return the result (status done or failed)."""
        return await self.send(await self.astart(agent, **kw), prompt)

    def run_sync(self, agent: AgentSpec | str, prompt: str, **kw: Any) -> RunResult:
        """:meth:`run` for code that is not async."""
        return asyncio.run(self.run(agent, prompt, **kw))

    async def stream(self, agent: AgentSpec | str, prompt: str, **kw: Any) -> AsyncIterator[Event]:
        """A one-shot run that yields each event as it is recorded."""
        run = await self.astart(agent, **kw)
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        for e in await self.store.read(run.run_id):
            queue.put_nowait(e)
        run.listeners.append(queue.put_nowait)

        async def play() -> None:
            try:
                await self.send(run, prompt)
            finally:
                queue.put_nowait(None)

        task = asyncio.create_task(play())
        while (event := await queue.get()) is not None:
            yield event
        await task

    def finish(self, run: RunState) -> RunResult:
        """:meth:`afinish` for code that is not async."""
        return drive(self.afinish(run))

    async def afinish(self, run: RunState) -> RunResult:
        """End an interactive run: record ``final`` with its last answer."""
        await run.add("final", {"output": run.output, "state": run.state})
        await run.toolset.close_sources()
        return self.result(run)

    # ------------------------------------------------------------------ from the record

    def open(self, run_id: str) -> RunState:
        """:meth:`aopen` for code that is not async."""
        return drive(self.aopen(run_id))

    async def aopen(self, run_id: str) -> RunState:
        """Rebuild a run from its record alone (definition, mode, context, Σ, recall index)."""
        info = await self.off_loop(self.store.get_run, run_id)
        events = await self.store.read(run_id)
        if not events or events[0].kind != "run_started":
            raise NotFoundError(f"run {run_id} has no run_started event; its record is incomplete")
        spec = AgentSpec.model_validate(events[0].data["definition"])
        run = await assemble(
            self, run_id, info.agent, spec, interactive=info.interactive, agents_file=info.agents_file, history=events
        )
        for provider in {id(run.provider): run.provider, id(run.summarizer): run.summarizer}.values():
            advance = getattr(provider, "advance", None)
            if callable(advance):  # a scripted model picks up where the record left off
                advance(run.view.turn_calls, run.view.summary_calls)
        return run

    def _heartbeat(self, run: RunState) -> contextlib.AbstractContextManager[Any]:
        """While a turn of a claimed run plays, its claim is renewed apart from its appends
        (a model call longer than the claim's ttl keeps the run)."""
        if self.owner is None or run.epoch is None:
            return contextlib.nullcontext()
        return Heartbeat(
            self.coordination, run.run_id, self.owner, run.epoch, ttl_s=self.claim_ttl_s, every_s=self.heartbeat_s
        )

    def _turn_heartbeat(self, run: RunState) -> contextlib.AbstractContextManager[Any]:
        """:meth:`_heartbeat` for a turn played on the event loop: the claim is held by the
        runtime's one heartbeat thread (:class:`~loomrt.record.owners.Heartbeats`), so a turn
        starts and joins no thread of its own."""
        if self.owner is None or run.epoch is None:
            return contextlib.nullcontext()
        if self._heartbeats is None:
            self._heartbeats = Heartbeats()
        return self._heartbeats.hold(
            self.coordination, run.run_id, self.owner, run.epoch, ttl_s=self.claim_ttl_s, every_s=self.heartbeat_s
        )

    @contextlib.contextmanager
    def holding(self, run: RunState) -> Iterator[None]:
        """Out-of-band work on a run that is not playing here (a refold, a compaction, a
        worker's queued fold) writes through the run's claim: taken for the block, so its
        appends are fenced like the owner's, and let go after, unless this worker held it
        already. :class:`~loomrt.errors.RunOwnedError` while another worker plays the run."""
        if self.owner is None or run.epoch is not None:
            yield
            return
        held = any(c["run_id"] == run.run_id and c["owner"] == self.owner for c in self.coordination.run_owners())
        self.claim(run)
        try:
            with self._heartbeat(run):  # a summary longer than the claim's ttl keeps the run
                yield
        finally:
            if not held and run.epoch is not None:
                self.coordination.release_run(run.run_id, self.owner, run.epoch)
                run.epoch = None

    def claim(self, run: RunState) -> None:
        """Make ``run`` this worker's to play (with an :attr:`owner`): its epoch fences every
        append it makes; :class:`~loomrt.errors.RunOwnedError` while another worker's claim is live.
        Without an owner (one machine, a foreground command), the run is refused all the same
        while a worker that still runs holds it (``run --detach`` played by ``loomrt worker``)."""
        if self.owner is not None:
            run.epoch = self.coordination.claim_run(run.run_id, self.owner, self.claim_ttl_s)
            return
        for c in self.coordination.run_owners():
            if c["run_id"] == run.run_id and not c["released"] and not owner_is_gone(c["owner"]):
                raise RunOwnedError(
                    f"run {run.run_id} is being played by worker {c['owner']} (its claim holds for "
                    f"{c['expires_in_s']:.0f} s more). Wait for its turn to end, then send this input again "
                    "(`loomrt workers list` shows the live claims)."
                )

    async def aclaim(self, run: RunState) -> None:
        """:meth:`claim` from async code: on a store that waits on I/O (``aclaim_run``), the
        claim is awaited, never blocking the event loop the other runs play on."""
        claim = getattr(self.coordination, "aclaim_run", None)
        if self.owner is not None and claim is not None:
            run.epoch = await claim(run.run_id, self.owner, self.claim_ttl_s)
            return
        self.claim(run)

    async def resume(self, run_id: str) -> RunResult:
        """Pick up a run that stopped mid-turn (a crash, a provider error) from its record."""
        run = await self.aopen(run_id)
        if run.view.status in ("done", "cancelled") or (
            run.view.status == "parked" and not run.view.parked_after_error
        ):
            return self.result(run)
        await self.aclaim(run)
        return await self.play_resumed(run)

    async def play_resumed(self, run: RunState) -> RunResult:
        """Play a claimed run on from where its record stopped: ``resumed`` is recorded, the
        tool calls a stop interrupted are closed, and the turn plays (a resume, a worker's take)."""
        await run.add("resumed", {"from_seq": run.last_seq})
        await close_interrupted_calls(run)
        return await self._play(run)

    async def continue_run(self, run_id: str, prompt: str, *, interactive: bool | None = None) -> RunResult:
        """Add a new user input to an existing run (done, parked, failed or cancelled) and play it."""
        return await self.send(await self.reopen(run_id, interactive=interactive), prompt)

    async def reopen(self, run_id: str, *, interactive: bool | None = None) -> RunState:
        """Open a run to take a new input: ``resumed`` is recorded, interrupted tool calls closed."""
        run = await self.aopen(run_id)
        if interactive is not None:
            run.interactive = interactive
        await self.aclaim(run)
        await run.add("resumed", {"from_seq": run.last_seq, "input": "continue"})
        await close_interrupted_calls(run)
        return run

    async def cancel(self, run: RunState | str, *, reason: str) -> RunResult:
        """Record ``cancelled`` on a run that has not ended (idempotent: a run that is done or
        already cancelled is left as it is). The caller stops any turn in flight first."""
        if isinstance(run, str):
            run = await self.aopen(run)
        if run.view.status not in ("done", "cancelled"):
            try:
                with self.holding(run):  # parked: claimed for the write, fenced, let go
                    await run.add("cancelled", {"reason": reason, "output": run.output})
            except RunOwnedError:  # another worker plays it: handed over, it stops at its next step
                append_out_of_band(self.store, run.run_id, "cancelled", {"reason": reason, "output": run.output})
                run = await self.aopen(run.run_id)
        return self.result(run)

    async def fork(self, run_id: str, *, at: int | None = None) -> RunState:
        """A new run that shares ``run_id``'s history up to seq ``at`` (default: all of it)
        and goes on from there on its own: its record says ``forked_from {run_id, seq}``
        and its seqs continue after ``at``. In fold mode it starts from the parent's catalog
        trimmed at ``at`` (no text copied, the same cost at any history length); in the
        other modes it replays the parent's record up to ``at``. It waits, parked, for its
        next input (``loomrt runs continue``)."""
        info = self.store.get_run(run_id)
        at = info.last_seq if at is None else at
        if not (info.fork_seq or 0) < at <= info.last_seq:
            if info.forked_from and 0 < at <= (info.fork_seq or 0):
                return await self.fork(info.forked_from, at=at)  # that part of its history is its parent's
            raise NotFoundError(
                f"run {run_id} has no seq {at} to fork at (its seqs run to {info.last_seq}); "
                f"`loomrt runs show {run_id}` lists them"
            )
        started = self.store.latest(run_id, "run_started")
        if started is None:
            raise NotFoundError(f"run {run_id} has no run_started event; its record is incomplete")
        spec = AgentSpec.model_validate(started.data["definition"])
        mode = mode_for(started.data["mode"])
        fork: dict[str, Any] = {"forked_from": {"run_id": run_id, "seq": at}}
        catalog = mode.fork_catalog(self.store, run_id, at)
        if catalog is not None:
            fork["catalog"] = catalog
        new_id = uuid.uuid4().hex[:12]
        identity = {k: started.data[k] for k in ("user", "project") if started.data.get(k)}
        return await assemble(
            self,
            new_id,
            info.agent,
            spec,
            interactive=info.interactive,
            agents_file=info.agents_file,
            history=None,
            fork=fork,
            identity=identity,
        )

    async def refold(self, run_id: str, *, fallback_only: bool = False, model: str | None = None) -> dict[str, Any]:
        """Write new cards for a fold run's catalog (old cards stay; the catalog moves to the
        new ones): all of them, or only the fallbacks with ``fallback_only``; by ``model``
        instead of the run's summariser if given. What changed, as a dict."""
        run = await self.aopen(run_id)
        if model:
            run.summarizer = self.providers(run.spec, model)
        before = run.estimate()
        with self.holding(run):
            changed = await maybe_distil(
                run, force=True, require_smaller=False, reduce=lambda r: r.mode.refold(r, fallback_only=fallback_only)
            )
        last = self.store.latest(run_id, "distillation") if changed else None
        declined = None if changed else self.store.latest(run_id, "distillation_declined")
        return {
            "run_id": run_id,
            "refolded": (last.data.get("folds") or {}).get("refolded", 0) if last else 0,
            "tokens_before": before,
            "tokens_after": run.estimate(),
            "fallbacks_left": sum(1 for m in run.context if m.ref in run.view.cards and run.view.cards[m.ref].fallback),
            "reason": None if changed else (declined.data.get("reason") if declined else "no card to refold"),
        }

    async def off_loop(self, call: Callable[..., T], *args: Any) -> T:
        """A sync store call from async code: on a store that waits on I/O (shared: PostgreSQL)
        made on a worker thread, so the event loop the other runs play on is never blocked;
        on SQLite, inline (a local file: a thread hop would cost more than the call)."""
        if getattr(self.store, "shared", False) and not inline_wanted():  # drive(): no loop to leave
            return await asyncio.to_thread(call, *args)
        return call(*args)

    async def compact(self, run_id: str) -> dict[str, Any]:
        """Distil a run that is not playing now, whatever its pressure: the tokens of its
        working context before and after, or why it was declined."""
        run = await self.aopen(run_id)
        before = run.estimate()
        if run.mode.name == "append" and run.mode.threshold_pct(run) is None:
            return {
                "run_id": run_id,
                "mode": run.mode.name,
                "distilled": False,
                "tokens_before": before,
                "tokens_after": before,
                "reason": "append mode keeps everything (context.backstop is off)",
            }
        heard: list[Event] = []
        run.listeners.append(heard.append)
        with self.holding(run):
            distilled = await maybe_distil(run, force=True)
        reason = (
            None
            if distilled
            else next((e.data.get("reason") for e in heard if e.kind == "distillation_declined"), None)
        )
        return {
            "run_id": run_id,
            "mode": run.mode.name,
            "distilled": distilled,
            "tokens_before": before,
            "tokens_after": run.estimate(),
            "reason": reason,
        }

    def usage_of(self, run_id: str) -> dict[str, int]:
        """The tokens of a run and every run under it (its sub-agents, theirs, ...)."""
        total = {"input_tokens": 0, "output_tokens": 0, "model_calls": 0}
        for e in self.store.events(run_id, kinds=["model_call"]):
            u = e.data.get("usage") or {}
            total["input_tokens"] += int(u.get("input_tokens", 0))
            total["output_tokens"] += int(u.get("output_tokens", 0))
            total["model_calls"] += 1
        for child in self.store.children(run_id):
            for key, value in self.usage_of(child.run_id).items():
                total[key] += value
        return total

    def result(self, run: RunState, *, error: str | None = None) -> RunResult:
        """What the run hands out: Σ without its private keys (``runs show`` has them all)."""
        state, withheld = withhold(run.state, getattr(run.view.slot, "private_keys", set()))
        return RunResult(
            run_id=run.run_id,
            agent=run.agent,
            mode=run.mode.name,
            status="failed" if error else run.view.status,
            output=run.output,
            state=state,
            usage=run.usage,
            model_calls=run.model_calls,
            distillations=run.distillations,
            error=error,
            state_withheld=tuple(withheld),
        )
