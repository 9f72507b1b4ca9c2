"""The one place where a run's toolset is resolved.

Every site that starts or restarts a run (one-shot, interactive, continue, resume, and
later sub-agent spawn and MCP spawn) calls :func:`resolve_toolset`. It turns the agent's
``tools:`` allowlist into tools (default-deny), and grants what the ``context:`` block
implies: the retention mode's own tools (fold's Describe, Expand and Grep),
``model_pins: true`` the Pin tool, ``recall: true`` the Recall tool, the recall index callback and one line of
system prompt; an allowlisted ``SERVER.TOOL`` (or ``SERVER.*``) of ``mcp_servers`` adds a
tool source, started when the run first needs its tools. Granting Recall widens the allowlist, never the trust boundary: it reads
only this run's evicted spans and the agent's permitted memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loomrt.errors import SpecError
from loomrt.events import Event
from loomrt.recall.embedders import EmbedderChoice
from loomrt.spec import SPAWN_TOOLS, AgentSpec
from loomrt.tools import BUILTIN_TOOLS, Tool, Toolset

__all__ = ["Toolset", "resolve_toolset"]


def resolve_toolset(
    spec: AgentSpec,
    *,
    run_id: str,
    emit: Callable[[str, dict[str, Any]], Any],
    registry: dict[str, Tool] | None = None,
    memory: Any = None,
    embedder: EmbedderChoice = None,
    history: list[Event] | None = None,
    agent: str = "",
    spawn: Any = None,
    lineage: dict[str, Any] | None = None,
    run: Any = None,
    user: str | None = None,
    project: str | None = None,
) -> Toolset:
    """Resolve the toolset of run ``run_id``.

    ``registry`` maps tool names to tools (built-ins plus the runtime's own);
    ``memory`` is an optional durable-memory source for Recall's fallback;
    ``history`` is the run's record so far, from which a resumed run rebuilds its recall index;
    ``emit(kind, data)`` records an event on the run;
    ``spawn`` starts sub-agents (:meth:`loomrt.children.Children.spawn`), for the spawn tools;
    ``lineage`` is what a run this one causes elsewhere inherits (an MCP server it starts is
    told, so a `loomrt mcp` there counts its spawns' depth from this run's);
    ``run`` is the run itself (a :class:`loomrt.run.state.RunState`): its retention mode
    grants its own tools (fold: Describe, Expand, Grep) and ``context.model_pins`` the Pin
    tool, which read and write that run;
    ``user`` and ``project`` name the run's ``user`` and ``project`` memory scopes: with
    ``context.memory_scopes`` Recall reads those durable memories, and with
    ``context.harvest_to_memory`` the harvest bank (:mod:`loomrt.harvest`) banks each
    evicted span for the consolidator.
    """
    registry = {**BUILTIN_TOOLS, **(registry or {})}
    toolset = Toolset()
    for i, name in enumerate(spec.tools):
        if name == "Recall" or "." in name or name in SPAWN_TOOLS:
            continue  # granted below: Recall (the spec insists on context.recall: true), SERVER.TOOL, spawn
        if name not in registry:
            raise SpecError(
                f"unknown tool {name!r}. Known tools: {', '.join(sorted(registry))}",
                path=f"agents.{agent}.tools[{i}]" if agent else f"tools[{i}]",
            )
        toolset.tools[name] = registry[name]
    granted = [t for t in SPAWN_TOOLS if t in spec.tools]
    if granted:
        if spawn is None:
            raise SpecError(
                "this run cannot spawn sub-agents here (no runtime gave it a spawn callable)",
                path=f"agents.{agent}.tools" if agent else "tools",
            )
        from loomrt.spawn_tools import spawn_tools

        offered = spawn_tools(spawn, spec.spawnable)
        toolset.tools.update({name: offered[name] for name in granted})
    for server in spec.mcp_servers:
        allowed = [
            name.partition(".")[2] for name in spec.tools if name.partition(".")[0] == server.name and "." in name
        ]
        if allowed:
            from loomrt.mcp.sources import McpSource

            toolset.sources.append(McpSource(server, allowed, emit, lineage=lineage))
    if run is not None:
        for granted_tool in run.mode.granted_tools(run):
            toolset.tools[granted_tool.name] = granted_tool
        if spec.context.model_pins:
            from loomrt.run.pins import pin_tool

            toolset.tools["Pin"] = pin_tool(run)
    scopes: list[str] | None = None
    if spec.context.memory_scopes or spec.context.harvest_to_memory:
        from loomrt.harvest.wiring import wire
        from loomrt.spec import definition_hash

        view = getattr(run, "view", None)
        harvest = wire(
            spec,
            run_id=run_id,
            agent=agent,
            store=getattr(run, "store", None),
            user=user,
            project=project,
            emit=emit,
            private=lambda: set(getattr(view, "private", ()) or ()),
            def_hash=definition_hash(spec),
            history=history,
            memory=memory,
            embedder=embedder,
        )
        memory, scopes = harvest.memory, list(harvest.scopes)
        if harvest.bank is not None:
            toolset.callbacks.append(harvest.bank.on_evicted)
    if spec.context.recall:
        from loomrt.recall import RECALL_PROMPT, RunRecall

        family = getattr(getattr(run, "view", None), "family", None)
        store = getattr(run, "store", None)
        sources = _shared_recall(store, family, spec, embedder) if family is not None else None
        recall = RunRecall(
            run_id=run_id,
            context=spec.context,
            emit=emit,
            embedder=embedder,
            memory=memory,
            history=[*family.events(), *(history or [])] if family is not None and sources is None else history,
            shared_runs=[r for r, _ in family.links] if family is not None else (),
            family=sources or (),
            scopes=scopes,
        )
        if store is not None:
            from loomrt.recall.shared import offer

            offer(store, run_id, recall)
            if family is not None and sources is None:  # the parent's history, rebuilt: the next fork reads it
                offer(store, family.links[0][0], recall, known=family.fork_seq)
        if run is not None:
            from loomrt.visibility import visible_to

            recall.visible = visible_to(run.view)
        toolset.recall = recall
        toolset.callbacks.append(recall.on_evicted)
        if spec.context.recall_tool:
            toolset.tools[recall.tool.name] = recall.tool
            toolset.prompt_lines.append(RECALL_PROMPT)
    return toolset


def _shared_recall(store: Any, family: Any, spec: AgentSpec, embedder: EmbedderChoice) -> list[Any] | None:
    """The recall indexes of this process a fork reads its shared history from instead of
    rebuilding it (:func:`loomrt.recall.shared.family_sources`), or None."""
    if store is None:
        return None
    from loomrt.recall.embedders import resolve_embedder
    from loomrt.recall.index import Fusion
    from loomrt.recall.shared import family_sources

    try:
        wanted = resolve_embedder(embedder)
    except TypeError:
        wanted = None
    name = getattr(wanted, "name", type(wanted).__name__) if wanted is not None else None
    cap = int(spec.context.recall_max_entries)

    def compatible(holder: Any) -> bool:
        index = holder._index
        have = getattr(index.embedder, "name", type(index.embedder).__name__) if index.embedder is not None else None
        return have == name and index.max_entries == cap and index.fusion == Fusion()

    def distilled_between(run_id: str, after: int, until: int) -> bool:
        """Whether a distillation of ``run_id`` in (after, until] evicted messages (a rollup
        of cards alone evicts none: recall has nothing of it)."""
        return any(
            e.data.get("span_seqs") for e in store.events(run_id, after=after, until=until, kinds=["distillation"])
        )

    return family_sources(store, family.links, distilled_between, compatible)
