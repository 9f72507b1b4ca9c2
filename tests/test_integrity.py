"""The record shows every tampering its threat model says it can (docs/reliability.md): cards
that refuse REPLACE, a head anchor that only moves forward, the event grammar, a keyed chain
that covers the run's row, and external anchors. Each tampering is made for real, with
direct SQL on a copy of a record the runtime wrote, around the triggers where it must be."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from spine_kit import runtime, send, write
from typer.testing import CliRunner

from loomrt import RunInfo, SQLiteStore, load_agents
from loomrt.bench.integrity_measure import forged_turn, rechain
from loomrt.cli import app
from loomrt.errors import StoreError
from loomrt.events import Event
from loomrt.integrity import anchors, check_record, verify_run
from loomrt.record.copy import copy_record
from loomrt.record.grammar import grammar_problems
from loomrt.record.ledger import KEY_ENV, KEY_FILE_ENV, event_hash, genesis, ledger_key
from loomrt.testing import ScriptedProvider

runner = CliRunner()
KEY = "a-deployment-key-of-some-length"


def _played(tmp_path, monkeypatch, key: str | None = None) -> tuple[str, str]:
    """A run the runtime played (a tool call and an answer), its store closed: (path, run id)."""
    if key:
        monkeypatch.setenv(KEY_ENV, key)
    else:
        monkeypatch.delenv(KEY_ENV, raising=False)
    write(tmp_path, "s.yaml", "turns: []\n")
    agents = load_agents(write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml, tools: [calculate]}\n"))
    provider = ScriptedProvider([{"tool_call": {"name": "calculate", "arguments": {"expression": "2+2"}}}, "4"])
    rt = runtime(tmp_path, provider)
    run = rt.start("a", agents=agents)
    assert send(rt, run, "add").output == "4"
    rt.store.close()
    return str(tmp_path / "record.sqlite"), run.run_id


def _forge(path: str, *drop: str) -> sqlite3.Connection:
    """A connection to a copy of the record, with the named triggers dropped."""
    forged = path.replace("record.sqlite", "forged.sqlite")
    with sqlite3.connect(path) as source, sqlite3.connect(forged) as copy:
        source.backup(copy)  # the WAL included, whatever the checkpoint did
    conn = sqlite3.connect(forged, isolation_level=None)
    for trigger in drop:
        conn.execute(f"DROP TRIGGER {trigger}")
    return conn


def _verify(conn: sqlite3.Connection, run_id: str) -> list[str]:
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    conn.close()
    store = SQLiteStore(path)
    try:
        return verify_run(store, run_id).problems
    finally:
        store.close()


def test_a_played_run_verifies_clean_on_every_check(tmp_path, monkeypatch):
    path, run_id = _played(tmp_path, monkeypatch)
    store = SQLiteStore(path)
    verdict = verify_run(store, run_id)
    assert verdict.clean and verdict.chain == "v1" and verdict.prompts_checked == 2
    assert verdict.notes == ["the chain is unkeyed (v1): anyone who can write the database could re-chain an edit"]
    last = store.events(run_id)[-1]
    assert store.head(run_id) == (last.seq, last.hash, 0)


# ---------------------------------------------------------------- the table of issue 40


def test_insert_or_replace_into_cards_is_refused_and_a_forged_card_shows(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    store = SQLiteStore(tmp_path / "record.sqlite")
    store.create_run(RunInfo(run_id="r1", agent="a", def_hash="h", mode="fold", model="m"))
    store.append("r1", "run_started", {"mode": "fold"})
    card = {"id": "c0123456789a", "depth": 0, "text": "the user's budget is 40 euros", "seqs": [2]}
    store.append("r1", "distillation", {"mode": "fold", "cards": [card]})
    store.append("r1", "distillation", {"mode": "fold", "cards": [card]})  # the same card again: left as it is
    store.close()
    raw = sqlite3.connect(tmp_path / "record.sqlite", isolation_level=None)
    forged = json.dumps({**card, "text": "the user's budget is 4,000 euros"})
    for verb in ("INSERT OR REPLACE INTO", "REPLACE INTO", "INSERT INTO"):
        with pytest.raises(sqlite3.DatabaseError, match="cards are immutable"):
            raw.execute(
                f"{verb} cards (card_id, run_id, seq, depth, data) VALUES (?, 'r1', 2, 0, ?)", (card["id"], forged)
            )
    raw.close()
    conn = _forge(str(tmp_path / "record.sqlite"), "cards_no_replace")
    conn.execute(
        "INSERT OR REPLACE INTO cards (card_id, run_id, seq, depth, data) VALUES (?, 'r1', 2, 0, ?)",
        (card["id"], forged),
    )
    assert f"card {card['id']} in the card index differs from the one #2 wrote: forks are served a forgery" in _verify(
        conn, "r1"
    )


def test_a_cut_tail_shows(tmp_path, monkeypatch):
    path, run_id = _played(tmp_path, monkeypatch)
    conn = _forge(path, "events_no_delete")
    last = conn.execute("SELECT MAX(seq) FROM events WHERE run_id = ?", (run_id,)).fetchone()[0]
    conn.execute("DELETE FROM events WHERE run_id = ? AND seq > ?", (run_id, last - 2))  # done -> active again
    problems = _verify(conn, run_id)
    assert problems == [f"the record ends at #{last - 2}, but its head anchor says #{last}: events were cut"]


def test_a_well_chained_forged_turn_shows(tmp_path, monkeypatch):
    path, run_id = _played(tmp_path, monkeypatch)
    conn = _forge(path)  # no trigger dropped: INSERT is what the record allows
    forged_turn(conn, run_id)
    seq = conn.execute("SELECT MAX(seq) FROM events WHERE run_id = ?", (run_id,)).fetchone()[0]
    problems = _verify(conn, run_id)
    assert (
        f"#{seq - 2} (user_input): written after the turn ended with final, and no resumed opened a new one" in problems
    )
    assert f"#{seq - 1} (assistant_message): an answer with no model call before it" in problems
    assert f"events #{seq - 2}-#{seq} lie past the head anchor (#{seq - 3}): written around the store" in problems


def test_a_rewritten_and_rechained_answer_shows_against_the_head(tmp_path, monkeypatch):
    path, run_id = _played(tmp_path, monkeypatch)
    conn = _forge(path, "events_no_update")
    conn.execute(
        "UPDATE events SET data = json_set(data, '$.output', 'forty-two') WHERE run_id = ? AND kind = 'final'",
        (run_id,),
    )
    conn.execute(
        "UPDATE events SET data = json_set(data, '$.usage.prompt_tokens', 1) WHERE run_id = ? AND kind = 'model_call'",
        (run_id,),
    )
    rechain(conn, run_id)
    with pytest.raises(sqlite3.DatabaseError, match="only moves forward"):  # the head cannot follow
        conn.execute("UPDATE run_heads SET hash = 'x' WHERE run_id = ?", (run_id,))
    last = conn.execute("SELECT MAX(seq) FROM events WHERE run_id = ?", (run_id,)).fetchone()[0]
    assert _verify(conn, run_id) == [f"the last event #{last} does not hash as its head anchor says: it was rewritten"]


def test_without_the_key_a_keyed_run_cannot_be_rechained(tmp_path, monkeypatch):
    path, run_id = _played(tmp_path, monkeypatch, key=KEY)
    conn = _forge(path, "events_no_update", "run_heads_forward_only")
    conn.execute(
        "UPDATE events SET data = json_set(data, '$.output', 'forty-two') WHERE run_id = ? AND kind = 'final'",
        (run_id,),
    )
    new_head = rechain(conn, run_id)  # plain SHA-256: all a writer without the key can do
    conn.execute("UPDATE run_heads SET hash = ? WHERE run_id = ?", (new_head, run_id))
    problems = _verify(conn, run_id)
    assert problems and problems[0] == "seq 1 (run_started): hash does not match its content or the event before it"


@pytest.mark.parametrize(("column", "value"), [("agent", "'b'"), ("interactive", "1"), ("model", "'other'")])
def test_a_changed_runs_row_shows_in_a_keyed_chain(tmp_path, monkeypatch, column, value):
    path, run_id = _played(tmp_path, monkeypatch, key=KEY)
    conn = _forge(path, "runs_no_update")
    conn.execute(f"UPDATE runs SET {column} = {value} WHERE run_id = ?", (run_id,))
    assert _verify(conn, run_id)[0] == "seq 1 (run_started): hash does not match its content or the event before it"


# ---------------------------------------------------------------- the head anchor


def test_the_head_only_moves_forward(tmp_path, monkeypatch):
    path, run_id = _played(tmp_path, monkeypatch)
    raw = sqlite3.connect(path, isolation_level=None)
    for sql in (
        "UPDATE run_heads SET seq = seq - 1 WHERE run_id = ?",
        "UPDATE run_heads SET epoch = -1 WHERE run_id = ?",
        "DELETE FROM run_heads WHERE run_id = ?",
        "INSERT OR REPLACE INTO run_heads (run_id, seq, hash, epoch) VALUES (?, 1, 'x', 0)",
    ):
        with pytest.raises(sqlite3.DatabaseError, match="run head"):
            raw.execute(sql, (run_id,))
    raw.close()


def test_a_lost_head_row_shows(tmp_path, monkeypatch):
    path, run_id = _played(tmp_path, monkeypatch)
    conn = _forge(path, "run_heads_no_delete")
    conn.execute("DELETE FROM run_heads WHERE run_id = ?", (run_id,))
    assert _verify(conn, run_id) == [
        "no head anchor for the run: its row in run_heads is gone (or it was written around the store)"
    ]


# ---------------------------------------------------------------- the grammar


def _events(*kinds_and_data: tuple[str, dict]) -> list[Event]:
    return [Event(run_id="r", seq=i, kind=k, data=d) for i, (k, d) in enumerate(kinds_and_data, 1)]


CALL = {"message": {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "name": "x", "arguments": {}}]}}
SAID = {"message": {"role": "assistant", "content": "ok"}}
TURN = [("run_started", {}), ("user_input", {"content": "go"}), ("model_call", {"purpose": "turn"})]


@pytest.mark.parametrize(
    ("tail", "problem"),
    [
        (
            [("assistant_message", SAID), ("assistant_message", SAID)],
            "#5 (assistant_message): an answer with no model call before it",
        ),
        (
            [("assistant_message", SAID), ("tool_result", {"tool_call_id": "t9", "content": "x"})],
            "#5 (tool_result): names tool call 't9', which no answer before it asked for",
        ),
        (
            [("assistant_message", SAID), ("tool_call", {"id": "t9", "name": "x", "arguments": {}})],
            "#5 (tool_call): names tool call 't9', which no answer before it asked for",
        ),
        (
            [
                ("assistant_message", CALL),
                ("tool_result", {"tool_call_id": "t1", "content": "a"}),
                ("tool_result", {"tool_call_id": "t1", "content": "b"}),
            ],
            "#6 (tool_result): a second result for tool call 't1'",
        ),
        (
            [("assistant_message", SAID), ("final", {}), ("user_input", {"content": "more"})],
            "#6 (user_input): written after the turn ended with final, and no resumed opened a new one",
        ),
        (
            [("assistant_message", SAID), ("error", {}), ("assistant_message", SAID)],
            "#6 (assistant_message): written after the turn ended with error, and no resumed opened a new one",
        ),
        (
            [("assistant_message", SAID), ("parked", {}), ("tool_call", {"id": "t1", "name": "x", "arguments": {}})],
            "#6 (tool_call): written after the turn ended with parked, and no resumed opened a new one",
        ),
        ([("run_started", {})], "#4 (run_started): a record opens with run_started, once"),
    ],
)
def test_each_grammar_rule_catches_what_the_runtime_cannot_write(tail, problem):
    assert problem in grammar_problems(_events(*TURN, *tail))


def test_what_the_runtime_writes_reads_as_grammatical():
    ok = _events(
        *TURN,
        ("assistant_message", CALL),
        ("tool_call", {"id": "t1", "name": "x", "arguments": {}}),
        ("tool_result", {"tool_call_id": "t1", "content": "4"}),
        ("model_call", {"purpose": "turn"}),
        ("assistant_message", SAID),
        ("parked", {}),
        ("pin", {}),
        ("user_input", {"content": "next"}),  # a chat's next turn
        ("model_call", {"purpose": "turn"}),
        ("assistant_message", SAID),
        ("parked", {}),
        ("final", {}),  # the chat ends
        ("distillation", {}),  # a fold between turns, out of band
        ("resumed", {"input": "continue"}),
        ("user_input", {"content": "fails"}),
        ("error", {}),
        ("parked", {}),  # a chat's failed turn parks for the next input
        ("final", {}),
        ("cancelled", {}),
        ("model_call", {"purpose": "turn"}),  # cancelled while the model thought: the cost is recorded
        ("resumed", {"input": "continue"}),
        ("user_input", {"content": "again"}),
        ("model_call", {"purpose": "turn"}),
        ("assistant_message", SAID),
        ("final", {}),
    )
    assert grammar_problems(ok) == []


def test_a_fork_may_answer_a_call_its_shared_history_asked_for():
    shared = _events(*TURN, ("assistant_message", CALL))
    fork = [
        Event(run_id="f", seq=5, kind="run_started", data={}),
        Event(run_id="f", seq=6, kind="tool_result", data={"tool_call_id": "t1", "content": "4"}),
    ]
    assert grammar_problems(fork, shared) == []
    assert grammar_problems(fork) != []


# ---------------------------------------------------------------- the keyed chain


def test_a_keyed_store_chains_new_runs_v2_and_covers_the_row(tmp_path, monkeypatch):
    path, run_id = _played(tmp_path, monkeypatch, key=KEY)
    store = SQLiteStore(path)
    info = store.get_run(run_id)
    first = store.events(run_id)[0]
    assert info.chain == "v2" and verify_run(store, run_id).clean and verify_run(store, run_id).notes == []
    assert first.hash == event_hash(
        genesis(info, KEY.encode()), run_id, 1, first.kind, first.ts, first.data, KEY.encode()
    )
    store.close()
    monkeypatch.delenv(KEY_ENV)
    keyless = SQLiteStore(path)
    assert verify_run(keyless, run_id).problems[0].startswith("the run's chain is keyed (v2): set $LOOMRT_LEDGER_KEY")
    with pytest.raises(StoreError, match="keyed \\(chain v2\\) and this process has no ledger key"):
        keyless.append(run_id, "notice", {"text": "x"})
    keyless.close()
    monkeypatch.setenv(KEY_ENV, "another-deployment-key-entirely")
    other = SQLiteStore(path)
    assert "hash does not match" in verify_run(other, run_id).problems[0]
    other.close()


def test_a_key_file_must_be_the_owners_alone(tmp_path):
    key = tmp_path / "ledger.key"
    key.write_text("k" * 40)
    os.chmod(key, 0o644)
    with pytest.raises(StoreError, match="can be read by others \\(mode 644\\).*chmod 600"):
        ledger_key({KEY_FILE_ENV: str(key)})
    os.chmod(key, 0o600)
    assert ledger_key({KEY_FILE_ENV: str(key)}) == b"k" * 40
    with pytest.raises(StoreError, match="needs at least 16"):
        ledger_key({KEY_ENV: "short"})
    with pytest.raises(StoreError, match="cannot read"):
        ledger_key({KEY_FILE_ENV: str(tmp_path / "missing.key")})
    assert ledger_key({}) is None


def test_db_keygen_writes_a_private_key_once(tmp_path):
    path = tmp_path / "ledger.key"
    made = runner.invoke(app, ["db", "keygen", str(path)])
    assert made.exit_code == 0 and oct(path.stat().st_mode & 0o777) == "0o600"
    assert len(ledger_key({KEY_FILE_ENV: str(path)}) or b"") == 64
    again = runner.invoke(app, ["db", "keygen", str(path)])
    assert again.exit_code == 2 and "never overwritten" in again.output


def test_db_copy_keeps_a_keyed_chain(tmp_path, monkeypatch):
    path, run_id = _played(tmp_path, monkeypatch, key=KEY)
    source, target = SQLiteStore(path), SQLiteStore(tmp_path / "copy.sqlite")
    copy_record(source, target)
    assert target.get_run(run_id).chain == "v2"
    assert [e.hash for e in target.events(run_id)] == [e.hash for e in source.events(run_id)]
    assert verify_run(target, run_id).clean
    source.close()
    target.close()


# ---------------------------------------------------------------- external anchors


def test_anchors_catch_a_rewrite_by_someone_who_holds_the_key(tmp_path, monkeypatch):
    path, run_id = _played(tmp_path, monkeypatch, key=KEY)
    store = SQLiteStore(path)
    anchored = anchors(store)
    info = store.get_run(run_id)
    store.close()
    conn = _forge(path, "events_no_update", "run_heads_forward_only")
    conn.execute(
        "UPDATE events SET data = json_set(data, '$.output', 'forty-two') WHERE run_id = ? AND kind = 'final'",
        (run_id,),
    )
    new_head = rechain(conn, run_id, KEY.encode(), genesis(info, KEY.encode()))
    conn.execute("UPDATE run_heads SET hash = ? WHERE run_id = ?", (new_head, run_id))
    forged = conn.execute("PRAGMA database_list").fetchone()[2]
    conn.close()
    store = SQLiteStore(forged)
    assert verify_run(store, run_id).clean  # the threat model: the key holder's rewrite passes alone
    assert verify_run(store, run_id, anchored=anchored).problems == [
        f"#{anchored['runs'][run_id]['seq']} differs from the anchor of {anchored['anchored_at']}: the history before it was rewritten"
    ]
    store.close()


def test_runs_anchor_and_verify_from_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(KEY_ENV, raising=False)
    write(tmp_path, "s.yaml", "turns: [{text: done}, {text: again}]\n")
    agents = write(tmp_path, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml}\n")
    ids = [
        json.loads(runner.invoke(app, ["run", "a", "go", "--agents", str(agents), "--json"]).stdout)["run_id"]
        for _ in range(2)
    ]
    out = tmp_path / "anchors.json"
    made = runner.invoke(app, ["runs", "anchor", "--out", str(out)])
    assert made.exit_code == 0 and "anchored 2 runs" in made.stdout
    assert set(json.loads(out.read_text())["runs"]) == set(ids)
    ok = runner.invoke(app, ["runs", "verify", "--all", "--anchors", str(out), "--json"])
    report = json.loads(ok.stdout)
    assert ok.exit_code == 0 and report["clean"] and len(report["runs"]) == 2
    strict = runner.invoke(app, ["runs", "verify", ids[0], "--require-keyed"])
    assert strict.exit_code == 1 and "unkeyed (v1)" in strict.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    refused = runner.invoke(app, ["runs", "verify", ids[0], "--anchors", str(bad)])
    assert refused.exit_code == 2 and "not a loomrt anchors file" in refused.output
    nothing = runner.invoke(app, ["runs", "verify"])
    assert nothing.exit_code == 2 and "--all" in nothing.output


# ---------------------------------------------------------------- random single edits


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two records the runtime wrote, v1 and v2 (keyed): (info, events, head) each."""
    out = {}
    for scheme in ("v1", "v2"):
        with pytest.MonkeyPatch.context() as mp:
            folder = tmp_path_factory.mktemp(scheme)
            path, run_id = _played(folder, mp, key=KEY if scheme == "v2" else None)
            store = SQLiteStore(path)
            out[scheme] = (store.get_run(run_id), store.events(run_id), store.head(run_id))
            store.close()
    return out


def _edited(events: list[Event], edit: str, i: int) -> list[Event]:
    items = [(e.kind, e.ts, dict(e.data), e.hash) for e in events]
    i %= len(items)
    if edit == "change":
        kind, ts, data, h = items[i]
        items[i] = (kind, ts, {**data, "forged": True}, h)
    elif edit == "drop":
        del items[i]
    elif edit == "insert":
        items.insert(i + 1, items[max(1, i)])
    elif edit == "swap":
        i = min(i, len(items) - 2)
        items[i], items[i + 1] = items[i + 1], items[i]
    first = events[0].seq
    return [
        Event(run_id=events[0].run_id, seq=first + n, kind=k, ts=t, data=d, hash=h)
        for n, (k, t, d, h) in enumerate(items)
    ]


def _rechained(events: list[Event], key: bytes | None, start: str) -> list[Event]:
    out, prev = [], start
    for e in events:
        prev = event_hash(prev, e.run_id, e.seq, e.kind, e.ts, e.data, key)
        out.append(e.model_copy(update={"hash": prev}))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    scheme=st.sampled_from(["v1", "v2"]),
    edit=st.sampled_from(["change", "drop", "insert", "swap"]),
    i=st.integers(0, 64),
    rechain=st.booleans(),
    with_key=st.booleans(),
    move_head=st.booleans(),
)
def test_every_single_edit_shows_but_those_the_threat_model_names(
    recorded, scheme, edit, i, rechain, with_key, move_head
):
    info, events, head = recorded[scheme]
    key = KEY.encode() if scheme == "v2" else None
    edited = _edited(events, edit, i)
    assume([(e.kind, e.data) for e in edited] != [(e.kind, e.data) for e in events])
    forged_with_key = rechain and (scheme == "v1" or with_key)  # v1 needs no key; v2 needs the key
    if rechain:
        edited = _rechained(
            edited, key if forged_with_key else None, genesis(info, key) if forged_with_key and key else ""
        )
    forged_head = (edited[-1].seq, edited[-1].hash, 0) if move_head else head
    anchored = {"anchored_at": "then", "runs": {info.run_id: {"seq": events[-1].seq, "hash": events[-1].hash}}}
    alone = check_record(info, edited, head=forged_head, key=key)
    with_anchor = check_record(info, edited, head=forged_head, key=key, anchored=anchored)
    cut_tail = edit == "drop" and i % len(events) == len(events) - 1
    undetectable = move_head and (forged_with_key or (cut_tail and not rechain))
    if not undetectable:  # the chain or the head shows it, at this access
        assert alone.problems, (edit, i, rechain, with_key, move_head)
    appended_after_anchor = edit == "insert" and i % len(events) == len(events) - 1
    if not appended_after_anchor:  # what was anchored cannot be rewritten, even with the key
        assert with_anchor.problems, (edit, i, rechain, with_key, move_head)


# ---------------------------------------------------------------- the bench's measure, and its sabotage


def test_the_integrity_measure_detects_every_tampering(tmp_path):
    from loomrt.bench.integrity_measure import TAMPERINGS, caught

    out = caught(tmp_path)
    assert out["control_clean"] and out["detected"] == len(TAMPERINGS) == 6


@pytest.mark.parametrize(
    ("disabled", "missed"),
    [
        (("_head_problems",), {"cut_tail", "rewritten_answer"}),
        (("_card_problems",), {"forged_card"}),
        (("_anchor_problems",), {"key_holders_rewrite"}),
        (("_head_problems", "grammar_problems"), {"cut_tail", "rewritten_answer", "forged_turn"}),
        (("verify_chain",), {"changed_row"}),
    ],
)
def test_the_integrity_measure_says_no_when_a_check_is_broken(tmp_path, monkeypatch, disabled, missed):
    import loomrt.integrity
    from loomrt.bench.integrity_measure import caught

    for name in disabled:
        monkeypatch.setattr(loomrt.integrity, name, lambda *a, **k: [])
    out = caught(tmp_path)
    assert {r["tampering"] for r in out["rows"] if not r["detected"]} == missed


def test_doctor_says_whether_new_runs_are_keyed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    for value, expected in [
        ("", {"keyed": False, "ok": True, "source": None}),
        (KEY, {"keyed": True, "ok": True, "source": KEY_ENV}),
    ]:
        monkeypatch.setenv(KEY_ENV, value)
        report = json.loads(runner.invoke(app, ["doctor", "--json"]).stdout)
        assert report["ledger"] == expected
    monkeypatch.setenv(KEY_ENV, "short")
    report = json.loads(runner.invoke(app, ["doctor", "--json"]).stdout)
    assert report["ok"] is False and "needs at least 16" in report["ledger"]["problem"]
