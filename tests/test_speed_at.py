"""tools/speed_at.py, issue 43's before and after: what llama.cpp did is counted the same way
for any commit. A one-call answer's free rest continues its first token's prompt and is not
a second prompt; the cached share is the cache's own prefix; the first answer token is the
turn's last call's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "speed_at.py"


def speed_at() -> Any:
    spec = importlib.util.spec_from_file_location("speed_at", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["speed_at"] = module
    spec.loader.exec_module(module)
    return module


def row(prompt: list[int], cached: int, written: int, *, at: float, continues: bool = False) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "cached": cached,
        "written": written,
        "first_token": at,
        "grammar": not continues,
        "continues": continues,
        "started": at,
    }


def test_the_counting_of_a_turn() -> None:
    tool = speed_at()
    calls = tool.Calls()
    calls.rows = [
        row(list(range(100)), 0, 40, at=10.0),  # turn 1: one prompt, nothing cached
        row(list(range(150)), 140, 1, at=20.5),  # turn 2: the answer's first token under the grammar
        row(list(range(151)), 151, 30, at=21.0, continues=True),  # ... and its free rest: not a prompt
    ]
    turns = [
        {
            "started": 9.0,
            "seconds": 6.0,
            "calls": (0, 1),
            "new_text": ["a b c d"],
            "distillations": 0,
            "rejected": 0,
            "between_s": 0.0,
            "status": "parked",
            "answer": "x",
        },
        {
            "started": 20.0,
            "seconds": 3.0,
            "calls": (1, 3),
            "new_text": ["e f"],
            "distillations": 0,
            "rejected": 0,
            "between_s": 1.5,
            "status": "parked",
            "answer": "y",
        },
    ]
    out = tool.figures(turns, calls, {"prefill_tps": 100.0, "decode_tps": 10.0}, lambda text: len(text.split()))
    first, second = out["turns"]
    assert (first["input_tokens"], first["cached_tokens"], first["model_calls"]) == (100, 0, 1)
    assert (second["input_tokens"], second["cached_tokens"], second["model_calls"]) == (150, 140, 1)
    assert second["output_tokens"] == 31 and second["floor_s"] == pytest.approx(2 / 100 + 31 / 10, abs=0.01)
    assert second["first_token_s"] == 0.5 and out["cached_share"] == round(140 / 250, 3)
    assert out["seconds"] == 10.5
