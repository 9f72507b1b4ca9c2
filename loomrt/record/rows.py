"""The SQL and row shapes both stores share (only the placeholder differs: SQLite's ``?``,
psycopg's ``%s``): a run's row, and the query that reads runs with their derived status."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loomrt.errors import NotFoundError, StoreError
from loomrt.events import LIFECYCLE_KINDS, Event, RunInfo, run_status
from loomrt.record.ledger import KEY_ENV, KEY_FILE_ENV, canonical, event_hash, genesis

__all__ = [
    "RUN_COLUMNS",
    "run_row",
    "insert_run_sql",
    "runs_sql",
    "run_info",
    "RunSums",
    "sums_sql",
    "run_sums",
    "RunReads",
    "chained",
    "chain_key",
    "new_run",
    "chain_start",
]

RUN_COLUMNS = (
    "run_id",
    "agent",
    "def_hash",
    "mode",
    "model",
    "interactive",
    "agents_file",
    "parent_run_id",
    "created_at",
    "root_run_id",
    "forked_from",
    "fork_seq",
    "chain",
)

_LIFECYCLE = ", ".join(f"'{k}'" for k in LIFECYCLE_KINDS)


def run_row(info: RunInfo) -> tuple[Any, ...]:
    """``info`` as the values of :data:`RUN_COLUMNS`."""
    return (
        info.run_id,
        info.agent,
        info.def_hash,
        info.mode,
        info.model,
        int(info.interactive),
        info.agents_file,
        info.parent_run_id,
        info.created_at,
        info.root_run_id,
        info.forked_from,
        info.fork_seq,
        info.chain,
    )


def insert_run_sql(mark: str) -> str:
    """INSERT of one run row, with ``mark`` as the placeholder."""
    return f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join([mark] * len(RUN_COLUMNS))})"


def runs_sql(where: str, mark: str) -> str:
    """Runs with their last lifecycle kind and last seq, newest first, ``where`` applied and
    the limit a ``mark`` placeholder (read them with :func:`run_info`)."""
    return f"""
        SELECT r.run_id, r.agent, r.def_hash, r.mode, r.model, r.interactive, r.agents_file,
               r.parent_run_id, r.created_at,
               (SELECT kind FROM events e WHERE e.run_id = r.run_id AND e.kind IN ({_LIFECYCLE})
                ORDER BY seq DESC LIMIT 1),
               (SELECT COALESCE(MAX(seq), 0) FROM events e WHERE e.run_id = r.run_id),
               r.root_run_id, r.forked_from, r.fork_seq, r.chain
        FROM runs r {where} ORDER BY r.created_at DESC LIMIT {mark}"""


@dataclass(frozen=True)
class RunSums:
    """What a runs row sums from a run's own events (:meth:`~loomrt.record.store.Store.run_sums`)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    """Its model calls' usage (distillation calls too)."""
    model_calls: int = 0
    distillations: int = 0
    turns: int = 0
    """Its user inputs (a fork's own, after its fork point)."""
    first_input: int | None = None
    """The seq of its first user input (the task); None before one."""
    task: str | None = None
    """That input's content."""
    task_private: bool = False
    """That input is private (its last ``mark_private`` or ``declassify`` is a mark)."""
    last_ts: float | None = None
    """When its last event was recorded; None for a run with no event yet."""


def sums_sql(among: str, field: Callable[[str, str], str]) -> str:
    """One grouped query of :class:`RunSums` for a list of runs: ``among`` is the condition on a
    run id column that picks them (it appears twice: its arguments are given twice), ``field(alias,
    "a.b")`` the SQL of the JSON text at ``a.b`` in that alias's ``data`` (SQLite's ``json_extract``,
    PostgreSQL's ``->>``). Read its rows with :func:`run_sums`."""

    def num(alias: str, path: str) -> str:
        return f"COALESCE(CAST({field(alias, path)} AS BIGINT), 0)"

    def when(kind: str, value: str = "1") -> str:
        return f"SUM(CASE WHEN e.kind = '{kind}' THEN {value} ELSE 0 END)"

    return f"""
        WITH s AS (
            SELECT e.run_id,
                   {when("model_call", num("e", "usage.input_tokens"))},
                   {when("model_call", num("e", "usage.output_tokens"))},
                   {when("model_call", num("e", "usage.cached_tokens"))},
                   {when("model_call")}, {when("distillation")}, {when("user_input")},
                   MIN(CASE WHEN e.kind = 'user_input' THEN e.seq END) AS first_input
            FROM events e
            WHERE e.run_id {among} AND e.kind IN ('model_call', 'distillation', 'user_input')
            GROUP BY e.run_id)
        SELECT r.run_id, s.*,
               (SELECT {field("u", "content")} FROM events u WHERE u.run_id = r.run_id AND u.seq = s.first_input),
               (SELECT p.kind FROM events p WHERE p.run_id = r.run_id AND p.kind IN ('mark_private', 'declassify')
                AND CAST({field("p", "seq")} AS BIGINT) = s.first_input ORDER BY p.seq DESC LIMIT 1),
               (SELECT l.ts FROM events l WHERE l.run_id = r.run_id ORDER BY l.seq DESC LIMIT 1)
        FROM runs r LEFT JOIN s ON s.run_id = r.run_id
        WHERE r.run_id {among}"""


def run_sums(rows: list[tuple[Any, ...]]) -> dict[str, RunSums]:
    """The rows of :func:`sums_sql` by run id."""
    out = {}
    for run_id, _, tin, tout, tcached, calls, distilled, turns, first, task, mark, last_ts in rows:
        out[run_id] = RunSums(
            input_tokens=int(tin or 0),
            output_tokens=int(tout or 0),
            cached_tokens=int(tcached or 0),
            model_calls=int(calls or 0),
            distillations=int(distilled or 0),
            turns=int(turns or 0),
            first_input=None if first is None else int(first),
            task=None if first is None else str(task),
            task_private=mark == "mark_private",
            last_ts=None if last_ts is None else float(last_ts),
        )
    return out


def new_run(info: RunInfo, key: bytes | None) -> RunInfo:
    """``info`` as a store writes a new run: chained v2 (keyed) while the store has a ledger
    key, else v1; a scheme already named (a copied run) is kept."""
    return info if info.chain else info.model_copy(update={"chain": "v2" if key is not None else "v1"})


def chain_key(run_id: str, chain: str | None, key: bytes | None) -> bytes | None:
    """The key a run's events are hashed with: None for a v1 run; the ledger key for a v2
    run, which a process without it may not append to (:class:`StoreError`)."""
    if chain != "v2":
        return None
    if key is None:
        raise StoreError(
            f"run {run_id}'s record is keyed (chain v2) and this process has no ledger key: set "
            f"${KEY_ENV} or ${KEY_FILE_ENV} to the deployment's key (every writer of a shared record needs it)"
        )
    return key


def chain_start(info: RunInfo, key: bytes | None) -> str:
    """What a run's first event chains to: "" for v1, the keyed digest of its row for v2."""
    k = chain_key(info.run_id, info.chain, key)
    return genesis(info, k) if k is not None else ""


def chained(
    run_id: str,
    seq: int,
    prev: str,
    ts: float,
    items: list[tuple[str, dict[str, Any]]],
    key: bytes | None = None,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[Event]]:
    """The rows of ``items`` (kind, data) appended after ``seq`` (whose hash is ``prev``) at
    ``ts``: event rows (run_id, seq, kind, ts, data, hash) with each data the canonical text
    the ledger hashes, card index rows (card_id, run_id, seq, depth, data) of the
    distillations' cards, and the events as written. ``key``: a v2 run's (:func:`chain_key`)."""
    rows: list[tuple[Any, ...]] = []
    cards: list[tuple[Any, ...]] = []
    events: list[Event] = []
    for kind, data in items:
        payload = canonical(data)
        seq += 1
        prev = event_hash(prev, run_id, seq, kind, ts, payload, key)
        rows.append((run_id, seq, kind, ts, payload, prev))
        for card in data.get("cards") or () if kind == "distillation" else ():
            cards.append((card["id"], run_id, seq, int(card["depth"]), canonical(card)))
        events.append(Event(run_id=run_id, seq=seq, kind=kind, ts=ts, data=json.loads(payload), hash=prev))
    return rows, cards, events


def run_info(r: tuple[Any, ...]) -> RunInfo:
    """One row of :func:`runs_sql` as a :class:`RunInfo`."""
    return RunInfo(
        run_id=r[0],
        agent=r[1],
        def_hash=r[2],
        mode=r[3],
        model=r[4],
        interactive=bool(r[5]),
        agents_file=r[6],
        parent_run_id=r[7],
        created_at=r[8],
        status=run_status(r[9]),
        last_seq=int(r[10]),
        root_run_id=r[11],
        forked_from=r[12],
        fork_seq=r[13],
        chain=r[14] or "v1",
    )


class RunReads:
    """``get_run``, ``children`` and ``list_runs`` over a store's ``_runs(where, args, limit)``
    (which runs :func:`runs_sql` with its placeholder, ``_mark``)."""

    _mark = "?"
    _now = "((julianday('now') - 2440587.5) * 86400.0)"
    """The store's clock in SQL, epoch seconds (claims expire by it)."""
    path: Any

    if TYPE_CHECKING:  # what the store itself defines

        def _runs(self, where: str, args: list[Any], limit: int) -> list[RunInfo]: ...

    def get_run(self, run_id: str) -> RunInfo:
        """One run; :class:`~loomrt.errors.NotFoundError` for an unknown id."""
        runs = self._runs(f"WHERE r.run_id = {self._mark}", [run_id], 1)
        if not runs:
            raise NotFoundError(f"no run {run_id!r} in {self.path}. `loomrt runs list` shows the runs.")
        return runs[0]

    def children(self, run_id: str) -> list[RunInfo]:
        """The runs ``run_id`` spawned (sub-agents), oldest first."""
        return sorted(self._runs(f"WHERE r.parent_run_id = {self._mark}", [run_id], 10_000), key=lambda r: r.created_at)

    def stalled_runs(self, owners: Iterable[str] = ()) -> list[RunInfo]:
        """The active runs whose claim lapsed, or is still held by one of ``owners``, in one query
        however many runs were ever played (an idle worker's look, :func:`loomrt.worker.abandoned`).
        A claim let go (``expires_at`` 0: the run ended, parked or was queued) is not looked at:
        a run handed back while active is let lapse instead (:func:`loomrt.worker_life.hand_back`)."""
        held = list(dict.fromkeys(owners))
        among = f" OR o.owner IN ({', '.join([self._mark] * len(held))})" if held else ""
        claims = f"SELECT o.run_id FROM run_owners o WHERE o.expires_at > 0 AND (o.expires_at <= {self._now}{among})"
        return [r for r in self._runs(f"WHERE r.run_id IN ({claims})", held, 2**31 - 1) if r.status == "active"]

    def list_runs(self, *, limit: int = 50, agent: str | None = None) -> list[RunInfo]:
        """Recent runs, newest first (of one agent, with ``agent``)."""
        if agent:
            return self._runs(f"WHERE r.agent = {self._mark}", [agent], limit)
        return self._runs("", [], limit)
