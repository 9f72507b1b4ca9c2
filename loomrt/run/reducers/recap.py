"""recap: the model rewrites its reasoning so far as prose; the raw log is evicted.

After a boundary the working context is: system, the pinned task, the recap block, and
the last ``keep_last_n`` messages. What the previous recap states is carried forward
(:func:`~loomrt.run.reducers.summarize.carry_forward`, its exact values first), and the
model recaps only the newly evicted span after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loomrt.run.reducers.base import Declined, Reduction, RetentionMode
from loomrt.run.reducers.summarize import block_chars, distil_with_prose, worked_example

if TYPE_CHECKING:
    from loomrt.run.state import RunState

__all__ = ["RecapMode", "RECAP_INSTRUCTIONS", "RECAP_EXAMPLE"]

RECAP_INSTRUCTIONS = (
    "You are writing a recap of your own work so far, for yourself to continue from. "
    "Write plain prose in the first person: what the task is, what the user asked for, what you "
    "found, what was decided and why, what is still open, and the next step. Keep every name, "
    "number, date, path and value exactly as written, each with its [#seq] pointer. "
    "At most {max_chars} characters."
)

RECAP_EXAMPLE = worked_example(
    "Recap",
    "The user asked me to migrate the staging database on db-stage-2 before Friday 14 June [#12]. "
    "The orders table has 41 columns and the index orders_by_day [#14]. "
    "The user decided that the old index stays until the new one is verified [#15]. "
    "Next: build and verify the new index.",
)
"""A worked recap, so a small model sees the shape it is asked for."""


RECAP_LABEL = "[Recap written by the assistant of its own work, not the user's words; a map, not the details]"


class RecapMode(RetentionMode):
    name = "recap"
    between_turns = True

    def threshold_pct(self, run: RunState) -> int | None:
        return run.spec.context.autorecap_at_pct

    async def reduce(self, run: RunState) -> Reduction | Declined | None:
        limit = block_chars(run, run.spec.context.recap_max_chars)  # what the instructions say, too
        return await distil_with_prose(
            run,
            purpose="recap",
            synthetic="recap",
            instructions=RECAP_INSTRUCTIONS.format(max_chars=limit),
            example=RECAP_EXAMPLE,
            label=RECAP_LABEL,
            max_chars=limit,
        )
