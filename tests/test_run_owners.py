"""A run is played by one worker at a time: a claim with an epoch that every append carries
as a fencing token. On both backends; the races are between real separate processes."""

from __future__ import annotations

import json
import multiprocessing
import time
from typing import Any

import pytest
from typer.testing import CliRunner

from loomrt import RunInfo, Runtime
from loomrt.cli import app
from loomrt.errors import FencedError, RunOwnedError
from loomrt.record.owners import owner_is_gone, worker_name
from loomrt.record.sqlite import default_store
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider


def _url(store: Any) -> str:
    return getattr(store, "url", None) or f"sqlite:{store.path}"


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A record two processes can open: a SQLite file, or a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'record.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


def _new_run(url: str, run_id: str) -> None:
    store = default_store(url)
    store.create_run(RunInfo(run_id=run_id, agent="a", def_hash="h", mode="append", model="m"))
    store.close()


def test_a_claim_is_exclusive_renewed_by_appends_and_fences_the_old_owner(shared_url: str) -> None:
    _new_run(shared_url, "r")
    store = default_store(shared_url)
    first = store.claim_run("r", "host-a/1/x", 0.3)
    assert first == 1 and store.claim_run("r", "host-a/1/x", 0.3) == 1  # its own: renewed, same epoch
    with pytest.raises(RunOwnedError, match=r"run r is owned by worker host-a/1/x \(epoch 1\)"):
        store.claim_run("r", "host-b/2/y", 60)
    store.append_many("r", [("notice", {"by": "a"})], epoch=1)  # the owner writes
    time.sleep(0.4)  # a's lease expires (it stopped writing: asleep, or cut off)
    assert store.claim_run("r", "host-b/2/y", 60) == 2  # b takes over, one epoch higher
    with pytest.raises(FencedError, match=r"claim \(epoch 1\) is no longer the run's; worker host-b/2/y owns it"):
        store.append_many("r", [("notice", {"by": "a, woken"})], epoch=1)
    store.append_many("r", [("notice", {"by": "b"})], epoch=2)
    assert [e.data["by"] for e in store.events("r")] == ["a", "b"]  # the refused write left nothing
    assert [(c["run_id"], c["owner"], c["epoch"]) for c in store.run_owners()] == [("r", "host-b/2/y", 2)]
    store.release_run("r", "host-b/2/y", 2)
    assert store.run_owners() == []
    assert store.claim_run("r", "host-a/1/x", 60) == 3  # epochs only grow, also after a release
    store.close()


def _race(url: str, run_id: str, name: str, start: Any, results: Any) -> None:
    store = default_store(url)
    start.wait()
    try:
        results.put((name, store.claim_run(run_id, name, 60)))
    except RunOwnedError as exc:
        results.put((name, str(exc)))
    finally:
        store.close()


@pytest.mark.slow
def test_two_processes_racing_to_own_one_run_one_wins_the_other_is_told(shared_url: str) -> None:
    _new_run(shared_url, "r")
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=_race, args=(shared_url, "r", f"host/{i}/w{i}", start, results)) for i in range(2)]
    for w in workers:
        w.start()
    time.sleep(1.0)  # both are connected and waiting
    start.set()
    got = dict(results.get(timeout=60) for _ in workers)
    for w in workers:
        w.join(timeout=30)
    winners = [name for name, out in got.items() if out == 1]
    assert len(winners) == 1, got
    (loser,) = set(got) - set(winners)
    assert f"is owned by worker {winners[0]} (epoch 1)" in str(got[loser])


def _play_and_wait(url: str, box: Any) -> None:
    rt = Runtime(default_store(url), owner=worker_name(), providers=lambda s, m: ScriptedProvider(["first", "second"]))
    run = rt.start(AgentSpec(model="scripted/x"), interactive=True)
    import asyncio

    asyncio.run(rt.send(run, "hi"))
    box.put((run.run_id, rt.owner))
    time.sleep(600)  # parked, holding its claim, until the test kills it


def test_a_runtime_claims_its_runs_and_a_dead_workers_run_is_resumable_at_once(shared_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    box = ctx.Queue()
    worker = ctx.Process(target=_play_and_wait, args=(shared_url, box))
    worker.start()
    run_id, owner = box.get(timeout=120)
    store = default_store(shared_url)
    assert [(c["run_id"], c["owner"]) for c in store.run_owners()] == [(run_id, owner)]
    rt = Runtime(store, owner="elsewhere/1/z", providers=lambda s, m: ScriptedProvider(["first", "second"]))
    with pytest.raises(RunOwnedError, match=f"run {run_id} is owned by worker {owner}"):
        asyncio_run(rt.continue_run(run_id, "again"))
    assert not owner_is_gone(owner)
    worker.kill()
    worker.join()
    assert owner_is_gone(owner)  # a process of this host that no longer runs: its claim has expired
    rt.owner = worker_name()
    result = asyncio_run(rt.continue_run(run_id, "again"))
    assert result.status in ("parked", "done")
    claims = store.run_owners()
    assert [(c["run_id"], c["owner"], c["epoch"]) for c in claims] == [(run_id, worker_name(), 2)]
    listed = json.loads(CliRunner().invoke(app, ["--db-url", shared_url, "workers", "list", "--json"]).stdout)
    assert listed["workers"][0]["worker"] == worker_name() and listed["workers"][0]["runs"][0]["run_id"] == run_id
    store.close()


@pytest.mark.slow
def test_a_model_call_longer_than_the_claim_keeps_its_run_by_the_heartbeat(shared_url: str) -> None:
    other = default_store(shared_url)
    seen: list[str] = []

    def slow(request: Any) -> str:  # a model call three times the claim's ttl; another worker tries meanwhile
        time.sleep(1.2)
        run_id = max(other.list_runs(), key=lambda r: r.created_at).run_id  # the run playing now
        try:
            other.claim_run(run_id, "host-b/2/y", 60)
            seen.append("taken")
        except RunOwnedError:
            seen.append("refused")
        return "done thinking"

    from loomrt.providers.scripted import FunctionProvider

    rt = Runtime(default_store(shared_url), owner="host-a/1/x", providers=lambda s, m: FunctionProvider(slow))
    rt.claim_ttl_s, rt.heartbeat_s = 0.4, 0.1
    result = asyncio_run(rt.run(AgentSpec(model="scripted/x"), "think hard"))
    assert (result.status, result.output, seen) == ("done", "done thinking", ["refused"])
    rt.heartbeat_s = 60.0  # no beat inside the call: the claim lapses and the other worker takes the run
    seen.clear()
    lapsed = asyncio_run(rt.run(AgentSpec(model="scripted/x"), "think hard"))
    assert seen == ["taken"] and lapsed.status == "failed" and "no longer the run's" in (lapsed.error or "")
    other.close()
    rt.store.close()


def test_out_of_band_writes_go_through_the_runs_claim(postgres_url: str) -> None:
    from loomrt.run.pin_record import pin_in_record

    store = default_store(postgres_url)
    rt = Runtime(store, owner="host-a/1/x", providers=lambda s, m: ScriptedProvider(["one", "two", "three"]))
    spec = AgentSpec.model_validate({"model": "scripted/x", "context": {"mode": "recap"}})
    run_id = asyncio_run(rt.run(spec, "remember the door code 4471")).run_id
    store.release_run(run_id, "host-a/1/x", 1)  # the run is parked: nobody plays it
    first_input = next(e.seq for e in store.events(run_id) if e.kind == "user_input")
    pin_in_record(store, run_id, seq=first_input)  # claimed for the write, fenced, let go
    assert store.run_owners() == []
    (lapsed,) = store.run_owners(expired=True)
    assert (lapsed["owner"], lapsed["epoch"]) == (worker_name(), 2)

    store.claim_run(run_id, "host-b/2/y", 60)  # another worker plays it now
    answer = next(e.seq for e in store.events(run_id) if e.kind == "assistant_message")
    pin_in_record(store, run_id, seq=answer)  # handed to the owner through the record
    assert [(c["owner"], c["epoch"]) for c in store.run_owners()] == [("host-b/2/y", 3)]
    assert [e.kind for e in store.events(run_id)][-2:] == ["pin", "pin"]
    with pytest.raises(RunOwnedError, match="host-b/2/y"):  # a compaction is not the owner's to take in
        asyncio_run(rt.compact(run_id))
    store.release_run(run_id, "host-b/2/y", 3)
    done = asyncio_run(rt.compact(run_id))  # parked again: this worker holds it for the write, then lets go
    assert done["run_id"] == run_id and store.run_owners() == []
    store.close()


def test_a_cancel_from_another_worker_is_handed_to_the_owner_and_stops_the_run(postgres_url: str) -> None:
    import threading

    from loomrt.providers.scripted import FunctionProvider

    other = Runtime(default_store(postgres_url), owner="host-b/2/y", providers=lambda s, m: ScriptedProvider([]))
    said: list[str] = []

    def slow(request: Any) -> str:  # while worker a's model thinks, worker b cancels the run
        run_id = max(other.store.list_runs(), key=lambda r: r.created_at).run_id
        t = threading.Thread(target=lambda: said.append(asyncio_run(other.cancel(run_id, reason="b says stop")).status))
        t.start()
        t.join()
        return "an answer nobody should see"

    rt = Runtime(default_store(postgres_url), owner="host-a/1/x", providers=lambda s, m: FunctionProvider(slow))
    result = asyncio_run(rt.run(AgentSpec(model="scripted/x"), "work on it"))
    kinds = [e.kind for e in rt.store.events(result.run_id)]
    assert said == ["cancelled"] and result.status == "cancelled"
    assert "cancelled" in kinds and "final" not in kinds and "an answer nobody should see" != result.output
    assert rt.store.run_owners() == []  # the ended run let its claim go
    other.store.close()
    rt.store.close()


def asyncio_run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


def test_one_machines_runtime_claims_nothing_unless_told(tmp_path: Any) -> None:
    rt = Runtime(default_store(f"sqlite:{tmp_path / 'r.sqlite'}"), providers=lambda s, m: ScriptedProvider(["x"]))
    assert rt.owner is None
    run = rt.start(AgentSpec(model="scripted/x"))
    assert run.epoch is None and rt.store.run_owners() == []
