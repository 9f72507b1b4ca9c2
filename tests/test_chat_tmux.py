"""`loomrt chat` as a person sees it, in a real terminal (tmux): the streamed answer, the
status line and its pressure meter, the distillation notice, the arrow keys editing the
line, and ``chat -c`` reopening the run with its history (issue 44). The panes it reads
are the ones docs/getting-started.md shows (``python tests/tmux_kit.py --docs``)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from tmux_kit import play_chat

from loomrt.record.sqlite import default_store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install -y tmux)"),
]


def test_a_chat_in_a_terminal_shows_its_work(tmp_path: Path) -> None:
    seen = play_chat(tmp_path)
    # the status line, with the pressure meter, while the model thinks
    assert re.search(r"thinking .*[▰▱]{10} \d+(\.\d)?k?/4\.0k tokens", seen["thinking"]), seen["thinking"]
    # the answer streams: part of it is on the screen before the rest is written
    assert "Hello! This answer" in seen["streaming"] and "when they matter." not in seen["streaming"]
    answered = seen["answered"]
    assert answered.count("Hello! This answer") == 1 and "thinking" not in answered  # once; the status line cleared
    # the arrow keys edit the line: "helo", Left, "l" is "hello" (not "helo^[[Dl")
    assert "you> hello\n" in answered and "^[[" not in answered
    assert re.search(r"recapping (\d+ messages|in the background)", seen["recapping"]), seen["recapping"]
    assert re.search(r"  · now → \d{4}-\d\d-\d\dT", seen["recapping"])  # the tool's step, in one line
    notice = re.search(r"↳ recap: \d+ messages? evicted \(#\d+(–#\d+)?\) · [\d,]+ → [\d,]+ tokens", seen["distilled"])
    assert notice, seen["distilled"]
    # chat -c reopens the same run; the up arrow brings back the last input of the first sitting
    [run_id] = re.findall(r"run (\w{12}) saved", seen["saved"])
    assert f"reopened run {run_id} · agent demo · 3 turns so far" in seen["history"]
    assert "you> thanks" in seen["history"].split("reopened run")[1]
    assert "the turns before this one are in my working context" in seen["reopened"]
    store = default_store(f"sqlite:{tmp_path / 'home' / 'record.sqlite'}")
    inputs = [e.data["content"] for e in store.events(run_id, kinds=["user_input"])]
    assert inputs == ["hello", "what time is it?", "thanks", "thanks"]
    assert len(store.list_runs()) == 1
