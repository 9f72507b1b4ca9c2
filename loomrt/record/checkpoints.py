"""WAL checkpoints off the commit path.

SQLite in WAL mode copies the log back into the database file (a checkpoint, with its
fsync) inside whichever commit crosses the auto-checkpoint size: one append in a few
hundred took 5–14 ms instead of 0.1 ms, and under a hundred concurrent runs that append's
turn was the slowest of all. Stores turn the automatic checkpoint off and register here;
one thread of the process checkpoints every store that committed since it last looked,
``PASSIVE`` (it never blocks a writer or a reader), on a connection of its own. The
sqlite3 module releases the GIL while SQLite works, so the copying overlaps the runs.

A store that is closed or garbage-collected drops out. A process killed mid-checkpoint
loses nothing: SQLite's checkpoint is crash-safe, and the log is kept until it completes.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import weakref
from pathlib import Path
from typing import Protocol

__all__ = ["Checkpointed", "register", "INTERVAL_S"]

INTERVAL_S = 0.25
"""How often the thread looks for stores with new commits."""


class Checkpointed(Protocol):
    path: Path
    closed: bool

    @property
    def commits(self) -> int:
        """Rows written so far (the thread checkpoints a store whose count moved)."""


_stores: weakref.WeakSet[Checkpointed] = weakref.WeakSet()
_lock = threading.Lock()
_thread: threading.Thread | None = None


def register(store: Checkpointed) -> None:
    """Checkpoint ``store`` from now on (starting the thread on first use)."""
    global _thread
    with _lock:
        _stores.add(store)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_loop, name="loomrt-wal-checkpoints", daemon=True)
            _thread.start()


def _loop() -> None:
    conns: dict[Path, sqlite3.Connection] = {}
    seen: dict[Path, int] = {}
    while True:
        time.sleep(INTERVAL_S)
        try:
            _once(conns, seen)
        except Exception:  # noqa: BLE001 - the thread must outlive any surprise; the log waits
            pass


def _once(conns: dict[Path, sqlite3.Connection], seen: dict[Path, int]) -> None:
    """Checkpoint each live store with commits since the last look; forget the others."""
    with _lock:
        live = [s for s in _stores if not s.closed]
    paths = {s.path for s in live}
    for path in [p for p in conns if p not in paths]:  # its store went away
        conns.pop(path).close()
        seen.pop(path, None)
    for store in live:
        commits = store.commits
        if seen.get(store.path) == commits:
            continue
        seen[store.path] = commits
        try:
            conn = conns.get(store.path)
            if conn is None:
                conn = conns[store.path] = sqlite3.connect(store.path, check_same_thread=False, isolation_level=None)
                conn.execute("PRAGMA busy_timeout=1000")
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:  # a full disk or a locked file: the log waits for the next try
            seen.pop(store.path, None)
