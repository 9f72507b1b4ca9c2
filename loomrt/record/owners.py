"""Who plays a run: one worker at a time, through a lease with an epoch.

A worker *claims* a run before it plays it (:meth:`Store.claim_run`): it gets the run's
epoch, which each of its appends then carries as a fencing token. The claim holds for its
``ttl_s``; every fenced append renews it, and while a turn plays a heartbeat thread renews
it every third of the ttl (:class:`Heartbeat`: a model call longer than the ttl keeps its
run). Another
worker's claim is refused while the lease is live, and succeeds once it has expired, with
the epoch one higher; from then on the old owner's appends are refused
(:class:`~loomrt.errors.FencedError`), so a worker that wakes after losing its run cannot
write. Releasing a run expires its lease and keeps its epoch (epochs only grow).

Owner names are ``HOST/PID/INSTANCE`` (:func:`worker_name`), where INSTANCE is random per
process: the host and PID are for people to read, never for judging liveness (a process in
another PID namespace with the same hostname, a container or a pod on the host's network,
has PIDs this one cannot see). Liveness comes from the claim's heartbeat; the one shortcut
is the instance's lock file (:func:`owner_state`): each worker holds an exclusive ``flock``
on ``INSTANCE.lock`` in a folder of this machine's temporary directory for as long as it
lives, so a lock file that can be locked names a worker that is gone, whatever PID
namespace it ran in (a crashed worker's run is resumable at once on its own machine). A
worker whose lock file is not here is judged by its heartbeat alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loomrt.errors import FencedError, RunOwnedError, StoreError

__all__ = [
    "Heartbeats",
    "Beat",
    "beat_once",
    "worker_name",
    "owner_is_gone",
    "owner_state",
    "instances_dir",
    "RUN_LEASE_S",
    "claimed",
    "FENCE",
    "fenced",
    "owner_rows",
    "Heartbeat",
    "append_out_of_band",
]

RUN_LEASE_S = 900.0
"""How long a claim holds without an append: longer than any one model call may take
(the local model's timeout is the longest), so a run that is thinking is never taken over."""


_name: dict[int, str] = {}
_locks: dict[int, int] = {}
"""This process's instance lock (a file descriptor holding its ``flock``), by PID."""
_INSTANCE = re.compile(r"[0-9a-f]{16,32}")


def instances_dir() -> Path:
    """Where this machine's workers keep their instance lock files (one folder per user)."""
    return Path(tempfile.gettempdir()) / f"loomrt-workers-{os.getuid()}"


def worker_name() -> str:
    """This process's owner name, ``HOST/PID/INSTANCE`` (one per process: its runtimes are one
    worker). INSTANCE is random; the process holds its lock file for as long as it lives, and
    leaves it behind when it ends, however it ends (its claims may outlive it: a parked run's)."""
    pid = os.getpid()
    if pid not in _name:
        instance = uuid.uuid4().hex[:16]
        try:
            folder = instances_dir()
            folder.mkdir(mode=0o700, exist_ok=True)
            _prune(folder)
            fd = os.open(folder / f"{instance}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _locks[pid] = fd
        except OSError:  # no lock file: this worker is judged by its heartbeat alone
            pass
        _name[pid] = f"{socket.gethostname()}/{pid}/{instance}"
    return _name[pid]


LOCKS_KEPT_S = 86_400.0
"""How long the lock file of a worker that ended is kept: far longer than any claim outlives
its worker (a claim lapses within its ttl); after that, a claim's lapse says the same."""


def _prune(folder: Path) -> None:
    """Remove the lock files of workers that ended more than :data:`LOCKS_KEPT_S` ago."""
    old = time.time() - LOCKS_KEPT_S
    for path in folder.glob("*.lock"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < old and owner_state(path.stem) == "gone":
                path.unlink()


OwnerState = Literal["running", "gone", "unknown"]


def owner_state(owner: str) -> OwnerState:
    """What this machine knows of worker ``owner``: ``running`` (its instance lock is held),
    ``gone`` (its lock file is here and nobody holds it: the process ended, in whatever PID
    namespace it ran) or ``unknown`` (no lock file of it here: another machine, another
    container, or a name from before instance ids; judge it by its heartbeat)."""
    instance = owner.rsplit("/", 1)[-1]
    if not _INSTANCE.fullmatch(instance):
        return "unknown"
    try:
        fd = os.open(instances_dir() / f"{instance}.lock", os.O_RDWR)
    except OSError:
        return "unknown"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return "running"
    except OSError:
        return "unknown"
    finally:
        os.close(fd)  # closing lets go of a lock this check took
    return "gone"


def owner_is_gone(owner: str) -> bool:
    """True if ``owner`` is a worker of this machine that no longer runs (:func:`owner_state`)."""
    return owner_state(owner) == "gone"


def claimed(run_id: str, owner: str, row: tuple[str, int, float] | None, now: float, high: int = 0) -> int:
    """The epoch ``owner`` gets for ``run_id`` whose claim is ``row`` (owner, epoch,
    expires_at) at time ``now``, where ``high`` is the highest epoch the run ever handed out
    (``run_epochs``, which only grows): the same for its own owner; else, once the lease
    expired (or its worker is gone), or where the claim row was deleted or rewritten below
    ``high``, one above every epoch the run ever had. :class:`RunOwnedError` while another
    worker's claim is live."""
    if row is None:
        return high + 1
    holder, epoch, expires_at = row
    if epoch < high:  # a row below the run's highest epoch (rewritten) is nobody's claim
        return high + 1
    if holder == owner:
        return epoch
    if expires_at <= now or owner_is_gone(holder):
        return epoch + 1
    raise RunOwnedError(
        f"run {run_id} is owned by worker {holder} (epoch {epoch}) for {expires_at - now:.0f} s more; "
        "it is playing there. Wait for it, or for its lease to expire if that worker is dead "
        "(`loomrt workers list` shows the live claims)."
    )


FENCE = "epoch >= COALESCE((SELECT h.epoch FROM run_epochs h WHERE h.run_id = run_owners.run_id), 0)"
"""The SQL condition (on a ``run_owners`` row) that its epoch is still the run's highest:
every fenced append and every heartbeat requires it, so a claim row rewritten to an older
epoch fences its writer as a deleted one does."""


def fenced(run_id: str, epoch: int, row: tuple[str, int, float] | None) -> str:
    """Why a write with ``epoch`` was refused."""
    now_owner = f"worker {row[0]} owns it at epoch {row[1]}" if row else "nobody owns it"
    return (
        f"run {run_id}: this worker's claim (epoch {epoch}) is no longer the run's; {now_owner}. The write is "
        "refused so that two workers never play one run; nothing was written."
    )


def owner_rows(rows: list[Any], now: float) -> list[dict[str, Any]]:
    """Claims as the stores hand them out, from rows ``(run_id, owner, epoch, expires_at,
    ttl_s)``: seconds left, and seconds since the owner last renewed the claim (its
    heartbeat's age: a claim, an append or a heartbeat sets ``expires_at`` to now + ttl).
    A released claim (``expires_at`` 0) says ``released`` and has no heartbeat age."""
    out = []
    for run_id, owner, epoch, expires_at, ttl_s in (r[:5] for r in rows):
        released = float(expires_at) == 0
        out.append(
            {
                "run_id": run_id,
                "owner": owner,
                "epoch": int(epoch),
                "expires_in_s": round(float(expires_at) - now, 1),
                "heartbeat_age_s": None if released else round(now - (float(expires_at) - float(ttl_s)), 1),
                "released": released,
            }
        )
    return out


class Heartbeat:
    """Renews ``owner``'s claim at ``epoch`` on ``run_id`` every ``every_s`` seconds on a
    thread, until :meth:`stop` (a ``with`` block). It only ever renews that claim, never makes
    a new one: once the claim is not the run's (another worker took the run over, or it was
    let go) the heartbeat stops with :attr:`lost` set, and the run's next append is refused
    (fenced), as it must be. A fenced owner never re-claims on its own heartbeat, so it never
    blocks the workers after it. A store error is retried at the next beat (the claim has the
    rest of its ttl)."""

    def __init__(
        self,
        store: Any,
        run_id: str,
        owner: str,
        epoch: int,
        *,
        ttl_s: float = RUN_LEASE_S,
        every_s: float | None = None,
    ):
        self.store, self.run_id, self.owner, self.epoch, self.ttl_s = store, run_id, owner, epoch, ttl_s
        self.every_s = every_s if every_s is not None else ttl_s / 3
        self.beats = 0
        self.lost: str | None = None
        """Why the heartbeat stopped early (the claim is not the run's any more), else None."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"loomrt-heartbeat-{run_id}", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            if not beat_once(self):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def beat_once(beat: Heartbeat | Beat) -> bool:
    """Renew ``beat``'s claim once: False when the claim is not the run's any more (then
    :attr:`lost` says so and nothing was claimed); a store hiccup is True (the claim has the
    rest of its ttl: beat again)."""
    try:
        renewed = beat.store.renew_run(beat.run_id, beat.owner, beat.epoch, beat.ttl_s)
    except Exception:  # noqa: BLE001 - a store hiccup: beat again
        return True
    if not renewed:
        beat.lost = (
            f"run {beat.run_id}: this worker's claim (epoch {beat.epoch}) is no longer the run's; "
            "its heartbeat stopped and claimed nothing"
        )
        return False
    beat.beats += 1
    return True


@dataclass
class Beat:
    """One claim :class:`Heartbeats` renews: how often, how many times so far, and why it
    stopped early (:attr:`lost`: the claim is not the run's any more), else None."""

    store: Any
    run_id: str
    owner: str
    epoch: int
    ttl_s: float
    every_s: float
    next_at: float
    beats: int = 0
    lost: str | None = None
    renewing: bool = False
    """A renewal of this claim is under way (on :data:`RENEWERS`'s threads)."""


RENEWERS = 4
"""Claims :class:`Heartbeats` renews at once: a renewal that waits (on the pool, on the row's
lock while the run's own step holds it, on a stalled network) delays no other claim's."""


HEARTBEATS_IDLE_S = 30.0
"""How long the heartbeat thread (and its renewers) lingers with nothing to renew before it
stops; the next turn of a claimed run starts it again."""


class Heartbeats:
    """One thread that renews the claims of every turn this process plays (:meth:`hold`, a
    ``with`` block around the turn), by :class:`Heartbeat`'s rules: it only renews that claim,
    stops with :attr:`Beat.lost` once the claim is not the run's, beats again after a store
    error. A turn starts and joins no thread of its own (which would block the event loop the
    other runs play on, each turn); the thread is started once and renews whatever is held
    while the loop is busy, or blocked (a provider that does not yield). The renewals
    themselves run on a few threads of their own, so one that waits holds up no other."""

    def __init__(self) -> None:
        self._held: dict[int, Beat] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewing: ThreadPoolExecutor | None = None

    @contextlib.contextmanager
    def hold(self, store: Any, run_id: str, owner: str, epoch: int, *, ttl_s: float, every_s: float) -> Iterator[Beat]:
        beat = Beat(store, run_id, owner, epoch, ttl_s, every_s, next_at=time.monotonic() + every_s)
        with self._lock:
            self._held[id(beat)] = beat
            if self._renewing is None:
                self._renewing = ThreadPoolExecutor(max_workers=RENEWERS, thread_name_prefix="loomrt-renew")
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="loomrt-heartbeats", daemon=True)
                self._thread.start()
        self._wake.set()  # the thread looks at its next beat again
        try:
            yield beat
        finally:
            with self._lock:
                self._held.pop(id(beat), None)

    def _run(self) -> None:
        idle_since: float | None = None
        while True:
            with self._lock:
                held = list(self._held.values())
                if held:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= HEARTBEATS_IDLE_S:  # nothing held a while: stop
                    self._thread = None
                    if self._renewing is not None:
                        self._renewing.shutdown(wait=False)
                        self._renewing = None
                    return
            now = time.monotonic()
            for beat in held:
                if beat.next_at > now or beat.renewing:
                    continue
                beat.next_at, beat.renewing = now + beat.every_s, True
                assert self._renewing is not None
                try:
                    self._renewing.submit(self._renew, beat)
                except RuntimeError:  # the interpreter is exiting: nothing more to renew
                    return
            with self._lock:
                due = [b.next_at for b in self._held.values()]
            self._wake.wait(max(0.0, min(due) - time.monotonic()) if due else HEARTBEATS_IDLE_S)
            self._wake.clear()

    def _renew(self, beat: Beat) -> None:
        try:
            kept = beat_once(beat)
        finally:
            beat.renewing = False
        if not kept:
            with self._lock:
                self._held.pop(id(beat), None)


def append_out_of_band(store: Any, run_id: str, kind: str, data: dict[str, Any]) -> Any:
    """An operator's event on a run (a pin, an unpin), appended through the run's claim where
    several workers share the record: while the run is parked the writer claims it for the
    write (fenced like an owner's append, then let go); while another worker plays it the
    event is handed to that owner through the record, which takes it in at its next event. A
    write a new owner fenced off meanwhile is tried again, never dropped. The event."""
    if not getattr(store, "shared", False):
        return store.append(run_id, kind, data)
    me = worker_name()
    for _ in range(10):
        try:
            epoch = store.claim_run(run_id, me, 60.0)
        except RunOwnedError:
            return store.append(run_id, kind, data)  # the owner's run reads it at its next event
        try:
            return store.append_many(run_id, [(kind, data)], epoch=epoch)[0]
        except FencedError:
            continue  # a worker claimed the run between the claim and the write: now it is the owner's
        finally:
            store.release_run(run_id, me, epoch)
    raise StoreError(
        f"run {run_id}: the {kind} could not be written through the run's claim after 10 tries "
        "(workers keep taking the run over); nothing was written. Try again."
    )
