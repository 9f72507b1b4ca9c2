"""Who is driving a coroutine: an event loop, or a sync entry point that runs it inline.

The run core is async. Its sync entry points (``Runtime.start``, ``finish``) drive a coroutine
with no event loop to wait in (:func:`drive`), inside :func:`completing_inline`:
then whatever would wait on I/O off the loop (a PostgreSQL store's queries, durable memory in
a shared database) completes inline instead. A bottom-floor module: recall reads it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from loomrt.errors import StoreError

__all__ = ["completing_inline", "drive", "inline_wanted", "on_running_loop"]

T = TypeVar("T")


def on_running_loop() -> bool:
    """Whether this thread is inside a running event loop's task."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


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
    return not on_running_loop()


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from code that is not async (``start``, ``finish``).

    It runs inline, inside :func:`~loomrt.record.inline.completing_inline`: a store that waits
    on I/O (PostgreSQL) completes each call before returning, as SQLite's always does, so the
    coroutine never suspends and this works inside or outside an event loop (inside one, it
    blocks that loop for the call, as any sync call does: async code awaits ``astart``,
    ``aopen`` and ``afinish`` instead). A coroutine that suspends on anything else is refused.
    """
    with completing_inline():
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
    coro.close()
    raise StoreError(
        "this call waited on something it cannot wait for synchronously: "
        "use the async form (await runtime.astart(...), runtime.aopen(...), runtime.afinish(run))"
    )
