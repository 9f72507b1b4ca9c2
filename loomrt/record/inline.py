"""The async face of a store whose calls complete inline (SQLite's): each async method is
its sync twin, called at once. The run core awaits these; its sync entry points drive them
without an event loop (:func:`loomrt.runtime.drive`), inside :func:`completing_inline`, which
tells a store that waits on I/O (PostgreSQL's) to complete its async calls inline too."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from loomrt.events import Event, RunInfo

__all__ = ["InlineAsyncFace", "completing_inline", "inline_wanted"]

_DRIVEN: contextvars.ContextVar[object | None] = contextvars.ContextVar("loomrt-driven", default=None)
"""Who :func:`completing_inline` is for: the task that called it (or :data:`_NO_LOOP`)."""
_NO_LOOP = object()


def _current() -> object:
    try:
        return asyncio.current_task() or _NO_LOOP
    except RuntimeError:  # no event loop in this thread
        return _NO_LOOP


@contextlib.contextmanager
def completing_inline() -> Iterator[None]:
    """Inside: the store's async calls complete before they return, never suspending (a sync
    entry point drives a coroutine with no event loop to wait in). It holds for the calling
    task only: a task started meanwhile (which copies the context) awaits as usual."""
    token = _DRIVEN.set(_current())
    try:
        yield
    finally:
        _DRIVEN.reset(token)


def inline_wanted() -> bool:
    """Whether an async store call must complete inline: under :func:`completing_inline` (in
    the task that called it), or with no event loop running in this thread."""
    driver = _DRIVEN.get()
    if driver is not None and driver is _current():
        return True
    from loomrt.record.pg_io import on_running_loop

    return not on_running_loop()


class InlineAsyncFace:
    """``write_run``, ``write``, ``write_many`` and ``read`` over the sync methods."""

    if TYPE_CHECKING:  # what the store itself defines

        def create_run(self, info: RunInfo) -> None: ...

        def append(self, run_id: str, kind: str, data: dict[str, Any]) -> Event: ...

        def append_many(
            self,
            run_id: str,
            items: list[tuple[str, dict[str, Any]]],
            *,
            after: int | None = None,
            epoch: int | None = None,
        ) -> list[Event]: ...

        def events(
            self, run_id: str, *, after: int = 0, kinds: Iterable[str] | None = None, until: int | None = None
        ) -> list[Event]: ...

    async def write_run(self, info: RunInfo) -> None:
        self.create_run(info)

    async def write(self, run_id: str, kind: str, data: dict[str, Any]) -> Event:
        return self.append(run_id, kind, data)

    async def write_many(
        self,
        run_id: str,
        items: list[tuple[str, dict[str, Any]]],
        *,
        after: int | None = None,
        epoch: int | None = None,
    ) -> list[Event]:
        return self.append_many(run_id, items, after=after, epoch=epoch)

    async def read(
        self, run_id: str, *, after: int = 0, kinds: Iterable[str] | None = None, until: int | None = None
    ) -> list[Event]:
        return self.events(run_id, after=after, kinds=kinds, until=until)
