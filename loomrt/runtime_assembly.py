"""Putting a run together: its provider and summariser, its retention mode, its view of the
record, its toolset (the spawn tools among it) and, for a new run or a fork, the
``run_started`` event with its system prompt. Every run a :class:`~loomrt.runtime.Runtime`
plays is assembled here, whether it starts, forks or is rebuilt from its record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomrt.crashpoints import reached
from loomrt.errors import LoomError
from loomrt.events import Event, RunInfo
from loomrt.run.family import Family
from loomrt.run.modes import mode_for, resolve_mode
from loomrt.run.pins import definition_pins_text
from loomrt.run.projection import message_limit, project
from loomrt.run.state import RunState
from loomrt.spec import SPAWN_TOOLS, AgentsFile, AgentSpec, definition_hash
from loomrt.toolset import resolve_toolset

if TYPE_CHECKING:
    from loomrt.runtime import Runtime

__all__ = ["assemble"]


async def assemble(
    rt: Runtime,
    run_id: str,
    name: str,
    spec: AgentSpec,
    *,
    interactive: bool,
    agents_file: str | None,
    history: list[Event] | None,
    agents: AgentsFile | None = None,
    lineage: dict[str, Any] | None = None,
    fork: dict[str, Any] | None = None,
    identity: dict[str, str] | None = None,
) -> RunState:
    """The :class:`RunState` of ``run_id``, assembled with ``rt``'s providers, store, tools and
    listeners. With ``history`` (its record) it is rebuilt from it, in the mode recorded; without,
    it is a new run (a fork, with ``fork``): claimed for ``rt``'s worker, with its ``run_started``
    recorded. ``lineage`` places it under a parent; ``identity`` is whom it works for."""
    provider = rt.providers(spec, spec.model)
    summarizer = rt.providers(spec, spec.context.summarizer_model) if spec.context.summarizer_model else provider
    requested = spec.context.mode
    if history:
        resolved = history[0].data["mode"]
    else:
        resolved = resolve_mode(
            requested,
            provider.capabilities,
            interactive=interactive,
            has_schema=spec.context.state_schema is not None,
        )
    mode = mode_for(resolved)
    lineage = dict(lineage or {})
    identity = dict(identity or {})  # whom the run works for: its user and project memory scopes
    if history:
        lineage = {k: history[0].data[k] for k in ("parent_run_id", "root_run_id", "depth") if k in history[0].data}
        identity = {k: history[0].data[k] for k in ("user", "project") if history[0].data.get(k)}
    run = RunState(
        run_id=run_id,
        agent=name,
        spec=spec,
        mode=mode,
        interactive=interactive,
        store=rt.store,
        provider=provider,
        summarizer=summarizer,
        listeners=list(rt.listeners),
        watchers=list(rt.watchers),
        **lineage,
    )
    if history is None and rt.owner is not None:
        await rt.aclaim(run)  # a new run is this worker's from its first event (a foreground one has nothing to check)
    if history:
        run.view = project(history, mode=mode, store=rt.store)
    elif fork:
        run.view.family = Family.of(rt.store, fork["forked_from"])
    spawn = None
    if any(t in SPAWN_TOOLS for t in spec.tools):
        from loomrt.children import Children

        spawn = Children(rt, run, agents or (lambda: _agents_at(agents_file)), agents_file).spawn
    below = {"parent_run_id": run_id, "root_run_id": run.root_run_id or run_id, "depth": run.depth + 1}
    run.toolset = resolve_toolset(
        spec,
        run_id=run_id,
        agent=name,
        registry=rt.tools,
        memory=rt.memory,
        embedder=rt.embedder,
        history=history,
        emit=run.emit,
        spawn=spawn,
        lineage=below,
        run=run,
        user=identity.get("user"),
        project=identity.get("project"),
    )
    run.callbacks = [*run.toolset.callbacks, *rt.callbacks]
    if history is None:
        system = "\n\n".join(
            x
            for x in [
                spec.system_text(),
                definition_pins_text(spec.context.pins),
                *mode.system_lines(spec),
                *run.toolset.prompt_lines,
            ]
            if x
        )
        info = RunInfo(
            run_id=run_id,
            agent=name,
            def_hash=definition_hash(spec),
            mode=resolved,
            model=spec.model,
            interactive=interactive,
            agents_file=agents_file,
            parent_run_id=run.parent_run_id,
            root_run_id=run.root_run_id,
            forked_from=(fork or {}).get("forked_from", {}).get("run_id"),
            fork_seq=(fork or {}).get("forked_from", {}).get("seq"),
        )
        if fork:  # a fork waits for its first input: parked in the same transaction as its start
            run.emit("parked", {"output": None})
        async with run.atomic():  # the run and its first event: a crash leaves both or neither
            await rt.store.write_run(info)
            await run.add(
                "run_started",
                {
                    "agent": name,
                    "def_hash": definition_hash(spec),
                    "definition": spec.model_dump(mode="json"),
                    "requested_mode": requested,
                    "mode": resolved,
                    "model": spec.model,
                    "interactive": interactive,
                    "tools": sorted(run.toolset.tools),
                    "system": system,
                    "local": provider.capabilities.local,
                    "budget": run.budget,
                    "message_max_tokens": message_limit(spec.context.model_dump(), run.budget),
                    **lineage,
                    **(fork or {}),
                    **identity,
                },
            )
            if fork:
                reached("in_fork")
    return run


def _agents_at(path: str | None) -> AgentsFile | None:
    """The agents file a run was started from, read again (a resumed parent spawns from it)."""
    if not path:
        return None
    from loomrt.spec_load import load_agents

    try:
        return load_agents(path)
    except LoomError:
        return None  # the spawn tools say so when they are called
