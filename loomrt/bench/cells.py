"""The cell and table helpers every benchmark report shares (:mod:`loomrt.bench.render`,
:mod:`loomrt.bench.render_store`, :mod:`loomrt.bench.report`)."""

from __future__ import annotations

from typing import Any

__all__ = ["fmt", "md_table"]


def fmt(v: Any, digits: int = 3) -> str:
    """A figure as a table cell: – for none, floats to ``digits`` places, ints with thousands separators."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table: the header row, the rule, then one line a row."""
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *["| " + " | ".join(r) + " |" for r in rows],
    ]
