"""The async face of a store whose calls complete inline (SQLite's): each async method is
its sync twin, called at once. The run core awaits these; its sync entry points drive them
without an event loop (:func:`loomrt.driving.drive`), inside :func:`completing_inline`, which
tells a store that waits on I/O (PostgreSQL's) to complete its async calls inline too."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from loomrt.driving import completing_inline, inline_wanted
from loomrt.events import Event, RunInfo

__all__ = ["InlineAsyncFace", "completing_inline", "inline_wanted"]


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
