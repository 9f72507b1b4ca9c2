"""What to fold next, read off the working context alone (no model, no record).

The working context in fold mode is: the head (system, the pinned task), pin blocks, the
catalog's cards in order, then raw messages. The newest raw messages are the **tail**,
never folded. One step is one of:

- a **rollup**: ``rollup`` adjacent cards of one depth become one card a level higher:
  always first, so the tree stays shallow;
- a **leaf**: the oldest raw stretch outside the tail (at least ``leaf_min_messages``, at
  most ``leaf_source_tokens``) becomes one card, while the context is over the fold's target;
- over the hard watermark, when no such leaf is left: a shorter leaf (2 messages or
  more), a rollup of 2 cards (of one depth, else of two depths, into a card above both),
  and last the largest tool result of the tail replaced by a short reference (its full
  text stays on the record, and Expand reads it in pages).
"""

from __future__ import annotations

from dataclasses import dataclass

from loomrt.messages import Message
from loomrt.run.cards import CARD_BLOCK, Card
from loomrt.spec import FoldSpec
from loomrt.tokens import count_messages

__all__ = ["Step", "next_step", "tail_start", "head_size", "leaf_source_limit", "MIN_LEAF_TOKENS"]

MIN_LEAF_TOKENS = 160
"""A stretch smaller than this is not worth a card: the card's wrapper alone is ~50 tokens."""


@dataclass(frozen=True)
class Step:
    """One fold: ``kind`` over ``context[start:end]``."""

    kind: str
    """rollup, leaf or externalise."""
    start: int
    end: int


def head_size(context: list[Message]) -> int:
    """The system message and the pinned messages that lead the context."""
    n = 0
    while n < len(context) and context[n].synthetic is None and (context[n].role == "system" or context[n].pinned):
        n += 1
    return n


def leaf_source_limit(spec: FoldSpec, budget: int) -> int:
    """``fold.leaf_source_tokens``, else the smaller of 20,000 and a quarter of the budget."""
    return spec.leaf_source_tokens or min(20_000, max(256, budget // 4))


def _raw(m: Message) -> bool:
    """A record message in the context (whole, cut, or held as a reference)."""
    return m.seq is not None and m.synthetic in (None, "external") and not m.pinned and m.role != "system"


def tail_start(context: list[Message], spec: FoldSpec, budget: int) -> int:
    """Where the tail begins: the last ``keep_recent`` raw messages or those fitting
    ``keep_recent_pct`` of the budget, whichever are fewer; moved earlier to keep the
    newest user input with everything after it, and never starting on a tool result."""
    room = budget * spec.keep_recent_pct // 100
    start, kept, size = len(context), 0, 0
    for i in range(len(context) - 1, head_size(context) - 1, -1):
        if not _raw(context[i]):
            break
        n = count_messages([context[i]])
        if kept >= spec.keep_recent or (kept and size + n > room):
            break
        start, kept, size = i, kept + 1, size + n
    user = next((i for i in range(len(context) - 1, -1, -1) if _raw(context[i]) and context[i].role == "user"), None)
    if user is not None:
        start = min(start, user)
    while start > 0 and start < len(context) and context[start].role == "tool":
        start -= 1  # the assistant message that made the call goes with its result
    return start


def _rollup(context: list[Message], cards: dict[str, Card], size: int, *, any_depth: bool = False) -> Step | None:
    """The oldest run of ``size`` adjacent cards of one depth (of any depths, with
    ``any_depth``: the last resort over the hard watermark), if there is one."""
    run: list[int] = []
    depth = -1
    for i, m in enumerate(context):
        card = cards.get(m.ref or "") if m.synthetic == CARD_BLOCK else None
        if card is None or (card.depth != depth and not any_depth):
            run, depth = ([i], card.depth) if card is not None else ([], -1)
        else:
            run.append(i)
        if len(run) == size:
            return Step("rollup", run[0], run[-1] + 1)
    return None


def _leaf(context: list[Message], stop: int, spec: FoldSpec, budget: int, *, fewest: int) -> Step | None:
    """The oldest raw stretch before ``stop`` that makes a leaf.

    The raw messages before the tail are shared out evenly among as few leaves as keep
    each within ``leaf_source_tokens``, so a fold that takes them all leaves no remnant
    too short to fold (which would stay raw in the context until the tail moved past it)."""
    start = next((i for i in range(head_size(context), stop) if _raw(context[i])), None)
    if start is None:
        return None
    stretch = start
    while stretch < stop and _raw(context[stretch]):
        stretch += 1
    limit = leaf_source_limit(spec, budget)
    total = count_messages(context[start:stretch])
    share = -(-total // max(1, -(-total // limit)))  # total ÷ the fewest leaves within the limit, rounded up
    end, size = start, 0
    while end < stretch:
        n = count_messages([context[end]])
        # past the share only to reach the fewest messages and a size worth a card
        if end - start >= spec.leaf_min_messages and size >= 2 * MIN_LEAF_TOKENS and size + n > share:
            break
        end, size = end + 1, size + n
    if 0 < stretch - end < spec.leaf_min_messages and size + count_messages(context[end:stretch]) <= limit:
        end = stretch  # the remnant would be too short to fold on its own
    while end > start and end < len(context) and context[end].role == "tool":
        end -= 1  # a tool call and its result stay on one side
    if end - start < fewest or count_messages(context[start:end]) < MIN_LEAF_TOKENS:
        return None
    return Step("leaf", start, end)


def _externalise(context: list[Message], stop: int, limit: int) -> Step | None:
    """The largest tool result of the tail that is worth replacing by a reference."""
    best, size = None, limit
    for i in range(stop, len(context)):
        m = context[i]
        if m.role == "tool" and m.synthetic is None:
            n = count_messages([m])
            if n > size:
                best, size = i, n
    return Step("externalise", best, best + 1) if best is not None else None


def next_step(
    context: list[Message], cards: dict[str, Card], spec: FoldSpec, budget: int, *, pressing: bool, critical: bool
) -> Step | None:
    """The next fold to make, or None when there is none to make: ``rollup`` adjacent cards
    of one depth always roll up; while ``pressing`` (over the fold's target) the oldest raw
    stretch folds into a leaf; while ``critical`` (over the hard watermark) a shorter leaf,
    a rollup of 2 (of one depth, then of any) and, last, externalising the tail's largest
    tool result are allowed."""
    step = _rollup(context, cards, spec.rollup)
    if step is not None or not pressing:
        return step
    stop = tail_start(context, spec, budget)
    step = _leaf(context, stop, spec, budget, fewest=spec.leaf_min_messages)
    if step is not None or not critical:
        return step
    return (
        _leaf(context, stop, spec, budget, fewest=2)
        or _rollup(context, cards, 2)
        or _rollup(context, cards, 2, any_depth=True)
        or _externalise(context, stop, max(64, budget // 16))
    )
