"""How a plot tells its modes apart: each mode its own colour and its own marker (and the
variants of a mode their own too), the same ones in every plot of a report, so that two
modes whose lines coincide (recap and compaction, often) still show as two."""

from __future__ import annotations

from typing import Any

__all__ = ["mode_styles"]

KNOWN = {
    "append": ("#1f77b4", "o", "-"),
    "recap": ("#ff7f0e", "s", "-"),
    "compaction": ("#2ca02c", "^", "--"),
    "fold": ("#d62728", "D", "-"),
    "stateful": ("#9467bd", "v", "-."),
    "auto": ("#8c564b", "P", ":"),
    "full": ("#7f7f7f", "X", "-"),
    "recall": ("#17becf", "*", "--"),
}
"""The retention modes (and the bench's full and recall configurations) keep these."""

COLOURS = (
    "#e377c2", "#bcbd22", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#dbdb8d", "#9edae5", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173",
)  # fmt: skip
MARKERS = ("p", "h", "<", ">", "d", "H", "8", "1", "2", "3", "4", "+", "x", "|", "_", ".")
LINESTYLES = ("-", "--", "-.", ":")


def mode_styles(modes: list[str]) -> dict[str, dict[str, Any]]:
    """Matplotlib keywords (``color``, ``marker``, ``linestyle``) for each of ``modes``: no two
    share a colour or a marker (up to 24 modes). A known mode keeps its own; the others (a
    variant such as ``recap/no-recall``) take the next unused ones, in sorted order."""
    out: dict[str, dict[str, Any]] = {}
    taken_colours = {KNOWN[m][0] for m in modes if m in KNOWN}
    taken_markers = {KNOWN[m][1] for m in modes if m in KNOWN}
    colours = iter([c for c in (*COLOURS, *(k[0] for k in KNOWN.values())) if c not in taken_colours])
    markers = iter([m for m in (*MARKERS, *(k[1] for k in KNOWN.values())) if m not in taken_markers])
    for i, mode in enumerate(sorted(dict.fromkeys(modes))):
        if mode in KNOWN:
            colour, marker, line = KNOWN[mode]
        else:
            colour, marker, line = next(colours), next(markers), LINESTYLES[i % len(LINESTYLES)]
        out[mode] = {"color": colour, "marker": marker, "linestyle": line}
    return out
