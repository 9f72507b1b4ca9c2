"""The distillation a run's mode queued for between turns, made off the path where a user
waits: fold's soft watermark, a chat's recap or compaction.

One place for every caller: the chat calls it while the user types the next input, a
worker's job calls it for a chat that closed first (:func:`loomrt.worker.distil_row`), a
run's next turn calls it when no chat did (:meth:`loomrt.Runtime.send`), and the benches call
it as a chat would. It works under the run's distillation lease (``distil:RUN_ID``, one of
:class:`~loomrt.record.coordination.Coordination`'s), so two processes never distil one run
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from loomrt.driving import inline_wanted
from loomrt.errors import FencedError, MovedOnError, RunOwnedError, StoreError
from loomrt.providers.base import ModelRequest
from loomrt.record.coordination import Coordination
from loomrt.record.owners import owner_is_gone, worker_name
from loomrt.run.distil import maybe_distil
from loomrt.run.state import RunState

__all__ = ["between_turns", "LEASE_S"]

T = TypeVar("T")

LEASE_S = 600.0
"""How long a between-turns distillation holds its run's lease (``distil:RUN_ID``) at most:
a process that dies holding it blocks no one for longer."""


async def between_turns(run: RunState, coordination: Coordination, *, read_ahead: bool = False) -> bool:
    """Make the distillation ``run``'s mode queued for between turns. True if the context was
    reduced; a failure is an event, never raised. A record that cannot be written (a full
    disk) is left to the next turn, which says so in one error; losing the run's claim is
    raised. ``read_ahead`` (a chat, whose user is typing): after a reduction, the new context
    is read into the model's prefix cache (:func:`_read_ahead`)."""
    if not run.mode.queued(run.view):
        return False
    lease, holder = f"distil:{run.run_id}", f"{worker_name()}:{id(run)}"
    try:
        if not await _off_loop(run, _take_lease, coordination, lease, holder):
            return False  # another process (a `loomrt worker`) is on it
        reduced = await maybe_distil(run, force=True)
        if reduced and read_ahead:
            await _read_ahead(run)
        return reduced
    except MovedOnError:  # a worker's fold, and the run's own process wrote meanwhile: it folds itself
        return False
    except (RunOwnedError, FencedError):
        raise
    except StoreError:
        return False
    except Exception as exc:  # noqa: BLE001 - an optional part never fails the run
        with contextlib.suppress(StoreError):
            await run.add(
                "notice",
                {
                    "message": f"the queued {run.mode.name} failed: {type(exc).__name__}: {exc}",
                    "source": run.mode.name,
                },
            )
        return False
    finally:
        with contextlib.suppress(StoreError):
            await _off_loop(run, coordination.release_lease, lease, holder)


async def _read_ahead(run: RunState) -> None:
    """Read the reduced context into the model's prefix cache, as the next turn's call will
    send it, while the user types: a distillation rewrites the context near its start, so
    without this the next turn re-reads the whole prompt before its first word (on the
    embedded model, 15 s of a 900-token prompt on 2 cores). Only a provider with a cache of
    its own to fill has ``prefill`` (the embedded model); a failure is a notice."""
    prefill = getattr(run.provider, "prefill", None)
    if prefill is None:
        return
    request = ModelRequest(
        messages=list(run.view.wire),
        tools=run.mode.offered_tools(run),
        max_tokens=run.spec.max_tokens,
        temperature=run.spec.temperature,
        response_schema=run.mode.response_schema(run),
        tool_choice=run.mode.tool_choice(run),  # type: ignore[arg-type]
    )
    try:
        await prefill(request)
    except Exception as exc:  # noqa: BLE001 - an optional part never fails the run
        with contextlib.suppress(StoreError):
            await run.add(
                "notice", {"message": f"reading ahead failed: {type(exc).__name__}: {exc}", "source": "model"}
            )


async def _off_loop(run: RunState, call: Callable[..., T], *args: Any) -> T:
    """A sync coordination call: on a shared store (PostgreSQL) off the event loop, else inline."""
    if getattr(run.store, "shared", False) and not inline_wanted():
        return await asyncio.to_thread(call, *args)
    return call(*args)


def _take_lease(coordination: Coordination, lease: str, holder: str) -> bool:
    """Take the run's distillation lease: free, expired, or held by a process of this host
    that died (a chat killed while it distilled)."""
    if coordination.take_lease(lease, holder, LEASE_S):
        return True
    stale = coordination.lease_holder(lease)
    if stale is None or not owner_is_gone(stale.rpartition(":")[0]):
        return False
    coordination.release_lease(lease, stale)
    return coordination.take_lease(lease, holder, LEASE_S)
