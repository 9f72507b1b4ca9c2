"""The ``integrity`` measure: what ``runs verify`` catches, and what its guards cost.

- **caught**: the tamperings of docs/reliability.md's threat model, each made for real with
  direct SQL on a copy of a record the runtime wrote (a scripted run with a tool call): a
  card replaced in the card index (REPLACE around its trigger), a cut tail, a well-chained forged turn, a
  re-chained rewrite of the answer, a changed run row on a keyed chain, and a key holder's
  rewrite against an anchor taken before it. Reported: which of them ``verify_run`` detects,
  and, as the control, that the untouched record verifies clean. The design fails if any
  goes unseen, or if the control does not verify;
- **verify**: every check of ``runs verify`` on a 200-turn recap chat, milliseconds per
  1,000 events, with the prompts re-derived and without;
- **append**: what a turn's append costs (4 events in one transaction, the head anchor
  moved with them), plain (v1) and keyed (v2, HMAC-SHA256), medians over 300 turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure
from loomrt.events import RunInfo
from loomrt.integrity import anchors, verify_run
from loomrt.record.ledger import KEY_ENV, event_hash, genesis
from loomrt.record.sqlite import SQLiteStore

__all__ = ["integrity", "integrity_figures", "caught", "rechain", "forged_turn", "TAMPERINGS"]

KEY = "bench-ledger-key-not-a-secret-0001"


@contextlib.contextmanager
def _ledger_key(key: str | None) -> Iterator[None]:
    """``$LOOMRT_LEDGER_KEY`` set to ``key`` (unset for None) inside the block, as it was after."""
    before = os.environ.pop(KEY_ENV, None)
    if key:
        os.environ[KEY_ENV] = key
    try:
        yield
    finally:
        os.environ.pop(KEY_ENV, None)
        if before is not None:
            os.environ[KEY_ENV] = before


def _played(folder: Path, key: str | None) -> tuple[Path, str]:
    """A run the runtime played (a tool call, then the answer), its record closed."""
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentSpec
    from loomrt.testing import ScriptedProvider

    with _ledger_key(key):
        provider = ScriptedProvider([{"tool_call": {"name": "calculate", "arguments": {"expression": "2+2"}}}, "4"])
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "record.sqlite"
        rt = Runtime(SQLiteStore(path), providers=lambda spec, model: provider)
        spec = AgentSpec.model_validate({"model": "scripted", "tools": ["calculate"]})
        run = rt.start(spec, name="tamper")
        asyncio.run(rt.send(run, "add two and two"))
        rt.store.append(run.run_id, "distillation", {"mode": "fold", "cards": [CARD]})  # out of band, after final
        rt.store.close()
    return path, run.run_id


def _copy(path: Path, name: str, *drop: str) -> sqlite3.Connection:
    target = path.with_name(name)
    with sqlite3.connect(path) as source, sqlite3.connect(target) as copy:
        source.backup(copy)
    conn = sqlite3.connect(target, isolation_level=None)
    for trigger in drop:
        conn.execute(f"DROP TRIGGER {trigger}")
    return conn


def rechain(conn: sqlite3.Connection, run_id: str, key: bytes | None = None, start: str = "") -> str:
    """Recompute every hash of the run in order, as a writer with database access does after an
    edit (with the key, for a v2 run, and its :func:`~loomrt.record.ledger.genesis`); the new last hash."""
    prev = start
    for seq, kind, ts, data in conn.execute(
        "SELECT seq, kind, ts, data FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
    ).fetchall():
        prev = event_hash(prev, run_id, seq, kind, ts, data, key)
        conn.execute("UPDATE events SET hash = ? WHERE run_id = ? AND seq = ?", (prev, run_id, seq))
    return prev


CARD = {"id": "cbench0000001", "depth": 0, "text": "the budget is 40 euros", "seqs": [2]}
"""The card a distillation of the recorded run wrote (through the store, as fold writes one)."""


def _forged_card(conn: sqlite3.Connection, run_id: str, info: RunInfo) -> None:
    conn.execute("DROP TRIGGER cards_no_replace")
    forged = json.dumps({**CARD, "text": "the budget is 4,000 euros"})
    conn.execute(
        "INSERT OR REPLACE INTO cards (card_id, run_id, seq, depth, data) SELECT card_id, run_id, seq, depth, ? "
        "FROM cards WHERE card_id = ?",
        (forged, CARD["id"]),
    )


def _cut_tail(conn: sqlite3.Connection, run_id: str, info: RunInfo) -> None:
    conn.execute("DROP TRIGGER events_no_delete")
    conn.execute(
        "DELETE FROM events WHERE run_id = ? AND seq > (SELECT MAX(seq) - 2 FROM events WHERE run_id = ?)",
        (run_id, run_id),
    )


def forged_turn(conn: sqlite3.Connection, run_id: str, info: RunInfo | None = None) -> None:
    """Append a user input, an answer and ``final`` after the run's last event, correctly chained
    (SQL the triggers allow: what a writer around the store can do)."""
    seq, prev = conn.execute(
        "SELECT seq, hash FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1", (run_id,)
    ).fetchone()
    for kind, data in [
        ("user_input", {"content": "wire the money"}),
        ("assistant_message", {"message": {"role": "assistant", "content": "Sent."}}),
        ("final", {"output": "Sent.", "state": None}),
    ]:
        seq += 1
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        prev = event_hash(prev, run_id, seq, kind, 1.0, text)
        conn.execute(
            "INSERT INTO events (run_id, seq, kind, ts, data, hash) VALUES (?, ?, ?, 1.0, ?, ?)",
            (run_id, seq, kind, text, prev),
        )


def _rewritten_answer(conn: sqlite3.Connection, run_id: str, info: RunInfo) -> None:
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute(
        "UPDATE events SET data = json_set(data, '$.output', 'forty-two') WHERE run_id = ? AND kind = 'final'",
        (run_id,),
    )
    conn.execute(
        "UPDATE events SET data = json_set(data, '$.usage.prompt_tokens', 1) WHERE run_id = ? AND kind = 'model_call'",
        (run_id,),
    )
    rechain(conn, run_id)


def _changed_row(conn: sqlite3.Connection, run_id: str, info: RunInfo) -> None:
    conn.execute("DROP TRIGGER runs_no_update")
    conn.execute("UPDATE runs SET agent = 'someone-else', interactive = 1 WHERE run_id = ?", (run_id,))


def _key_holders_rewrite(conn: sqlite3.Connection, run_id: str, info: RunInfo) -> None:
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("DROP TRIGGER run_heads_forward_only")
    conn.execute(
        "UPDATE events SET data = json_set(data, '$.output', 'forty-two') WHERE run_id = ? AND kind = 'final'",
        (run_id,),
    )
    key = KEY.encode()
    head = rechain(conn, run_id, key, genesis(info, key))
    conn.execute("UPDATE run_heads SET hash = ? WHERE run_id = ?", (head, run_id))


TAMPERINGS: dict[str, tuple[str, bool, bool, Callable[[sqlite3.Connection, str, RunInfo], None]]] = {
    # name: (what, keyed record, checked against an anchor taken before, the tampering)
    "forged_card": (
        "a card a distillation wrote, replaced in the card index around its trigger",
        False,
        False,
        _forged_card,
    ),
    "cut_tail": ("the last events deleted (done reads as active again)", False, False, _cut_tail),
    "forged_turn": ("a user input, an answer and final appended, correctly chained", False, False, forged_turn),
    "rewritten_answer": (
        "final.output and every model_call.usage rewritten, then re-chained",
        False,
        False,
        _rewritten_answer,
    ),
    "changed_row": ("runs.agent and runs.interactive changed, on a keyed chain", True, False, _changed_row),
    "key_holders_rewrite": (
        "the answer rewritten and re-chained with the key, the head moved",
        True,
        True,
        _key_holders_rewrite,
    ),
}
"""The tamperings of the threat model, each with the record it is made on."""


def caught(folder: Path) -> dict[str, Any]:
    """Which tamperings ``verify_run`` detects, and whether the untouched records verify."""
    records = {
        keyed: _played(folder / ("keyed" if keyed else "plain"), KEY if keyed else None) for keyed in (False, True)
    }
    out: dict[str, Any] = {"rows": [], "control_clean": True}
    with _ledger_key(KEY):
        for path, run_id in records.values():
            store = SQLiteStore(path)
            out["control_clean"] &= verify_run(store, run_id, prompts=False).clean
            store.close()
        for name, (what, keyed, anchored, tamper) in TAMPERINGS.items():
            path, run_id = records[keyed]
            store = SQLiteStore(path)
            info, marks = store.get_run(run_id), anchors(store, [run_id])
            store.close()
            conn = _copy(path, f"{name}.sqlite")
            tamper(conn, run_id, info)
            conn.close()
            store = SQLiteStore(path.with_name(f"{name}.sqlite"))
            # the record's checks alone: re-deriving the prompts is the audit measure's
            problems = verify_run(store, run_id, anchored=marks if anchored else None, prompts=False).problems
            store.close()
            out["rows"].append(
                {"tampering": name, "what": what, "detected": bool(problems), "first": problems[0] if problems else ""}
            )
    out["detected"] = sum(r["detected"] for r in out["rows"])
    return out


def _verify_cost(folder: Path) -> dict[str, Any]:
    from loomrt.bench.load import play_concurrently

    asyncio.run(play_concurrently(1, 200, latency_s=0.0, db=folder / "verify.db"))
    store = SQLiteStore(folder / "verify.db")
    run_id = store.list_runs(limit=1)[0].run_id
    events = store.events(run_id)
    timings: dict[str, list[float]] = {"all": [], "without_prompts": []}
    clean = True
    for _ in range(3):
        for name, prompts in (("all", True), ("without_prompts", False)):
            started = time.perf_counter()
            clean &= verify_run(store, run_id, prompts=prompts).clean
            timings[name].append(time.perf_counter() - started)
    store.close()
    per_1000 = {k: round(statistics.median(v) * 1e6 / len(events), 2) for k, v in timings.items()}
    return {"events": len(events), "clean": clean, "ms_per_1000_events": per_1000}


def _append_cost(folder: Path, key: str | None, turns: int) -> float:
    with _ledger_key(key):
        store = SQLiteStore(folder / f"append-{'v2' if key else 'v1'}.db")
    store.create_run(RunInfo(run_id="append", agent="a", def_hash="h", mode="append", model="m"))
    store.append("append", "run_started", {"mode": "append"})
    line = "An ordinary message of a chat, about as long as most, with a few numbers: 12, 40, 9,400."
    turn: list[tuple[str, dict[str, Any]]] = [
        ("user_input", {"content": line}),
        ("model_call", {"purpose": "turn", "model": "m", "usage": {"prompt_tokens": 900}, "seconds": 0.5}),
        ("assistant_message", {"message": {"role": "assistant", "content": line}}),
        ("parked", {"output": line}),
    ]
    times = []
    for _ in range(turns):
        started = time.perf_counter()
        store.append_many("append", turn)
        times.append(time.perf_counter() - started)
    store.close()
    return round(statistics.median(times) * 1e6, 1)


def integrity_figures(turns: int = 300) -> dict[str, Any]:
    """The figures of :func:`integrity` (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        out = caught(folder)
        out["verify"] = _verify_cost(folder)
        out["append_us_per_turn"] = {"v1": _append_cost(folder, None, turns), "v2": _append_cost(folder, KEY, turns)}
    return out


@standalone_measure(
    "integrity", "the tamperings runs verify detects, its cost per 1,000 events, and a keyed append's cost per turn"
)
def integrity(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    progress.start("integrity", 1)
    out = integrity_figures(100 if config.quick else 300)
    progress.advance()
    return out
