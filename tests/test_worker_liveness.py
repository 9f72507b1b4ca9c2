"""Who is alive is judged by a worker's random instance id and its heartbeat, never by its
host name and PID (issue 45): a worker in another PID namespace of the same host keeps its
run while its heartbeat is fresh, and a worker that is really gone is seen at once. On both
backends, with real processes (a real PID namespace through ``unshare``)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest
from owners_kit import crashed_worker, kill, namespaced_claimer

from loomrt import Runtime
from loomrt.errors import RunOwnedError
from loomrt.record.owners import Heartbeat, owner_is_gone, owner_state, worker_name
from loomrt.record.sqlite import default_store
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider
from loomrt.worker import abandoned


def _active_run(url: str) -> str:
    """A run that was playing (active) when its worker stopped answering."""
    rt = Runtime(default_store(url), providers=lambda s, m: ScriptedProvider(["x"]))
    run = rt.start(AgentSpec(model="scripted/x"))
    if rt.owner is not None and run.epoch is not None:  # PostgreSQL: its starter claimed it; let it go
        rt.store.release_run(run.run_id, rt.owner, run.epoch)
    rt.store.close()
    return run.run_id


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


@pytest.mark.slow
def test_a_namesake_with_the_same_host_and_pid_keeps_its_run_while_its_heartbeat_is_fresh(shared_url: str) -> None:
    run_id = _active_run(shared_url)
    pid = _dead_pid()  # no process of this namespace has it: the old check called that gone
    namesake = f"{socket.gethostname()}/{pid}/{os.urandom(8).hex()}"  # another namespace's worker
    store = default_store(shared_url)
    epoch = store.claim_run(run_id, namesake, 900.0)  # its heartbeat is fresh
    assert owner_state(namesake) == "unknown" and not owner_is_gone(namesake)
    assert abandoned(store) == []
    rt = Runtime(store, owner=worker_name(), providers=lambda s, m: ScriptedProvider(["taken"]))
    with pytest.raises(RunOwnedError, match=f"run {run_id} is owned by worker {namesake}"):
        asyncio.run(rt.resume(run_id))
    assert [(c["owner"], c["epoch"]) for c in store.run_owners()] == [(namesake, epoch)]
    store.close()


@pytest.mark.slow
def test_a_worker_in_another_pid_namespace_keeps_its_run_and_is_seen_gone_once_killed(shared_url: str) -> None:
    run_id = _active_run(shared_url)
    proc, owner = namespaced_claimer(shared_url, run_id)
    try:
        host, pid, _ = owner.split("/")
        assert host == socket.gethostname()
        with pytest.raises(ProcessLookupError):  # its PID means nothing here
            os.kill(int(pid), 0)
        assert owner_state(owner) == "running"  # its instance lock is held, across namespaces
        store = default_store(shared_url)
        assert abandoned(store) == []
        rt = Runtime(store, owner=worker_name(), providers=lambda s, m: ScriptedProvider(["taken"]))
        with pytest.raises(RunOwnedError, match=f"owned by worker {owner}"):
            asyncio.run(rt.resume(run_id))
    finally:
        kill(proc)
    assert owner_state(owner) == "gone"  # its lock file is left and nobody holds it
    assert abandoned(store) == [run_id]  # resumable at once, lease or not
    result = asyncio.run(rt.resume(run_id))
    assert result.status == "done" and result.output == "taken"
    store.close()


@pytest.mark.slow
def test_a_worker_of_this_machine_that_ended_is_gone_however_it_ended() -> None:
    assert owner_state(crashed_worker()) == "gone"
    clean = subprocess.run(
        [sys.executable, "-c", "from loomrt.record.owners import worker_name; print(worker_name())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert owner_state(clean) == "gone"  # its claims may outlive it (a parked run's): its lock file stays
    assert owner_state(worker_name()) == "running"  # this process
    assert owner_state("host/1/../../etc") == "unknown"  # not an instance id: never a path


def test_a_fenced_owner_never_reclaims_on_its_own_heartbeat(shared_url: str) -> None:
    run_id = _active_run(shared_url)
    store = default_store(shared_url)
    a = store.claim_run(run_id, "host-a/1/a", 0.2)  # a plays; then it stalls past its lease
    time.sleep(0.3)
    assert store.claim_run(run_id, "host-b/2/b", 0.2) == a + 1  # b takes the run over (a is fenced) ...
    store.release_run(run_id, "host-b/2/b", a + 1)  # ... and lets it go
    with Heartbeat(store, run_id, "host-a/1/a", a, ttl_s=900.0, every_s=0.05) as beat:
        time.sleep(0.3)  # a's heartbeat thread wakes up and beats
    assert beat.beats == 0 and f"claim (epoch {a}) is no longer the run's" in (beat.lost or "")
    assert store.run_owners() == []  # a holds nothing: no 900 s block for the workers after it
    assert store.claim_run(run_id, "host-c/3/c", 60.0) == a + 2  # the next worker takes it at once
    with Heartbeat(store, run_id, "host-c/3/c", a + 2, ttl_s=60.0, every_s=0.05) as live:
        time.sleep(0.3)
    assert live.beats >= 2 and live.lost is None  # the owner's own heartbeat renews its claim
    store.close()


def test_a_foreground_input_on_sqlite_is_refused_while_a_live_worker_plays_the_run(tmp_path) -> None:
    """On one machine a foreground command claims nothing, but a worker does (``run --detach``):
    ``runs continue`` of the run it plays must not play a turn beside it (it did: two turns
    at once, and ``runs verify`` failed). A dead worker's claim does not stand in the way."""
    from loomrt.record.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "record.sqlite")
    rt = Runtime(store, providers=lambda s, m: ScriptedProvider(["one", "two", "three"]))
    assert rt.owner is None
    run = rt.start(AgentSpec(model="scripted/x"), interactive=True)
    asyncio.run(rt.send(run, "first"))
    epoch = store.claim_run(run.run_id, worker_name(), 30.0)  # a live worker (this process) plays it now
    with pytest.raises(RunOwnedError, match="being played by worker"):
        asyncio.run(rt.continue_run(run.run_id, "second"))
    store.release_run(run.run_id, worker_name(), epoch)
    store.claim_run(run.run_id, crashed_worker(), 30.0)  # its worker died mid-turn: the claim is nobody's
    assert asyncio.run(rt.continue_run(run.run_id, "second")).status == "parked"


def test_one_thread_renews_every_turns_claim_and_a_turn_starts_no_thread(shared_url: str) -> None:
    """The runtime's heartbeats: the turns playing at once hold their claims in one thread,
    which renews each, stops a claim that is not the run's any more, and is started once."""
    import threading

    from loomrt.record.owners import Heartbeats

    first, second = _active_run(shared_url), _active_run(shared_url)
    store = default_store(shared_url)
    e1 = store.claim_run(first, "host-a/1/a", 0.3)
    e2 = store.claim_run(second, "host-a/1/a", 0.3)
    beats = Heartbeats()
    with (
        beats.hold(store, first, "host-a/1/a", e1, ttl_s=0.3, every_s=0.05) as one,
        beats.hold(store, second, "host-a/1/a", e2, ttl_s=0.3, every_s=0.05) as two,
    ):
        time.sleep(0.6)  # twice the claims' ttl: alive only by the beats
        assert {c["run_id"] for c in store.run_owners()} == {first, second}
    assert one.beats >= 3 and two.beats >= 3 and one.lost is None and two.lost is None
    threads = threading.active_count()
    for _ in range(5):  # five more turns: no thread started for any of them
        with beats.hold(store, first, "host-a/1/a", e1, ttl_s=0.3, every_s=0.05):
            pass
    assert threading.active_count() == threads
    time.sleep(0.4)
    assert store.claim_run(first, "host-b/2/b", 60.0) == e1 + 1  # lapsed once let go; b takes it
    with beats.hold(store, first, "host-a/1/a", e1, ttl_s=0.3, every_s=0.05) as fenced_out:
        time.sleep(0.3)
    assert fenced_out.beats == 0 and f"claim (epoch {e1}) is no longer the run's" in (fenced_out.lost or "")
    store.close()


def test_a_renewal_that_waits_holds_up_no_other_claims_renewal(shared_url: str) -> None:
    """One claim's renewal waits a second (the row locked by another connection's step, a
    saturated pool): the other claim held beside it goes on being renewed meanwhile."""
    from loomrt.record.owners import Heartbeats

    slow, quick = _active_run(shared_url), _active_run(shared_url)
    store = default_store(shared_url)
    renew = store.renew_run

    def renew_waiting(run_id: str, *args: object, **kw: object) -> object:
        if run_id == slow:
            time.sleep(1.0)
        return renew(run_id, *args, **kw)

    store.renew_run = renew_waiting
    e1 = store.claim_run(slow, "host-a/1/a", 5.0)
    e2 = store.claim_run(quick, "host-a/1/a", 0.3)
    beats = Heartbeats()
    try:
        with (
            beats.hold(store, slow, "host-a/1/a", e1, ttl_s=5.0, every_s=0.05) as waiting,
            beats.hold(store, quick, "host-a/1/a", e2, ttl_s=0.3, every_s=0.05) as other,
        ):
            time.sleep(0.8)  # the slow renewal is still waiting
            assert waiting.beats == 0
            assert other.beats >= 5  # renewed all the while (one at a time: 0, behind the wait)
            assert quick in {c["run_id"] for c in store.run_owners()}  # past its 0.3 s ttl: alive by the beats
    finally:
        time.sleep(1.1)  # the waiting renewal ends before the store closes
        store.close()


def test_the_heartbeat_thread_stops_once_nothing_is_held_and_starts_again(
    shared_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime's one heartbeat thread (and its renewers) stops when no claim is held for
    a while, and the next claim held starts it again and is renewed."""
    import threading

    from loomrt.record import owners
    from loomrt.record.owners import Heartbeats

    monkeypatch.setattr(owners, "HEARTBEATS_IDLE_S", 0.2)
    run_id = _active_run(shared_url)
    store = default_store(shared_url)
    epoch = store.claim_run(run_id, "host-a/1/a", 5.0)
    beats = Heartbeats()

    try:
        with beats.hold(store, run_id, "host-a/1/a", epoch, ttl_s=5.0, every_s=0.05) as first:
            time.sleep(0.3)
            thread, renewers = beats._thread, beats._renewing
        assert first.beats >= 2 and thread is not None and renewers is not None and thread.is_alive()
        time.sleep(0.8)  # nothing held past the idle time: the thread and its renewers end
        assert not thread.is_alive() and beats._renewing is None
        assert not [t for t in threading.enumerate() if t in getattr(renewers, "_threads", ())]
        with beats.hold(store, run_id, "host-a/1/a", epoch, ttl_s=5.0, every_s=0.05) as again:
            time.sleep(0.3)
        assert again.beats >= 2  # started again, and renewing
    finally:
        store.close()
