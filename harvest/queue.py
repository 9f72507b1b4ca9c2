"""The consolidator's queue: banked spans, claimed batches, watermarks, dead letters.

A span is ``pending`` until a pass claims it into a batch (``claimed``, with the batch's
id), then ``done`` when the batch's facts are written (in that write's transaction) or
``dead`` when its reply could never be parsed. A scope's watermark is the newest span id
with nothing pending or claimed at or before it. A claimed batch whose worker died is
taken up again, as the same batch (the same id, so the same fact keys): at-least-once
delivery, idempotent writes.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any

from loomrt.harvest.db import Tables

__all__ = ["Queue"]


class Queue:
    """The queue in ``db``."""

    def __init__(self, db: Tables):
        self.db = db

    def scopes(self) -> list[str]:
        """Scopes with spans pending or claimed."""
        return [
            r[0]
            for r in self.db.rows(
                "SELECT DISTINCT scope FROM harvest_spans WHERE state IN ('pending', 'claimed') ORDER BY scope"
            )
        ]

    def watermark(self, scope: str) -> int:
        rows = self.db.rows("SELECT span_id FROM harvest_watermarks WHERE scope = ?", (scope,))
        return int(rows[0][0]) if rows else 0

    def claimed(self, scope: str) -> list[tuple[str, list[dict[str, Any]]]]:
        """Batches of ``scope`` claimed and not finished (a worker died on them), oldest first."""
        out = []
        for batch_id, span_ids in self.db.rows(
            "SELECT batch_id, span_ids FROM harvest_batches WHERE scope = ? AND state = 'claimed' ORDER BY claimed_at",
            (scope,),
        ):
            out.append((batch_id, self.spans(json.loads(span_ids))))
        return out

    def pending(self, scope: str, *, after: int, limit: int = 2000) -> list[dict[str, Any]]:
        """Pending spans of ``scope`` after span id ``after``, oldest first."""
        rows = self.db.rows(
            "SELECT id, run_id, distillation_seq, scope, agent, def_hash, seq_lo, seq_hi, ts_lo, ts_hi, tokens, turns "
            "FROM harvest_spans WHERE scope = ? AND state = 'pending' AND id > ? ORDER BY id LIMIT ?",
            (scope, after, limit),
        )
        return [_span(r) for r in rows]

    def spans(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        if not ids:
            return []
        rows = self.db.rows(
            "SELECT id, run_id, distillation_seq, scope, agent, def_hash, seq_lo, seq_hi, ts_lo, ts_hi, tokens, turns "
            f"FROM harvest_spans WHERE id IN ({','.join('?' * len(ids))}) ORDER BY id",
            list(ids),
        )
        return [_span(r) for r in rows]

    def claim(self, scope: str, spans: Sequence[dict[str, Any]]) -> str | None:
        """Claim ``spans`` as one batch; its id, or None if another worker claimed one first."""
        ids = [s["id"] for s in spans]
        batch_id = hashlib.sha256(f"{scope}|{','.join(map(str, ids))}".encode()).hexdigest()[:16]
        with self.db.write() as conn:
            marks = ",".join("?" * len(ids))
            free = conn.execute(
                f"SELECT id FROM harvest_spans WHERE id IN ({marks}) AND state = 'pending'" + self.db.lock_claimed, ids
            ).fetchall()
            if len(free) != len(ids):
                return None
            conn.execute(
                "INSERT INTO harvest_batches (batch_id, scope, span_ids, state, claimed_at) "
                "VALUES (?, ?, ?, 'claimed', ?)",
                (batch_id, scope, json.dumps(ids), time.time()),
            )
            conn.execute(
                f"UPDATE harvest_spans SET state = 'claimed', batch_id = ? WHERE id IN ({marks})", [batch_id, *ids]
            )
        return batch_id

    def finish(self, conn: Any, batch_id: str, scope: str, state: str, report: dict[str, Any]) -> None:
        """Inside the write that stored the batch's facts (or its dead letter): mark it
        ``done`` (or ``dead``) and advance the scope's watermark."""
        conn.execute(
            "UPDATE harvest_batches SET state = ?, done_at = ?, attempts = attempts + 1, report = ? WHERE batch_id = ?",
            (state, time.time(), json.dumps(report), batch_id),
        )
        conn.execute("UPDATE harvest_spans SET state = ? WHERE batch_id = ?", (state, batch_id))
        (blocked,) = conn.execute(
            "SELECT MIN(id) FROM harvest_spans WHERE scope = ? AND state IN ('pending', 'claimed')", (scope,)
        ).fetchone()
        (top,) = conn.execute(
            "SELECT MAX(id) FROM harvest_spans WHERE scope = ? AND state IN ('done', 'dead')"
            + (" AND id < ?" if blocked is not None else ""),
            (scope, blocked) if blocked is not None else (scope,),
        ).fetchone()
        if top is not None:
            conn.execute(
                "INSERT INTO harvest_watermarks VALUES (?, ?, ?) ON CONFLICT(scope) DO UPDATE "
                "SET span_id = CASE WHEN excluded.span_id > harvest_watermarks.span_id THEN excluded.span_id "
                "ELSE harvest_watermarks.span_id END, at = excluded.at",
                (scope, top, time.time()),
            )

    def failed(self, batch_id: str) -> int:
        """Count one more failed attempt at ``batch_id``; how many there have been."""
        with self.db.write() as conn:
            conn.execute("UPDATE harvest_batches SET attempts = attempts + 1 WHERE batch_id = ?", (batch_id,))
            (n,) = conn.execute("SELECT attempts FROM harvest_batches WHERE batch_id = ?", (batch_id,)).fetchone()
        return int(n)

    def dead_letter(self, conn: Any, batch_id: str, scope: str, reply: str, error: str, report: dict[str, Any]) -> None:
        """A batch whose reply never parsed: kept with the reply's prefix, in the caller's
        transaction ``conn`` (the consolidator keeps the batch's passages in the same one);
        the queue moves on."""
        ids = json.loads(
            conn.execute("SELECT span_ids FROM harvest_batches WHERE batch_id = ?", (batch_id,)).fetchone()[0]
        )
        conn.execute(
            "INSERT INTO harvest_dead_letters VALUES (?, ?, ?, ?, ?, ?, NULL) ON CONFLICT(batch_id) DO UPDATE "
            "SET reply_prefix = excluded.reply_prefix, error = excluded.error, at = excluded.at, "
            "retried_at = NULL",
            (batch_id, scope, json.dumps(ids), reply[:500], error, time.time()),
        )
        self.finish(conn, batch_id, scope, "dead", report)

    def dead_letters(self, *, include_retried: bool = False) -> list[dict[str, Any]]:
        rows = self.db.rows(
            "SELECT batch_id, scope, span_ids, reply_prefix, error, at, retried_at FROM harvest_dead_letters"
            + ("" if include_retried else " WHERE retried_at IS NULL")
            + " ORDER BY at"
        )
        return [
            {
                "batch_id": b,
                "scope": s,
                "span_ids": json.loads(ids),
                "reply_prefix": r,
                "error": e,
                "at": at,
                "retried_at": rt,
            }
            for b, s, ids, r, e, at, rt in rows
        ]

    def revive(self, batch_id: str) -> None:
        """Put a dead batch back as claimed, so the next pass extracts it again."""
        with self.db.write() as conn:
            conn.execute("UPDATE harvest_dead_letters SET retried_at = ? WHERE batch_id = ?", (time.time(), batch_id))
            conn.execute(
                "UPDATE harvest_batches SET state = 'claimed', claimed_at = ? WHERE batch_id = ?",
                (time.time(), batch_id),
            )
            conn.execute("UPDATE harvest_spans SET state = 'claimed' WHERE batch_id = ?", (batch_id,))

    def status(self) -> list[dict[str, Any]]:
        """Per scope: spans by state, the watermark, dead letters."""
        out: dict[str, dict[str, Any]] = {}
        for scope, state, n in self.db.rows("SELECT scope, state, COUNT(*) FROM harvest_spans GROUP BY scope, state"):
            out.setdefault(scope, {"scope": scope, "pending": 0, "claimed": 0, "done": 0, "dead": 0})[state] = n
        for scope, span_id in self.db.rows("SELECT scope, span_id FROM harvest_watermarks"):
            out.setdefault(scope, {"scope": scope, "pending": 0, "claimed": 0, "done": 0, "dead": 0})["watermark"] = (
                span_id
            )
        return sorted(out.values(), key=lambda d: d["scope"])


def _span(r: tuple[Any, ...]) -> dict[str, Any]:
    keys = (
        "id",
        "run_id",
        "distillation_seq",
        "scope",
        "agent",
        "def_hash",
        "seq_lo",
        "seq_hi",
        "ts_lo",
        "ts_hi",
        "tokens",
    )
    return {**dict(zip(keys, r[:11], strict=True)), "turns": json.loads(r[11])}
