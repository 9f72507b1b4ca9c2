"""fold mode: when a fold runs. The soft watermark queues it for between turns, the hard
one folds in the turn; a warm cache defers it (an injected clock) unless pressure forces
it; ``loomrt worker`` folds a parked run's queued fold under its lease and gives way when
the run moves on; refold repairs fallback cards. What a fold writes is tests/test_fold.py."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from fold_kit import said, spec

from loomrt.run.between_turns import between_turns
from loomrt.run.cards import CARD_BLOCK
from loomrt.run.projection import project
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider, scripted_runtime


def test_the_soft_watermark_queues_a_fold_that_runs_between_turns() -> None:
    rng = random.Random(2)
    provider = ScriptedProvider(turns=[{"text": said(i, rng)} for i in range(80)], summaries=[{"extractive": 300}])
    rt = scripted_runtime(provider)
    run = rt.start(spec(soft_pct=50, hard_pct=100, cache_idle_s=0), interactive=True)

    async def go() -> None:
        for i in range(40):
            await rt.send(run, said(100 + i, rng))
            await between_turns(run, rt.coordination)

    asyncio.run(go())
    events = rt.store.events(run.run_id)
    folds = [e for e in events if e.kind == "distillation"]
    assert folds and not any(e.data["hard"] for e in folds)
    # no card-writing call inside a turn: every fold call comes after the turn's parked
    in_turn = False
    for e in events:
        if e.kind == "user_input":
            in_turn = True
        elif e.kind == "parked":
            in_turn = False
        elif e.kind == "model_call" and e.data["purpose"] == "fold":
            assert not in_turn, f"a fold call at seq {e.seq} was made inside a turn"
    queued = [e.seq for e in events if e.kind == "fold_queued"]
    assert queued and all(any(q < f.seq for q in queued) for f in folds), "each fold was queued first"


def test_a_hard_watermark_folds_in_the_turn() -> None:
    rng = random.Random(4)
    provider = ScriptedProvider(turns=[{"text": said(i, rng)} for i in range(80)], summaries=[{"extractive": 300}])
    rt = scripted_runtime(provider)
    run = rt.start(spec(soft_pct=95, hard_pct=95), interactive=True)

    async def go() -> None:
        for i in range(80):
            await rt.send(run, said(100 + i, rng))

    asyncio.run(go())
    folds = rt.store.events(run.run_id, kinds=["distillation"])
    assert folds and all(e.data["hard"] for e in folds)


def test_cache_idle_deferral_and_its_pressure_escape() -> None:
    from loomrt.run.reducers.fold import FoldMode

    rng = random.Random(6)
    provider = ScriptedProvider(turns=[{"text": said(i, rng)} for i in range(200)], summaries=[{"extractive": 300}])
    rt = scripted_runtime(provider)
    run = rt.start(spec(soft_pct=40, hard_pct=100, cache_idle_s=300), interactive=True)
    mode: FoldMode = run.mode  # type: ignore[assignment]
    clock = [0.0]
    mode.clock = lambda: clock[0]

    def queued() -> list[dict[str, Any]]:
        return [e.data for e in rt.store.events(run.run_id, kinds=["fold_queued"])]

    async def talk(n: int) -> None:
        for _ in range(n):
            clock[0] = run.view.slot.last_turn + 10  # the next input comes 10 s after the last call: cache warm
            await rt.send(run, said(rng.randint(0, 99), rng))
            if queued():
                return

    asyncio.run(talk(200))
    (first,) = queued()
    assert first["reason"].startswith("pressure at 85%"), "a warm cache defers the fold until 85%"
    assert first["pressure"] * 100 >= 85 * run.budget
    assert not rt.store.events(run.run_id, kinds=["distillation"]), "deferred from 40% to 85%: nothing folded"
    asyncio.run(between_turns(run, rt.coordination))
    assert not mode.queued(run.view)

    # after the fold, an idle cache queues at the soft watermark at once
    async def idle() -> None:
        for _ in range(200):
            clock[0] = run.view.slot.last_turn + 301
            await rt.send(run, said(rng.randint(0, 99), rng))
            if len(queued()) > 1:
                return

    asyncio.run(idle())
    assert queued()[-1]["reason"] == "cache idle" and queued()[-1]["pressure"] < 0.85 * run.budget


def test_refold_repairs_fallback_cards_with_another_model_and_keeps_the_old_ones() -> None:
    rng = random.Random(9)
    bad = ScriptedProvider(turns=[{"text": "ok"}] * 40, summaries=["Port 65000 at /nowhere/made-up.conf."])
    good = ScriptedProvider(turns=[], summaries=[{"extractive": 300}])
    rt = Runtime(providers=lambda s, m: good if m == "scripted/good" else bad)
    run = rt.start(spec(keep_recent=6, leaf_min_messages=4, rollup=16), interactive=True)

    async def go() -> None:
        for i in range(40):
            await rt.send(run, said(i, rng) + " filler " * 40)

    asyncio.run(go())
    old = {m.ref for m in run.context if m.synthetic == CARD_BLOCK}
    assert old and all(run.view.cards[c].fallback for c in old)
    out = asyncio.run(rt.refold(run.run_id, fallback_only=True, model="scripted/good"))
    assert out["refolded"] == len(old) and out["fallbacks_left"] == 0 and out["reason"] is None
    view = project(rt.store.events(run.run_id))
    new = {m.ref for m in view.context if m.synthetic == CARD_BLOCK}
    assert new.isdisjoint(old) and old <= set(view.cards), "cards are immutable: the old ones stay on the record"
    assert not any(view.cards[c].fallback for c in new)
    seqs = sorted(s for c in new for s in view.cards[c].seqs)
    assert seqs == sorted(s for c in old for s in view.cards[c].seqs), "the same coverage"
    again = asyncio.run(rt.refold(run.run_id, fallback_only=True))
    assert again["refolded"] == 0 and again["reason"]
    with pytest.raises(Exception, match="refold is for fold runs"):
        other = rt.start(AgentSpec(model="scripted/x", context={"mode": "recap"}), interactive=True)
        asyncio.run(rt.refold(other.run_id))


def test_loomrt_worker_folds_a_parked_runs_queued_fold_under_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from loomrt.cli.app import app

    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path))
    script = tmp_path / "chat.yaml"
    script.write_text(json.dumps({"turns": [{"text": "Noted."}] * 60, "summaries": [{"extractive": 300}]}))
    rng = random.Random(11)
    rt = Runtime()
    run = rt.start(spec(soft_pct=40, cache_idle_s=0).clone(model=f"scripted/{script}"), interactive=True)
    talk = [said(i, rng) for i in range(60)]

    async def until_queued() -> None:
        for text in talk:
            await rt.send(run, text)
            if run.mode.queued(run.view):
                return

    asyncio.run(until_queued())
    assert run.mode.queued(run.view) and rt.store.pending("fold_queued", ("distillation", "fold_skipped")) == [
        run.run_id
    ]
    assert rt.store.take_lease(f"distil:{run.run_id}", "someone else", 60)  # another worker holds it
    assert json.loads(CliRunner().invoke(app, ["runs", "show", run.run_id, "--json"]).output)["mode_state"]["running"]
    busy = CliRunner().invoke(app, ["worker", "--once", "--json"])
    assert busy.exit_code == 0 and json.loads(busy.output)["done"] is False
    rt.store.release_lease(f"distil:{run.run_id}", "someone else")
    done = CliRunner().invoke(app, ["worker", "--once", "--json"])
    row = json.loads(done.output)
    assert row["done"] and row["tokens_after"] < row["tokens_before"]
    assert rt.store.pending("fold_queued", ("distillation", "fold_skipped")) == []
    folds = rt.store.events(run.run_id, kinds=["distillation"])
    assert folds and not folds[-1].data["hard"]
    assert rt.store.get_run(run.run_id).status == "parked", "a fold never changes the run's status"


def test_a_workers_fold_gives_way_when_the_run_moves_on() -> None:
    from loomrt.errors import MovedOnError

    rng = random.Random(12)
    provider = ScriptedProvider(turns=[{"text": "Noted."}] * 80, summaries=[{"extractive": 300}])
    rt = scripted_runtime(provider)
    run = rt.start(spec(soft_pct=40, cache_idle_s=0), interactive=True)

    async def until_queued() -> None:
        for i in range(80):
            await rt.send(run, said(i, rng))
            if run.mode.queued(run.view):
                return

    asyncio.run(until_queued())
    worker = asyncio.run(rt.aopen(run.run_id))
    worker.guarded = True
    asyncio.run(run.add("user_input", {"content": "the user types first"}))  # the run's own process moves on
    last = rt.store.get_run(run.run_id).last_seq
    assert asyncio.run(between_turns(worker, rt.coordination)) is False
    assert rt.store.get_run(run.run_id).last_seq == last, "nothing of the worker's fold was written"
    with pytest.raises(MovedOnError):
        asyncio.run(worker.add("notice", {"message": "late"}))
