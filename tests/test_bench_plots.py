"""The bench's plots tell every mode apart: its own colour and its own marker, the same in
each panel, so that two modes whose lines coincide (recap and compaction) both show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from installed_kit import require

from loomrt.bench import report
from loomrt.bench.styles import mode_styles

require("matplotlib")

MODES = [
    "append",
    "recap",
    "compaction",
    "fold",
    "stateful",
    "auto",
    "full",
    "recall",
    "recap/no-recall",
    "fold/inject",
]


def test_no_two_modes_share_a_colour_or_a_marker() -> None:
    styles = mode_styles([*MODES, *(f"x{i}" for i in range(14))])
    assert len({s["color"] for s in styles.values()}) == len(styles) == 24
    assert len({s["marker"] for s in styles.values()}) == 24
    assert mode_styles(["recap"])["recap"] == mode_styles(MODES)["recap"]  # a mode keeps its style


def _results() -> dict[str, Any]:
    series = [100 * i for i in range(1, 21)]  # every mode the same line: only colour and marker tell them apart
    modes = {m: {"resolved": m, "ratio": 0.5, "answered": 0.5} for m in MODES}
    workload = {"series": {m: series for m in MODES}, "modes": modes, "unit": "turns"}
    return {"workloads": {"chat": workload, "agentic": workload}, "reference_ratios": {}, "measures": {}}


def test_each_plotted_mode_has_its_own_colour_and_marker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    figures: dict[str, Any] = {}
    monkeypatch.setattr(report, "_save", lambda fig, path: figures.setdefault(path.name, fig) and path)
    report.plot(_results(), tmp_path)
    for ax in figures["tokens.png"].axes:
        drawn = [(line.get_color(), line.get_marker()) for line in ax.get_lines()]
        assert len(drawn) == len(set(c for c, _ in drawn)) == len(set(m for _, m in drawn)) == len(MODES)
    for ax in figures["fidelity.png"].axes:
        colours = {tuple(points.get_facecolor()[0]) for points in ax.collections}
        assert len(ax.collections) == len(colours) == len(MODES)
