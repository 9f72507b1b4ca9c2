"""append: keep everything; only the compaction backstop (``context.backstop``) ever evicts."""

from loomrt.run.reducers.base import RetentionMode

__all__ = ["AppendMode"]


class AppendMode(RetentionMode):
    """Never evicts unless ``context.backstop`` is on (then it compacts like compaction mode)."""

    name = "append"
