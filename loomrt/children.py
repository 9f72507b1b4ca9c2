"""Sub-agents: a run spawns child runs, and gets back one row per child.

:class:`Children` is the ``spawn`` callable :func:`~loomrt.toolset.resolve_toolset` hands
the spawn tools (:mod:`loomrt.spawn_tools`); the Runtime makes one per parent run. A call:

1. **checks** every entry before any child starts (spawnable, the child's definition, the
   prompt, the per-spawn ``context`` override, which narrows and never widens, the timeout
   against ``max_child_timeout_s``, the depth), and admits the batch whole or not at all
   against ``max_live_children``; a bad entry refuses the call and names its index;
2. **plays** the children, at most ``max_concurrent_children`` at once (time queued is not
   the child's), each under its own timeout; a child that fails, times out or runs out of
   iterations is a row, never an exception;
3. **records** the spawn ledger on the parent's record: ``spawn_child_started`` when a
   child starts, ``spawn_child_result`` (the full result) when it ends. A parent resumed
   after a crash calls again with the same call id: finished children come from the
   ledger (or the child's own record), unfinished ones are resumed under their own ids;
4. **caps** the rows: together at most a quarter of the parent's budget, shared equally; a
   Σ is kept whole or left out whole (``state_omitted``), text is cut with a note naming
   the run that holds it;
5. **reduces** Σ: a stateful parent with ``children_state`` gets each child's Σ merge-patched
   into its own, at ``into``, without a model call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loomrt.crashpoints import reached
from loomrt.errors import LoomError, SpecError
from loomrt.overrides import narrowed_context
from loomrt.run.loop import check_input
from loomrt.run.state import RunResult, RunState
from loomrt.tokens import count_text
from loomrt.tools import CURRENT_CALL
from loomrt.visibility import answer_for_another_run

if TYPE_CHECKING:
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentsFile

__all__ = ["Children", "SpawnRefused", "spawn_row", "DEPTH_MAX", "SPAWN_MAX", "ROW_KEYS"]

DEPTH_MAX = 3
"""How deep spawns may nest: a top-level run is depth 0, its children 1, ..."""
SPAWN_MAX = 32
"""The most entries one spawn call takes (parallel_spawn here, spawn_runs over MCP)."""
ROW_KEYS = ("index", "agent", "run_id", "status", "ok", "output", "state", "error", "state_withheld")
"""A row's keys, in the order every row has them (the record stores them sorted)."""


class SpawnRefused(SpecError):
    """A spawn call refused before any child started (the message names the entry)."""


def spawn_row(index: int, agent: str, result: dict[str, Any]) -> dict[str, Any]:
    """One row of a spawn call (MCP's ``spawn_runs`` shares the shape): status is ok, failed,
    timeout, max_iterations, cancelled (or, over MCP, running); a failed run is a row."""
    status = result["status"]
    error = result.get("error")
    if status in ("done", "parked"):
        status = "ok"
    elif status == "failed" and error and "reached max_iterations" in error:
        status = "max_iterations"
    elif status == "failed" and error and "timed out" in error:
        status = "timeout"
    row: dict[str, Any] = {
        "index": index,
        "agent": agent,
        "run_id": result["run_id"],
        "status": status,
        "ok": status == "ok",
    }
    for key in ("output", "state", "error", "state_withheld"):
        if result.get(key) is not None:
            row[key] = result[key]
    return row


class Children:
    """The children of one parent run, spawned through ``runtime`` from ``agents``."""

    def __init__(
        self,
        runtime: Runtime,
        parent: RunState,
        agents: AgentsFile | Callable[[], AgentsFile | None] | None,
        agents_file: str | None = None,
    ):
        self.runtime = runtime
        self.parent = parent
        self._agents = agents
        """The agents file, or how to read it (a resumed parent reads it only when it spawns)."""
        self.agents_file = agents_file
        self.live = 0
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def agents(self) -> AgentsFile | None:
        if callable(self._agents):
            self._agents = self._agents()
        return self._agents

    # ------------------------------------------------------------------ the call

    async def spawn(self, entries: list[dict[str, Any]], timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Check, admit, play, record and cap one call's children; their rows, in order."""
        spec = self.parent.spec
        if not 1 <= len(entries) <= SPAWN_MAX:
            raise SpawnRefused(f"spawns must have 1 to {SPAWN_MAX} entries, not {len(entries)}")
        checked = [self._check(i, entry, timeout_s) for i, entry in enumerate(entries)]
        if self.live + len(checked) > spec.max_live_children:
            raise SpawnRefused(
                f"{len(checked)} more children would make {self.live + len(checked)} alive at once, over "
                f"max_live_children ({spec.max_live_children}); none was started. Spawn fewer at a time."
            )
        call_id = CURRENT_CALL.get() or "direct"
        ledger = self._ledger(call_id)
        await self._cancel_orphans()
        self.live += len(checked)
        try:
            rows = list(await asyncio.gather(*(self._one(call_id, i, c, ledger) for i, c in enumerate(checked))))
        finally:
            self.live -= len(checked)
        await self._reduce_state(rows)
        return self._capped(rows)

    def _check(self, i: int, entry: Any, default_timeout: float | None) -> dict[str, Any]:
        spec, where = self.parent.spec, f"spawns[{i}]"
        if not isinstance(entry, dict):
            raise SpawnRefused(f"{where}: must be an object like {{agent, prompt, context?, timeout_s?}}")
        agent, prompt = entry.get("agent"), entry.get("prompt")
        if agent not in spec.spawnable:
            raise SpawnRefused(
                f"{where}.agent: {agent!r} is not spawnable by {self.parent.agent} "
                f"(spawnable: {', '.join(spec.spawnable)})"
            )
        if self.agents is None or agent not in self.agents.agents:
            raise SpawnRefused(f"{where}.agent: {agent!r} is not in the agents file this run was started from")
        if self.parent.depth + 1 > DEPTH_MAX:
            raise SpawnRefused(
                f"{where}: this run is at depth {self.parent.depth}; spawns nest at most {DEPTH_MAX} deep"
            )
        unknown = set(entry) - {"agent", "prompt", "context", "timeout_s"}
        if unknown:
            raise SpawnRefused(
                f"{where}: unknown keys {sorted(unknown)} (an entry takes agent, prompt, context, timeout_s)"
            )
        child = self.agents.agent(agent)
        try:
            check_input(prompt)
            context = (
                narrowed_context(child, entry.get("context"), where=f"{where}.context")
                if entry.get("context")
                else None
            )
        except LoomError as exc:
            raise SpawnRefused(f"{where}: {exc}" if not str(exc).startswith(where) else str(exc)) from None
        timeout = entry.get("timeout_s", default_timeout)
        ceiling = spec.max_child_timeout_s
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
            raise SpawnRefused(f"{where}.timeout_s: must be a positive number of seconds, not {timeout!r}")
        if ceiling is not None and timeout is not None and timeout > ceiling:
            raise SpawnRefused(
                f"{where}.timeout_s: {timeout} is above max_child_timeout_s ({ceiling:g}); "
                "ask for less (it is refused, not clamped)"
            )
        return {
            "agent": agent,
            "prompt": prompt,
            "context": context,
            "timeout_s": timeout if timeout is not None else ceiling,
        }

    def _ledger(self, call_id: str) -> dict[str, dict[int, dict[str, Any]]]:
        """What the parent's record says this call already did: started and finished children."""
        ledger: dict[str, dict[int, dict[str, Any]]] = {"started": {}, "results": {}}
        for e in self.parent.store.events(self.parent.run_id, kinds=["spawn_child_started", "spawn_child_result"]):
            if e.data.get("tool_call_id") == call_id:
                ledger["started" if e.kind == "spawn_child_started" else "results"][int(e.data["index"])] = e.data
        return ledger

    async def _cancel_orphans(self) -> None:
        """A child whose start the parent never recorded (a crash between the two) is
        cancelled: the entry starts a new child, and the orphan would otherwise stay active."""
        known = {e.data["run_id"] for e in self.parent.store.events(self.parent.run_id, kinds=["spawn_child_started"])}
        for info in self.parent.store.children(self.parent.run_id):
            if info.run_id not in known and info.status not in ("done", "cancelled"):
                await self.runtime.cancel(info.run_id, reason="started, but its parent never recorded it (a crash)")

    # ------------------------------------------------------------------ one child

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._slots, self._loop = asyncio.Semaphore(self.parent.spec.max_concurrent_children), loop
        return self._slots

    async def _one(
        self, call_id: str, i: int, c: dict[str, Any], ledger: dict[str, dict[int, dict[str, Any]]]
    ) -> dict[str, Any]:
        done = ledger["results"].get(i)
        if done is not None:  # finished before a crash: the row is rebuilt from the ledger, in the row's key order
            return {k: done[k] for k in ROW_KEYS if done.get(k) is not None}
        async with self._semaphore():
            started = ledger["started"].get(i)
            child: RunState | None = None
            if started is None:
                overrides = {"context": c["context"]} if c["context"] else None
                child = await self.runtime.astart(
                    c["agent"],
                    agents=self.agents,
                    overrides=overrides,
                    parent=self.parent,
                    agents_file=self.agents_file,
                )
                child_id = child.run_id
                await self.parent.add(
                    "spawn_child_started",
                    {"tool_call_id": call_id, "index": i, "run_id": child_id, "agent": c["agent"]},
                )
                play = self.runtime.send(child, c["prompt"])
            else:
                child_id = started["run_id"]
                play = self._settle(child_id, c["prompt"])
            result, timed_out = await self._within(play, child, child_id, c["timeout_s"])
        row = spawn_row(i, c["agent"], result.to_json())
        if timed_out:
            row.update(
                status="timeout",
                ok=False,
                error=f"the child ran past its timeout ({c['timeout_s']:g} s) and was cancelled",
            )
        if result.mode == "stateful":
            row.pop("output", None)  # a stateful child hands up Σ, not its transcript
        elif row.get("output") is not None:  # an answer that repeats private material stays in its run
            row["output"] = answer_for_another_run(self.runtime.store, child_id, row["output"])
        await self.parent.add(
            "spawn_child_result", {"tool_call_id": call_id, **row, "usage": self.runtime.usage_of(child_id)}
        )
        reached("in_spawn")
        return row

    async def _settle(self, child_id: str, prompt: str) -> RunResult:
        """A child started before a crash: its result if it finished, else it is resumed."""
        run = await self.runtime.aopen(child_id)
        status = run.view.status
        if status in ("done", "failed", "cancelled") or (status == "parked" and not run.view.parked_after_error):
            errors = [e.data.get("message") for e in self.parent.store.events(child_id, kinds=["error"])]
            return self.runtime.result(run, error=(errors[-1] or "failed") if status == "failed" and errors else None)
        if not any(e.kind == "user_input" for e in self.parent.store.events(child_id, kinds=["user_input"])):
            return await self.runtime.send(run, prompt)  # killed before its task was recorded
        return await self.runtime.resume(child_id)

    async def _within(
        self, play: Any, child: RunState | None, child_id: str, timeout: float | None
    ) -> tuple[RunResult, bool]:
        task = asyncio.ensure_future(play)
        try:
            return await asyncio.wait_for(task, timeout), False
        except TimeoutError:
            return await self.runtime.cancel(child or child_id, reason=f"timed out after {timeout:g} s"), True
        except asyncio.CancelledError:  # the parent was cancelled (or its process is stopping)
            await self.runtime.cancel(child or child_id, reason="its parent run was cancelled")
            raise

    # ------------------------------------------------------------------ rows

    def _capped(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """At most a quarter of the parent's budget for all rows, shared equally."""
        share = max(64, self.parent.budget // 4 // len(rows))
        return [_fit(row, share) for row in rows]

    async def _reduce_state(self, rows: list[dict[str, Any]]) -> None:
        """children_state: merge each ok child's Σ into the parent's Σ at ``into`` (no model call)."""
        spec = self.parent.spec
        reduce = spec.children_state
        if reduce is None or self.parent.mode.name != "stateful":
            return
        from loomrt.run.reducers.stateful import initial_state, merge_patch, validate_state

        schema = spec.context.state_schema or {}
        entries = {
            str(r["agent"] if reduce.key == "agent" else r["index"]): r["state"]
            for r in rows
            if r["ok"] and isinstance(r.get("state"), dict)
        }
        if not entries:
            return
        patch: dict[str, Any] = entries
        for part in reversed([p.replace("~1", "/").replace("~0", "~") for p in reduce.into.split("/")[1:]]):
            patch = {part: patch}
        current = self.parent.state if self.parent.state is not None else initial_state(schema)
        new_state = merge_patch(current, patch)
        problem = validate_state(new_state, schema)
        if problem:
            await self.parent.add(
                "notice",
                {
                    "source": "children_state",
                    "message": f"children's Σ not merged: the result would be invalid ({problem})",
                },
            )
            return
        await self.parent.add(
            "state_update",
            {
                "state": new_state,
                "patch": patch,
                "done": False,
                "reasoning": f"children_state: {len(entries)} children's Σ at {reduce.into}",
            },
        )


def _fit(row: dict[str, Any], share: int) -> dict[str, Any]:
    """``row`` within ``share`` tokens: Σ whole or omitted whole, then text cut with a note."""
    if count_text(json.dumps(row, ensure_ascii=False)) <= share:
        return row
    row = dict(row)
    if "state" in row:
        row["state_bytes"] = len(json.dumps(row.pop("state"), ensure_ascii=False).encode())
        row["state_omitted"] = True
    for key in ("output", "error"):
        size = count_text(json.dumps(row, ensure_ascii=False))
        if key in row and size > share:
            text = str(row[key])
            keep = max(0, len(text) - (size - share) * 4 - 200)
            row[key] = (
                text[:keep] + f" [cut: the full {key} is in run {row['run_id']} (`loomrt runs show {row['run_id']}`)]"
            )
            row["truncated"] = True
    return row
