"""A long chat on the embedded model, for real: a small budget, recaps written by the
model itself, and the chat surviving every turn (SmolLM2-135M, the fast embedded model;
`loomrt bench` runs the same chat on the default Qwen, which is too slow for the suite)."""

from __future__ import annotations

import asyncio

import pytest

from loomrt import AgentSpec, Runtime, SQLiteStore

pytest.importorskip("llama_cpp", reason="the embedded model needs: pip install 'loomrt[local]'")

FACT = "My project code is ZEBRA-41. Please remember it; I will ask for it later."
QUESTIONS = [
    "What is a write-ahead log?", "What is MVCC?", "What does fsync do?", "What is a B-tree?",
    "What is a bloom filter?", "What is sharding?", "What is a vector clock?", "What is two-phase commit?",
    "What is a checkpoint in a database?", "What is a tombstone in an LSM tree?",
]


@pytest.mark.slow
def test_a_12_turn_chat_on_a_small_budget_recaps_and_survives_every_turn(tmp_path) -> None:
    spec = AgentSpec(
        model="local/smollm2-135m", system_prompt="You are a concise assistant. Answer in two sentences at most.",
        max_tokens=48, temperature=0,
        context={"mode": "recap", "budget_tokens": 1000, "keep_last_n": 2, "recall": True, "recap_max_chars": 400},
    )
    rt = Runtime(SQLiteStore(tmp_path / "record.sqlite"), embedder=False)
    run = rt.start(spec, interactive=True)

    async def chat() -> list:
        results = [await rt.send(run, FACT)]
        for q in QUESTIONS:
            results.append(await rt.send(run, q))
        results.append(await rt.send(run, "What is my project code? Reply with the code only."))
        return results

    results = asyncio.run(chat())
    assert [r.status for r in results] == ["parked"] * 12, [r.error for r in results if r.error]
    kinds = [e.kind for e in rt.store.events(run.run_id)]
    assert kinds.count("distillation") >= 1  # recaps written by the model, and accepted by the prose check
    recaps = [e.data["summary"] for e in rt.store.events(run.run_id, kinds=["distillation"])]
    assert all(r.strip() for r in recaps)
    # the early fact is still in reach at the end: pinned verbatim, in a recap, or in Recall
    in_context = any("ZEBRA-41" in m.content for m in run.context)
    recalled = any("ZEBRA-41" in h.text for h in run.toolset.recall.search("project code", top_k=5))
    assert in_context or recalled
