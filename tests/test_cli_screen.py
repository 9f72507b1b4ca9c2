"""What a person sees while a turn plays (issue 44): the answer streamed once, a status line
with the pressure meter only on a terminal, a notice after each distillation, and the
clean output of --quiet and --json unchanged."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loomrt.activity import Activity, AnswerText
from loomrt.cli._screen import Screen, meter, notice
from loomrt.cli.app import app
from loomrt.events import Event

runner = CliRunner()
ANSWER = "The staging database listens on port 5433, as the file says."


class FakeRun:
    run_id = "r1"
    reported_prompt_tokens = 0
    budget = 8000

    def estimate(self) -> int:
        return 2400


def _screen(*, stream: bool = True, status: bool = True) -> tuple[Screen, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    screen = Screen(stream=stream, status=status, out=out, err=err)
    screen.attach(FakeRun())
    return screen, out, err


def test_the_answer_streams_once_and_the_status_line_is_cleared_before_it() -> None:
    screen, out, err = _screen()
    screen.begin()
    screen.watch(Activity("r1", "calling", tool="read_file"))
    assert "calling read_file" in err.getvalue() and "2.4k/8.0k tokens" in err.getvalue()
    screen.watch(Activity("r1", "thinking"))
    for piece in ("The staging ", "database listens ", "on port 5433,"):
        screen.watch(AnswerText("r1", piece))
    assert err.getvalue().endswith("\r\x1b[2K")  # cleared before the first piece
    screen.answer(ANSWER)
    assert out.getvalue() == ANSWER + "\n"  # what streamed, then the rest: the answer once


def test_an_answer_that_is_not_what_streamed_is_printed_whole_on_its_own_line() -> None:
    screen, out, _ = _screen()
    screen.begin()
    screen.watch(AnswerText("r1", '{"action": '))
    screen.answer(ANSWER)
    assert out.getvalue() == '{"action": \n' + ANSWER + "\n"


def test_a_retried_call_streams_again_and_the_answer_is_not_printed_twice() -> None:
    screen, out, _ = _screen()
    screen.begin()
    screen.watch(Activity("r1", "thinking"))
    screen.watch(AnswerText("r1", "The stag"))  # the connection dropped here
    screen.watch(Activity("r1", "retrying", attempt=1))
    screen.watch(AnswerText("r1", ANSWER))
    screen.answer(ANSWER)
    assert out.getvalue() == "The stag\n" + ANSWER + "\n"


def test_a_turn_cut_short_leaves_a_fresh_line_for_what_follows() -> None:
    screen, out, err = _screen()
    with pytest.raises(KeyboardInterrupt), screen.turn():
        screen.watch(AnswerText("r1", "The stag"))
        raise KeyboardInterrupt
    assert out.getvalue() == "The stag\n" and err.getvalue().endswith("\r\x1b[2K")
    failed, out, _ = _screen()
    with failed.turn():  # a turn that returns failed (a provider error after some text)
        failed.watch(AnswerText("r1", "The stag"))
    failed.close_line()
    assert out.getvalue() == "The stag\n"


def test_a_sub_agents_text_is_not_streamed_as_the_answer() -> None:
    screen, out, err = _screen()
    screen.begin()
    screen.watch(Activity("child", "calling", tool="read_file"))
    assert "a sub-agent: calling read_file" in err.getvalue()
    screen.watch(AnswerText("child", "not mine"))
    screen.answer(ANSWER)
    assert out.getvalue() == ANSWER + "\n"


def test_off_a_terminal_no_status_line_is_drawn() -> None:
    screen, out, err = _screen(stream=False, status=False)
    screen.begin()
    screen.watch(Activity("r1", "thinking"))
    screen.watch(AnswerText("r1", "The staging "))
    distilled = Event(
        run_id="r1",
        seq=9,
        kind="distillation",
        data={"mode": "recap", "span_seqs": [3, 4, 5], "tokens_before": 6100, "tokens_after": 900},
    )
    screen.hear(distilled)
    screen.answer(ANSWER)
    assert out.getvalue() == ANSWER + "\n"
    assert err.getvalue() == f"{notice(distilled)}\n" and "\x1b" not in err.getvalue()


def test_a_tool_step_is_one_line_on_a_terminal_and_private_content_stays_out() -> None:
    screen, _, err = _screen()
    screen.begin()
    result = {"tool_call_id": "c1", "name": "read_file", "content": "port = 5433", "is_error": False}
    screen.hear(Event(run_id="r1", seq=5, kind="tool_result", data=result))
    screen.hear(Event(run_id="r1", seq=6, kind="tool_result", data={**result, "content": "SECRET", "private": True}))
    assert "· read_file → port = 5433" in err.getvalue() and "SECRET" not in err.getvalue()
    quiet, _, quiet_err = _screen(stream=False, status=False)
    quiet.begin()
    quiet.hear(Event(run_id="r1", seq=5, kind="tool_result", data=result))
    assert quiet_err.getvalue() == ""  # off a terminal, stderr keeps only the notices


def test_between_turns_the_work_shows_in_the_toolbar_and_its_notice_waits() -> None:
    """While a chat waits for input (before its first turn too) nothing is drawn over the
    input line: the toolbar says what runs in the background, and the notice prints later."""
    screen, _, err = _screen()
    screen.watch(Activity("r1", "distilling", mode="fold", messages=12))
    assert err.getvalue() == "" and screen.toolbar().endswith("folding in the background")
    done = {"mode": "fold", "span_seqs": [3, 4], "tokens_before": 6100, "tokens_after": 900}
    screen.hear(Event(run_id="r1", seq=9, kind="distillation", data=done))
    assert err.getvalue() == "" and "↳ fold: 2 messages evicted" in screen.toolbar()
    screen.begin()
    assert "↳ fold: 2 messages evicted" in err.getvalue()
    screen.end()


def test_the_notice_and_the_meter_read_as_sentences() -> None:
    e = Event(
        run_id="r1",
        seq=9,
        kind="distillation",
        data={"mode": "recap", "span_seqs": [3, 4, 5, 8], "tokens_before": 6100, "tokens_after": 900},
    )
    assert notice(e) == "↳ recap: 4 messages evicted (#3–#8) · 6,100 → 900 tokens · the record keeps them"
    assert meter(6000, 8000) == "▰▰▰▰▰▰▰▰▱▱ 6.0k/8.0k tokens"


# ---------------------------------------------------------------- through the CLI


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    (tmp_path / "s.yaml").write_text(f"turns:\n  - text: {json.dumps(ANSWER)}\n", encoding="utf-8")
    path = tmp_path / "agents.yaml"
    path.write_text("agents:\n  a:\n    model: scripted/s.yaml\n", encoding="utf-8")
    return path


def _on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules["loomrt.cli.app"], "terminal", lambda stream: True)


def test_run_on_a_terminal_streams_the_answer_under_a_status_line(
    agents: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _on_a_terminal(monkeypatch)
    result = runner.invoke(app, ["run", "a", "which port?", "--agents", str(agents)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout == ANSWER + "\n"
    assert "thinking" in result.stderr and "tokens" in result.stderr and "#1" not in result.stderr


@pytest.mark.parametrize("flag", ["--quiet", "--json"])
def test_quiet_and_json_keep_the_clean_output(agents: Path, monkeypatch: pytest.MonkeyPatch, flag: str) -> None:
    _on_a_terminal(monkeypatch)
    result = runner.invoke(app, ["run", "a", "which port?", "--agents", str(agents), flag], catch_exceptions=False)
    assert result.exit_code == 0 and result.stderr == ""
    expected: Any = json.loads(result.stdout)["output"] if flag == "--json" else result.stdout
    assert expected in (ANSWER, ANSWER + "\n")


def test_run_with_events_renders_each_event_on_a_terminal_too(agents: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _on_a_terminal(monkeypatch)
    result = runner.invoke(app, ["run", "a", "which port?", "--agents", str(agents), "--events"])
    assert result.exit_code == 0 and result.stdout == ANSWER + "\n"
    assert "#1" in result.stderr and "thinking" not in result.stderr
