"""Kill it anywhere and lose nothing: the chaos harness in CI (21 kills over the seven named
points), the checks it applies can fail, and two processes share one record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loomrt.bench.chaos import CHAT_INPUTS, SCENARIOS, Outcome, check, plan_kills, play, run_chaos, write_scenarios
from loomrt.crashpoints import POINTS, parse_crash_at
from loomrt.record.ledger import verify_chain
from loomrt.record.sqlite import SQLiteStore


def test_twenty_kills_at_every_point_lose_nothing() -> None:
    result = run_chaos(3)
    assert result["kills"] == 3 * len(POINTS) >= 20
    assert result["landed"] == result["kills"]  # every planned kill happened (SIGKILL, exit -9)
    assert result["violations"] == 0, result["failures"]
    assert all(f["kills"] == 3 for f in result["points"].values())


def test_a_kill_at_every_point_on_postgres_loses_nothing(postgres_server: object) -> None:
    """The same harness with the record, run claims and durable memory in PostgreSQL."""
    result = run_chaos(1, backend="postgres", postgres=postgres_server.get_uri())  # type: ignore[attr-defined]
    assert result["backend"] == "postgres" and result["kills"] == len(POINTS)
    assert result["landed"] == result["kills"]
    assert result["violations"] == 0, result["failures"]


def test_the_checks_can_fail() -> None:
    """A record with a duplicated input, a lost answer and a second result for one call is caught."""
    scenario = SCENARIOS[0]
    good = Outcome("r", ["a", "b"], None, list(scenario.inputs), ["x"], [{"role": "user"}])

    class E:
        def __init__(self, seq: int, kind: str, data: dict) -> None:
            self.seq, self.kind, self.data, self.hash, self.run_id, self.ts = seq, kind, data, None, "r", 0.0

    events = [
        E(1, "tool_call", {"id": "c1"}),
        E(2, "tool_result", {"tool_call_id": "c1"}),
        E(3, "tool_result", {"tool_call_id": "c1"}),
        E(5, "distillation", {"span_seqs": [2]}),
        E(6, "distillation", {"span_seqs": [2]}),
    ]
    bad = Outcome("r", ["a"], {"step": 1}, [*scenario.inputs, scenario.inputs[0]], ["y"], [{"role": "assistant"}])
    problems = check(bad, good, events, scenario, good)
    text = "\n".join(problems)
    for expected in (
        "expected seq 4",
        "inputs differ",
        "tool call c1 has 2 results",
        "message #2 evicted 2 times",
        "answers differ",
        "final Σ differs",
        "context rebuilt from the record differs",
        "the live run's recall index holds 1 texts, the one rebuilt from the record 1: 1 missing ('x'); 1 extra ('y')",
    ):
        assert expected in text, expected


def test_a_run_with_nothing_left_to_play_is_compared_with_the_uninterrupted_one() -> None:
    """No live run (the kill left nothing to resume or send): the run rebuilt from the record
    is compared with the uninterrupted run, never with itself; what differs is printed."""
    scenario = SCENARIOS[0]
    base = Outcome("r", ["a"], None, list(scenario.inputs), ["x", "y"], [{"role": "user", "content": "hello"}])
    rebuilt = Outcome("r", ["a"], None, list(scenario.inputs), ["x"], [{"role": "user", "content": "hullo"}])
    text = "\n".join(check(None, base, [], scenario, rebuilt))
    assert "differs from the uninterrupted run's: 1 messages, the uninterrupted run's 1; at message 1: " in text
    assert "'hullo'" in text and "'hello'" in text
    assert "the recall index holds 1 texts, the uninterrupted run's 2: 1 missing ('y')" in text
    assert check(None, base, [], scenario, base) == []


def test_model_calls_paid_twice_are_caught_and_a_refold_is_a_repeat() -> None:
    """Calls beyond the uninterrupted run's, or a prompt paid for again, are violations; a
    fold call repeating its run's earlier prompt is a repeat by design, counted apart."""
    from loomrt.bench.chaos import Call, call_problems

    base = [Call("r", "turn", "t1", 100, 10), Call("r", "summary", "s1", 300, 40), Call("r", "turn", "t2", 200, 10)]
    assert call_problems(base, base, interrupted=False) == ([], 0)
    twice = [*base[:2], Call("r", "summary", "s1", 300, 40), base[2]]
    problems, repeats = call_problems(twice, base, interrupted=False)
    assert repeats == 0
    assert "1 summary calls repeat a prompt the run had already paid for, the uninterrupted run's 0" in problems
    assert "the record holds 4 model calls, the uninterrupted run's 3: summary 2 against 1" in problems
    assert call_problems(twice, base, interrupted=True)[0] != []  # an interrupted tool call never pays more
    assert call_problems(base[:1] + base[2:], base, interrupted=True) == ([], 0)  # it may distil less
    dearer = [base[0], Call("r", "summary", "s1", 600, 40), base[2]]
    (tokens,) = call_problems(dearer, base, interrupted=False)[0]
    assert "summary (600, 40) against (300, 40)" in tokens
    fold = [Call("r", "fold", "f1", 300, 40), Call("r", "turn", "t1", 100, 10)]
    refolded = [fold[0], Call("r", "fold", "f1", 300, 40), fold[1]]
    assert call_problems(refolded, fold, interrupted=False) == ([], 1)


def test_a_crash_point_is_named_and_counted() -> None:
    assert parse_crash_at("in_tool:3") == ("in_tool", 3)
    for bad in ("in_tool", "nowhere:1", "in_tool:0", "in_tool:x"):
        with pytest.raises(ValueError, match="POINT:N"):
            parse_crash_at(bad)
    plan = plan_kills({"a": {"in_tool": 2, "after_append": 9}, "b": {"after_append": 4}}, per_point=3)
    assert [p for _, p, _ in plan] == ["after_append"] * 3 + ["in_tool"] * 3
    assert all(n <= 2 for s, p, n in plan if p == "in_tool")


def test_a_killed_process_leaves_a_record_that_resumes(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    write_scenarios(folder)
    db = tmp_path / "kill.db"
    code = play(folder, SCENARIOS[1], db, LOOMRT_CRASH_AT="in_distillation:1")
    assert code == -9  # SIGKILL: no cleanup ran
    store = SQLiteStore(db)
    (run,) = store.list_runs()
    events = store.events(run.run_id)
    assert verify_chain(events) == []
    assert not any(e.kind == "distillation" for e in events)  # killed before it was recorded
    inputs = [e.data["content"] for e in events if e.kind == "user_input"]
    assert inputs == list(CHAT_INPUTS[: len(inputs)])


def test_a_kill_mid_fork_leaves_the_parent_whole_and_no_fork(tmp_path: Path) -> None:
    """A fork is one transaction: killed inside it, the record holds the parent as it was and
    no fork; recovery forks again and the fork's outcome is the uninterrupted one's."""
    import asyncio

    from loomrt.bench.chaos import fork_problems, recover

    folder = tmp_path / "s"
    write_scenarios(folder)
    scenario = next(s for s in SCENARIOS if s.fork)
    db = tmp_path / "kill.db"
    assert play(folder, scenario, db, LOOMRT_CRASH_AT="in_fork:1") == -9
    store = SQLiteStore(db)
    (parent,) = store.list_runs()  # no fork was left behind
    events = store.events(parent.run_id)
    assert verify_chain(events) == []
    assert [e.data["content"] for e in events if e.kind == "user_input"] == list(scenario.inputs[: scenario.fork[1]])
    assert fork_problems(store, scenario) == ["the parent has 0 forks"]
    run_id, _ = asyncio.run(recover(folder, scenario, db))
    assert fork_problems(store, scenario) == []
    fork = store.get_run(run_id)
    assert fork.forked_from == parent.run_id
    store.close()


def test_two_processes_share_one_record_without_locking_errors(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    write_scenarios(folder)
    db = tmp_path / "shared.db"
    env_cmd = [
        sys.executable,
        "-c",
        "import sys; from loomrt.bench.chaos import SCENARIOS, play; from pathlib import Path; "
        "sys.exit(play(Path(sys.argv[1]), SCENARIOS[int(sys.argv[2])], Path(sys.argv[3])))",
    ]
    procs = [
        subprocess.Popen([*env_cmd, str(folder), str(i), str(db)], stderr=subprocess.PIPE, text=True) for i in (0, 1, 2)
    ]
    outs = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    assert all(code == 0 for code, _ in outs), outs
    store = SQLiteStore(db)
    runs = store.list_runs()
    assert len(runs) == 3
    for info in runs:
        events = store.events(info.run_id)
        assert verify_chain(events) == []  # dense seqs, one chain per run: never interleaved
        assert [e.data["content"] for e in events if e.kind == "user_input"] == list(CHAT_INPUTS)


def test_an_unusable_home_is_one_clear_error_before_the_run(tmp_path: Path) -> None:
    import os

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    folder = tmp_path / "s"
    write_scenarios(folder)
    env = {**os.environ, "LOOMRT_HOME": str(blocker / "home"), "LOOMRT_RECALL_EMBEDDER": "hash"}
    env.pop("LOOMRT_DB_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "loomrt", "run", "tools-compaction", "go", "--agents", str(folder / "agents.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "LOOMRT_HOME" in done.stderr and str(blocker) in done.stderr, done.stderr


def test_a_full_disk_fails_the_run_cleanly_and_the_record_stays_consistent(tmp_path: Path) -> None:
    """A file-size limit stands in for a full disk (tests run as root): the write fails, the
    process says so in one error, and the record audits clean and resumes once there is room."""
    import os
    import resource
    import signal

    folder = tmp_path / "s"
    write_scenarios(folder)
    db = tmp_path / "full.db"
    assert play(folder, SCENARIOS[1], db) == 0  # a first chat: the file exists, with room used
    wal = tmp_path / "full.db-wal"
    limit = max(db.stat().st_size, wal.stat().st_size if wal.exists() else 0) + 20_000

    def full_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "LOOMRT_DB_URL": f"sqlite:{db}", "LOOMRT_RECALL_EMBEDDER": "hash"}
    done = subprocess.run(
        [sys.executable, "-m", "loomrt", "chat", "chat-recap", "--agents", str(folder / "agents.yaml")],
        input="\n".join(CHAT_INPUTS * 4) + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=full_disk,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "record" in done.stderr.lower(), done.stderr[-2000:]
    store = SQLiteStore(db)
    for info in store.list_runs():
        assert verify_chain(store.events(info.run_id)) == []


def test_the_harvest_checks_can_fail() -> None:
    """A bank that lost a line or holds one twice, and memory with a fact doubled, are caught."""
    scenario = next(s for s in SCENARIOS if s.consolidate)
    good = Outcome("r", ["a"], None, list(scenario.inputs), [], [], banked=["x", "y"], facts=["x", "y"])
    lost = Outcome("r", ["a"], None, list(scenario.inputs), [], [], banked=["x"], facts=["x", "y", "y"])
    text = "\n".join(check(lost, good, [], scenario, lost))
    assert "the bank holds 1 lines" in text and "durable memory holds 3 facts (2 distinct)" in text
    doubled = Outcome("r", ["a"], None, list(scenario.inputs), [], [], banked=["x", "x", "y"], facts=["x", "y"])
    assert "the bank holds 'x' 2 times" in "\n".join(check(doubled, good, [], scenario, doubled))


def test_one_scenario_at_one_point_runs_alone() -> None:
    """``loomrt bench chaos --scenario S --point P``: only those kills; an unknown name is a usage error."""
    import json

    from typer.testing import CliRunner

    from loomrt.cli.bench_cmd import bench_app

    runner = CliRunner()
    done = runner.invoke(
        bench_app, ["chaos", "--scenario", "tools-compaction", "--point", "in_tool", "--per-point", "2", "--json"]
    )
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kills"] == result["landed"] == 2 and result["violations"] == 0
    assert list(result["points"]) == ["in_tool"] and list(result["reached"]) == ["tools-compaction"]
    assert result["not_live"] == 0  # killed mid-turn, each run was resumed, and that run was checked
    for bad in (["--scenario", "nope"], ["--point", "nowhere"]):
        wrong = runner.invoke(bench_app, ["chaos", *bad])
        assert wrong.exit_code == 2 and "expected one of" in wrong.output
