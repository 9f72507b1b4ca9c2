"""compaction: an LLM summary of the span before the cut.

After a boundary the working context is: system, the pinned task, the summary, and the
last ``keep_last_n`` messages. Tool-call / tool-result pairs are never split. What the
previous summary states is carried forward (its exact values first) and the model
summarises only the new span after it. This reducer is also append mode's backstop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loomrt.run.reducers.base import Declined, Reduction, RetentionMode
from loomrt.run.reducers.summarize import distil_with_prose, worked_example

if TYPE_CHECKING:
    from loomrt.run.state import RunState

__all__ = ["CompactionMode", "compact", "SUMMARY_INSTRUCTIONS"]

SUMMARY_INSTRUCTIONS = (
    "Summarise the conversation below so that the assistant can continue the task from the "
    "summary alone: what the user asked for, every decision, open question, name, number, date, "
    "path and value exactly as written, each with its [#seq] pointer. Be concise; no preamble."
)

SUMMARY_EXAMPLE = worked_example(
    "Summary",
    "The user wants the staging database on db-stage-2 migrated before Friday 14 June [#12]. "
    "The orders table has 41 columns and the index orders_by_day [#14]. "
    "Decided: the old index stays until the new one is verified [#15]. "
    "Open: building and verifying the new index.",
)
"""A worked summary, so a small model sees the shape it is asked for."""


SUMMARY_LABEL = "[Summary of earlier messages, not the user's words; a map, not the details]"


async def compact(run: RunState) -> Reduction | Declined | None:
    return await distil_with_prose(
        run,
        purpose="summary",
        synthetic="summary",
        instructions=SUMMARY_INSTRUCTIONS,
        example=SUMMARY_EXAMPLE,
        label=SUMMARY_LABEL,
        max_chars=None,
    )


class CompactionMode(RetentionMode):
    name = "compaction"
    between_turns = True

    def threshold_pct(self, run: RunState) -> int | None:
        return run.spec.context.autocompact_at_pct

    async def reduce(self, run: RunState) -> Reduction | Declined | None:
        return await compact(run)
