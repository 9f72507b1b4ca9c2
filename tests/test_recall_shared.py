"""A fork reads its family's recall index instead of rebuilding it (recall/shared.py): the
same hits as a fork that rebuilt its shared history, nothing its parent evicted after the
fork point, and no index of another store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loomrt.recall import HashEmbedder
from loomrt.recall.shared import forget
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider, scripted_runtime

SUMMARY = "Summary: the user sent numbered status notes about the project."


def spec() -> AgentSpec:
    return AgentSpec(
        model="scripted/test",
        context={"mode": "recap", "budget_tokens": 500, "keep_last_n": 2, "recall": True, "recall_inject": "off"},
    )


def note(i: int) -> str:
    return f"Note {i}: the crate labelled C-{4000 + i} went to shelf {i % 7} in room R{i % 5}; checked by person {i}."


async def played(rt: Runtime, turns: int, start: int = 0, run: Any = None) -> Any:
    run = run or await rt.astart(spec(), interactive=True)
    for i in range(start, start + turns):
        await rt.send(run, note(i))
    return run


def runtime() -> Runtime:
    provider = ScriptedProvider(turns=["Noted."] * 200, summaries=[SUMMARY] * 100)
    return scripted_runtime(provider, embedder=HashEmbedder())


def texts(hits: list[Any]) -> list[tuple[int | None, str]]:
    return [(h.seq, h.text) for h in hits]


def test_a_fork_reads_its_parents_index_and_finds_what_a_rebuilt_fork_finds() -> None:
    async def go() -> None:
        rt = runtime()
        run = await played(rt, 30)
        shared = await rt.fork(run.run_id)
        assert shared.toolset.recall.family, "the fork reads its parent's index"
        assert shared.toolset.recall.index.entries == {}, "nothing of the parent's is re-indexed"
        forget()
        rebuilt = await rt.fork(run.run_id)
        assert not rebuilt.toolset.recall.family, "with nothing held, the fork rebuilds its shared history"
        for query in ("crate C-4003 shelf", "who checked note 7", "room R2"):
            found = texts(shared.toolset.recall.search(query, top_k=5))
            assert found and found == texts(rebuilt.toolset.recall.search(query, top_k=5))
        assert shared.toolset.recall.size() == rebuilt.toolset.recall.size() > 0
        first = shared.toolset.recall.search("crate C-4001", top_k=1)[0]
        assert first.source == "family" and shared.toolset.recall.at_seq(first.seq)[0].text == first.text

    asyncio.run(go())


def test_what_the_parent_evicts_after_the_fork_point_stays_out_of_the_fork() -> None:
    async def go() -> None:
        rt = runtime()
        run = await played(rt, 20)
        fork = await rt.fork(run.run_id)
        size = fork.toolset.recall.size()
        await played(rt, 20, start=20, run=run)  # the parent goes on and evicts notes 18.. too
        assert fork.toolset.recall.size() == size
        later = {h.seq for h in run.toolset.recall.search("crate C-4030 shelf", top_k=50)}
        seen = {h.seq for h in fork.toolset.recall.search("crate C-4030 shelf", top_k=50)}
        assert seen and all(s <= fork.view.family.fork_seq for s in seen)
        assert later - seen, "the parent itself finds what it evicted after the fork"

    asyncio.run(go())


def test_a_fork_of_a_fork_reads_both_ancestors() -> None:
    async def go() -> None:
        rt = runtime()
        run = await played(rt, 20)
        child = await rt.fork(run.run_id)
        await played(rt, 20, start=100, run=child)
        grandchild = await rt.fork(child.run_id)
        recall = grandchild.toolset.recall
        assert [holder.run_id for holder, _ in recall.family] == [child.run_id, run.run_id]
        hits = recall.search("crate C-4101", top_k=3) + recall.search("crate C-4002", top_k=3)
        assert {h.run_id for h in hits} == {child.run_id, run.run_id}
        forget()
        rebuilt = await rt.fork(child.run_id)
        assert rebuilt.toolset.recall.size() == recall.size()

    asyncio.run(go())


def test_an_index_of_another_store_is_never_read() -> None:
    async def go() -> None:
        rt = runtime()
        run = await played(rt, 20)
        other = runtime()  # another record: the same run id would mean another run
        assert other.store is not rt.store
        from loomrt.recall.shared import family_sources

        assert family_sources(other.store, [(run.run_id, 10**6)], lambda *_: False, lambda _: True) is None
        assert family_sources(rt.store, [(run.run_id, 10**6)], lambda *_: False, lambda _: True)

    asyncio.run(go())


def test_a_holder_that_missed_a_distillation_is_not_read() -> None:
    """A parent distilled elsewhere (another process) past what the held index knows: the
    record says so, and the fork rebuilds."""

    async def go() -> None:
        rt = runtime()
        run = await played(rt, 20)
        from loomrt.recall.shared import family_sources

        links = [(run.run_id, 10**6)]
        assert family_sources(rt.store, links, lambda *_: True, lambda _: True) is None
        assert family_sources(rt.store, links, lambda *_: False, lambda _: False) is None

    asyncio.run(go())


@pytest.mark.slow
def test_the_fork_cost_measure_says_no_when_forks_rebuild_their_shared_history(monkeypatch) -> None:
    """Its sabotage test: with the shared index never found, the row that should read its
    parent's index shows the fork indexing the whole shared history itself (a count, not a time)."""
    from loomrt.bench.fork_measure import fork_cost_figures

    def rows() -> dict[str, dict[str, Any]]:
        figures = fork_cost_figures(
            (100, 300), 2, variants=("fold + recall", "fold + recall, rebuilt"), embedder=HashEmbedder()
        )
        return {r["mode"]: r for r in figures["rows"]}

    honest = rows()
    assert honest["fold + recall"]["fork_indexed_at_largest"] == 0
    assert honest["fold + recall, rebuilt (median of 2)"]["fork_indexed_at_largest"] > 0
    monkeypatch.setattr("loomrt.recall.shared.family_sources", lambda *a, **k: None)
    sabotaged = rows()
    assert (
        sabotaged["fold + recall"]["fork_indexed_at_largest"]
        == honest["fold + recall, rebuilt (median of 2)"]["fork_indexed_at_largest"]
    )
