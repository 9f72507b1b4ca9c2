"""The record's ledger: each event carries a hash chained to the previous event of its run.

``hash(n) = H(hash(n-1) | run_id | seq | kind | ts | canonical(data))``, where the
canonical form is JSON with sorted keys and no spaces, so the chain verifies the same on
any backend (PostgreSQL's jsonb reorders keys). Each run names its chain scheme:

- **v1** (plain): ``H`` is SHA-256 and the first event chains to the empty string. Anyone
  who can write the database can re-chain an edited run so that it verifies again.
- **v2** (keyed): ``H`` is HMAC-SHA256 under the deployment's ledger key
  (:func:`ledger_key`), and the first event chains to :func:`genesis`, a keyed digest of
  the run's row (agent, model, mode, lineage, ...), so the row is covered too. Without the
  key, no edit re-chains.

A store writes v2 for every new run while it has a key, and refuses to append to a v2 run
without one. Triggers refuse to change the record; the chain makes a change made around
them (a copied and edited file, a dropped trigger) detectable: :func:`verify_chain`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loomrt.errors import StoreError
from loomrt.events import Event, RunInfo

__all__ = [
    "event_hash",
    "verify_chain",
    "canonical",
    "genesis",
    "ledger_key",
    "SCHEMES",
    "KEY_ENV",
    "KEY_FILE_ENV",
    "KEY_BYTES_MIN",
    "GENESIS_FIELDS",
]

SCHEMES = ("v1", "v2")
"""The chain schemes a run may name (``runs.chain``; NULL is v1, the runs before keys)."""
KEY_ENV = "LOOMRT_LEDGER_KEY"
"""The ledger key itself (at least :data:`KEY_BYTES_MIN` bytes of text)."""
KEY_FILE_ENV = "LOOMRT_LEDGER_KEY_FILE"
"""A file that holds the ledger key, readable by its owner only (mode 0600 or 0400)."""
KEY_BYTES_MIN = 16


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def event_hash(prev: str, run_id: str, seq: int, kind: str, ts: float, data: Any, key: bytes | None = None) -> str:
    """The hash of one event, chained to ``prev`` (the previous event's hash, or the run's
    start: "" for v1, :func:`genesis` for v2). ``data`` is the payload, or its
    :func:`canonical` text already made; ``key``: the ledger key of a v2 run."""
    text = data if isinstance(data, str) else canonical(data)
    blob = "\x1f".join([prev, run_id, str(seq), kind, repr(float(ts)), text]).encode("utf-8")
    if key is None:
        return hashlib.sha256(blob).hexdigest()
    return hmac.new(key, blob, hashlib.sha256).hexdigest()


GENESIS_FIELDS = (
    "run_id",
    "agent",
    "def_hash",
    "mode",
    "model",
    "interactive",
    "agents_file",
    "parent_run_id",
    "root_run_id",
    "forked_from",
    "fork_seq",
    "created_at",
    "chain",
)
"""The fields of a run's row a v2 chain covers: what the run is, not its derived status
(a column added later is covered only by a scheme that names it)."""


def _row(info: RunInfo) -> dict[str, Any]:
    return {f: getattr(info, f) for f in GENESIS_FIELDS}


def genesis(info: RunInfo, key: bytes) -> str:
    """What a v2 run's first event chains to: a keyed digest of its row, so an edited row
    (another agent, model or mode, a changed lineage) breaks the chain."""
    return hmac.new(key, ("run\x1f" + canonical(_row(info))).encode("utf-8"), hashlib.sha256).hexdigest()


def ledger_key(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The deployment's ledger key: ``$LOOMRT_LEDGER_KEY``, else the file named by
    ``$LOOMRT_LEDGER_KEY_FILE`` (mode 0600 or stricter), else None (runs are chained v1).
    :class:`~loomrt.errors.StoreError` for a key too short or a file others can read."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    text = env.get(KEY_ENV, "")
    where = f"${KEY_ENV}"
    if not text and env.get(KEY_FILE_ENV):
        path = Path(env[KEY_FILE_ENV]).expanduser()
        where = f"the key file {path} (${KEY_FILE_ENV})"
        try:
            mode = path.stat().st_mode
            text = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise StoreError(f"cannot read {where}: {exc.strerror or exc}. Fix the path, or unset it.") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise StoreError(
                f"{where} can be read by others (mode {stat.S_IMODE(mode):o}): the ledger key must be the "
                f"owner's alone. Run `chmod 600 {path}`."
            )
    if not text:
        return None
    key = text.encode("utf-8")
    if len(key) < KEY_BYTES_MIN:
        raise StoreError(
            f"{where} is {len(key)} bytes; a ledger key needs at least {KEY_BYTES_MIN}. "
            "`loomrt db keygen FILE` writes a random one."
        )
    return key


def verify_chain(
    events: Iterable[Event], *, scheme: str = "v1", key: bytes | None = None, start: str = ""
) -> list[str]:
    """One line per problem in a run's record (seqs not dense from 1, or from the fork seq
    for a fork; a hash that does not match its content or its predecessor); an empty list
    when it audits clean. A v2 run needs ``key`` and its ``start`` (:func:`genesis`)."""
    if scheme not in SCHEMES:
        return [f"the run names chain scheme {scheme!r}, which this loomrt does not know ({', '.join(SCHEMES)})"]
    if scheme == "v2" and key is None:
        return [
            f"the run's chain is keyed (v2): set ${KEY_ENV} or ${KEY_FILE_ENV} to the deployment's key to verify it"
        ]
    problems: list[str] = []
    prev, expected = (start if scheme == "v2" else ""), 1
    for e in events:
        if e.kind == "run_started" and e.data.get("forked_from") and expected == 1:
            expected = int(e.data["forked_from"]["seq"]) + 1
        if e.seq != expected:
            problems.append(f"seq {e.seq}: expected seq {expected} (seqs must be dense from 1)")
        expected = e.seq + 1
        if e.hash is None and scheme == "v1":
            problems.append(f"seq {e.seq}: no hash (written before the ledger existed); the chain restarts here")
            prev = ""
            continue
        want = event_hash(prev, e.run_id, e.seq, e.kind, e.ts, e.data, key if scheme == "v2" else None)
        if e.hash != want:
            problems.append(f"seq {e.seq} ({e.kind}): hash does not match its content or the event before it")
        prev = e.hash or ""
    return problems
