"""append: keep everything; only the compaction backstop (``context.backstop``) ever evicts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loomrt.run.reducers.base import Declined, Reduction, RetentionMode
from loomrt.run.reducers.compaction import compact

if TYPE_CHECKING:
    from loomrt.run.state import RunState

__all__ = ["AppendMode"]


class AppendMode(RetentionMode):
    """Never evicts unless ``context.backstop`` is on (then it compacts like compaction mode)."""

    name = "append"

    def threshold_pct(self, run: RunState) -> int | None:
        return run.spec.context.autocompact_at_pct if run.spec.context.backstop else None

    async def reduce(self, run: RunState) -> Reduction | Declined | None:
        return await compact(run)
