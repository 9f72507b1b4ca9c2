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

Owner names are ``HOST/PID/NONCE`` (:func:`worker_name`): a claim held by a process of
this host that no longer exists has expired, whatever its time said (a crashed worker's
run is resumable at once on its own machine; on another machine, after the lease's ttl).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import Any

from loomrt.errors import FencedError, RunOwnedError, StoreError

__all__ = [
    "worker_name",
    "owner_is_gone",
    "RUN_LEASE_S",
    "claimed",
    "fenced",
    "owner_rows",
    "Heartbeat",
    "append_out_of_band",
]

RUN_LEASE_S = 900.0
"""How long a claim holds without an append: longer than any one model call may take
(the local model's timeout is the longest), so a run that is thinking is never taken over."""


_name: dict[int, str] = {}


def worker_name() -> str:
    """This process's owner name, ``HOST/PID/NONCE`` (one per process: its runtimes are one worker)."""
    pid = os.getpid()
    if pid not in _name:
        _name[pid] = f"{socket.gethostname()}/{pid}/{uuid.uuid4().hex[:6]}"
    return _name[pid]


def owner_is_gone(owner: str) -> bool:
    """True if ``owner`` names a process of this host that no longer runs."""
    parts = owner.split("/")
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def claimed(run_id: str, owner: str, row: tuple[str, int, float] | None, now: float) -> int:
    """The epoch ``owner`` gets for ``run_id`` whose claim is ``row`` (owner, epoch,
    expires_at) at time ``now``: 1 for a run never claimed, the same for its own owner, one
    more once the lease expired (or its process is gone); else :class:`RunOwnedError`."""
    if row is None:
        return 1
    holder, epoch, expires_at = row
    if holder == owner:
        return epoch
    if expires_at <= now or owner_is_gone(holder):
        return epoch + 1
    raise RunOwnedError(
        f"run {run_id} is owned by worker {holder} (epoch {epoch}) for {expires_at - now:.0f} s more; "
        "it is playing there. Wait for it, or for its lease to expire if that worker is dead "
        "(`loomrt workers list` shows the live claims)."
    )


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
    """Renews ``owner``'s claim on ``run_id`` every ``every_s`` seconds on a thread, until
    :meth:`stop` (a ``with`` block). A renewal that finds the run owned by another worker
    stops the heartbeat: the run's next append is then refused (fenced), as it must be; a
    store error is retried at the next beat (the claim has the rest of its ttl)."""

    def __init__(
        self, store: Any, run_id: str, owner: str, *, ttl_s: float = RUN_LEASE_S, every_s: float | None = None
    ):
        self.store, self.run_id, self.owner, self.ttl_s = store, run_id, owner, ttl_s
        self.every_s = every_s if every_s is not None else ttl_s / 3
        self.beats = 0
        self.lost: str | None = None
        """Why the heartbeat stopped early (the run is another worker's), else None."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"loomrt-heartbeat-{run_id}", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.store.claim_run(self.run_id, self.owner, self.ttl_s)
                self.beats += 1
            except RunOwnedError as exc:
                self.lost = str(exc)
                return
            except Exception:  # noqa: BLE001 - a store hiccup: the claim has the rest of its ttl; beat again
                continue

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


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
