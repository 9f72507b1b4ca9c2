"""Isolation between runs: a fork's Describe and Expand read only the cards of its own
catalog lineage (its catalog, the cards they roll up, and the family's cards up to its
fork point), never an unrelated run's card nor a card its parent wrote after the fork
point, though card ids are printed everywhere."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider, scripted_runtime

WORDS = "alpha beta gamma delta service deploy port config path value cluster node shard queue".split()


def said(i: int, rng: random.Random) -> str:
    return f"Note {i}: the {rng.choice(WORDS)} is {rng.randint(1000, 9999)}. " + " ".join(
        rng.choice(WORDS) for _ in range(24)
    )


def fold_spec() -> AgentSpec:
    return AgentSpec(
        model="scripted/fork", context={"mode": "fold", "budget_tokens": 2048, "fold": {"max_calls_per_10min": 10_000}}
    )


def talk(rt: Runtime, run: Any, texts: list[str]) -> None:
    async def go() -> None:
        for text in texts:
            await rt.send(run, text)

    asyncio.run(go())


def call(run: Any, tool: str, card_id: str) -> Any:
    return asyncio.run(run.toolset.tools[tool].call({"id": card_id}))


def refused(out: Any) -> bool:
    return str(out).startswith("Error: no card or record message")


def test_a_forks_describe_and_expand_read_only_its_catalog_lineage() -> None:
    rng = random.Random(5)
    provider = ScriptedProvider(turns=[{"text": "ok"}] * 5000, summaries=[{"extractive": 300, "words": 12}])
    rt = scripted_runtime(provider)
    parent = rt.start(fold_spec(), interactive=True)
    talk(rt, parent, [said(i, rng) for i in range(60)])
    other = rt.start(fold_spec(), interactive=True)  # an unrelated run on the same store
    talk(rt, other, [said(500 + i, rng) for i in range(60)])
    assert parent.view.cards and other.view.cards
    at = parent.last_seq - 9
    fork = asyncio.run(rt.fork(parent.run_id, at=at))
    talk(rt, parent, [said(1000 + i, rng) for i in range(40)])  # the parent folds on after the fork

    started = rt.store.events(fork.run_id)[0]
    catalog = [r["card"] for r in started.data["catalog"] if "card" in r]
    assert catalog, "the fork starts from cards"
    written_before = {
        c["id"]
        for e in rt.store.events(parent.run_id, kinds=["distillation"], until=at)
        for c in e.data.get("cards") or ()
    }
    written_after = {
        c["id"]
        for e in rt.store.events(parent.run_id, kinds=["distillation"], after=at)
        for c in e.data.get("cards") or ()
    } - written_before
    assert written_after, "the parent wrote cards after the fork point"

    for card_id in [*catalog, *sorted(written_before)]:  # what the fork shares: readable
        assert not refused(call(fork, "Describe", card_id)) and not refused(call(fork, "Expand", card_id))
    rollups = [c for c in fork.view.cards.values() if c.children]
    for child in {c for r in rollups for c in r.children}:  # what its cards roll up: readable
        assert not refused(call(fork, "Describe", child))

    foreign = sorted(other.view.cards)[:5] + sorted(written_after)[:5]
    for card_id in foreign:  # another run's card, and the parent's written after the fork point
        assert card_id not in fork.view.cards
        assert refused(call(fork, "Describe", card_id)), card_id
        assert refused(call(fork, "Expand", card_id)), card_id
    assert not refused(call(parent, "Describe", sorted(written_after)[0])), "the parent reads its own"
