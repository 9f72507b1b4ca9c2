"""`loomrt chat` in a real terminal, as a person uses it: typed into a shell inside tmux, and
read back with ``tmux capture-pane``.

:func:`play_chat` plays one sitting on a scripted model (a slow first answer, a tool call
that fills the working context, a recap, then the chat reopened with ``-c``) and returns
the panes a person saw at each moment. ``tests/test_chat_tmux.py`` checks them;
``python tests/tmux_kit.py --docs`` writes them into docs/getting-started.md.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["Pane", "play_chat", "SCRIPT", "AGENTS", "write_docs"]

SCRIPT = """\
turns:
  - text: >-
      Hello! This answer streams to you word by word while the model writes it, as a
      hosted model's would. The status line above said what the run was doing; the meter
      beside it says how full the working context is, in tokens of its budget. When it
      fills up, the retention mode distils it, and a notice says what was evicted. The
      record keeps every word all the same, and recall brings them back when they matter.
    delay_s: 2
    stream_s: 0.08
  - tool_call: {name: now, arguments: {}}
    usage: {input_tokens: 3600}
  - text: "It is the time the tool said. That result filled the working context, so it is recapped."
    stream_s: 0.05
  - text: "You are welcome. The notice above says what the recap evicted, and the tokens before and after."
    stream_s: 0.05
  - text: "Same chat, same run: the turns before this one are in my working context, or recapped."
    stream_s: 0.05
summaries:
  - text: "Recap: greeted; the user asked the time."
    delay_s: 2
"""

AGENTS = """\
agents:
  demo:
    model: scripted/script.yaml
    tools: [now]
    context: {mode: recap, budget_tokens: 4000, keep_last_n: 2}
"""

DOCS_START = "<!-- chat panes: python tests/tmux_kit.py --docs -->"
DOCS_END = "<!-- end of chat panes -->"


class Pane:
    """One tmux window on a private server, running a shell in ``folder``."""

    def __init__(self, folder: Path, *, width: int = 100, height: int = 30):
        self.socket = f"loomrt-test-{os.getpid()}-{id(self)}"
        bin_dir = str(Path(sys.executable).parent)
        env = {
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
            "HOME": os.environ.get("HOME", str(folder)),
            "LOOMRT_HOME": str(folder / "home"),
            "LOOMRT_ALLOW_MODEL_REQUESTS": "0",
            "TERM": "xterm-256color",
            "PS1": "$ ",
            "LANG": "C.UTF-8",
        }
        shell = "env -i " + " ".join(f"{k}='{v}'" for k, v in env.items()) + " bash --norc --noprofile"
        self._tmux("new-session", "-d", "-s", "chat", "-x", str(width), "-y", str(height), "-c", str(folder), shell)

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True)
        return done.stdout

    def type(self, text: str) -> None:
        """Type ``text`` as it is (no key names)."""
        self._tmux("send-keys", "-t", "chat", "-l", text)

    def press(self, *keys: str) -> None:
        """Press keys by tmux's names: Enter, Left, Up, C-d."""
        self._tmux("send-keys", "-t", "chat", *keys)

    def screen(self) -> str:
        """What the window shows now, less the blank lines under it."""
        return self._tmux("capture-pane", "-p", "-J", "-t", "chat").rstrip("\n") + "\n"

    def wait_for(self, pattern: str, timeout: float = 60.0) -> str:
        """The screen once ``pattern`` (a regex) is on it; AssertionError with the screen if not."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if re.search(pattern, text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} did not appear in {timeout:g} s; the screen:\n{text}")
            time.sleep(0.05)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, check=False)


def play_chat(folder: Path) -> dict[str, str]:
    """One sitting of ``loomrt chat demo`` in tmux, then the chat reopened: the screens a
    person saw, by moment (``thinking``, ``streaming``, ``answered``, ``recapping``,
    ``distilled``, ``saved``, ``history``, ``reopened``)."""
    (folder / "script.yaml").write_text(SCRIPT, encoding="utf-8")
    (folder / "agents.yaml").write_text(AGENTS, encoding="utf-8")
    pane = Pane(folder)
    seen: dict[str, str] = {}
    try:
        pane.wait_for(r"(?m)^\$ *$")
        pane.type("loomrt chat demo")
        pane.press("Enter")
        pane.wait_for(r"you>")
        pane.type("helo")
        pane.press("Left")  # the cursor goes back one: the line is edited, not ^[[D
        pane.type("l")
        pane.press("Enter")
        seen["thinking"] = pane.wait_for(r"thinking.*tokens")
        seen["streaming"] = pane.wait_for(r"Hello! This answer")
        seen["answered"] = pane.wait_for(r"when they matter\.\n(.*\n)*you>")
        pane.type("what time is it?")
        pane.press("Enter")
        # in the turn, or between turns where the mode queues it: the status line or the toolbar says so
        seen["recapping"] = pane.wait_for(r"recapping (\d+ messages|in the background)")
        pane.wait_for(r"so it is recapped\.\n(.*\n)*you>")
        pane.type("thanks")
        pane.press("Enter")
        seen["distilled"] = pane.wait_for(r"and the tokens before and after\.\n(.*\n)*you>")
        pane.press("C-d")
        seen["saved"] = pane.wait_for(r"saved · .*\n(.*\n)*\$")
        pane.type("loomrt chat -c")
        pane.press("Enter")
        pane.wait_for(r"reopened run .*\n(.*\n)*you>")
        pane.press("Up")  # the input history, kept across chats
        seen["history"] = pane.wait_for(r"reopened run .*\n(.*\n)*you> thanks")
        pane.press("Enter")
        seen["reopened"] = pane.wait_for(r"or recapped\.\n(.*\n)*you>")
        pane.press("C-d")
        pane.wait_for(r"saved · .*\n(.*\n)*\$")
    finally:
        pane.close()
    return seen


def write_docs(seen: dict[str, str], page: Path) -> None:
    """Put the panes into ``page`` between its chat-panes markers."""
    shown = [
        ("While the model thinks, a status line says so, with the pressure meter:", "thinking"),
        ("The answer streams as the model writes it:", "streaming"),
        (
            "When the working context fills, the mode distils it: here a recap, made between turns "
            "while you type (the toolbar says so; a distillation inside a turn shows on the status line):",
            "recapping",
        ),
        ("and a notice says what was evicted, and the tokens before and after:", "distilled"),
        ("`loomrt chat -c` reopens the chat; the up arrow brings back what you typed:", "history"),
        ("and the same run goes on:", "reopened"),
    ]
    parts = [DOCS_START]
    for words, key in shown:
        parts += ["", words, "", "```text", _last_lines(seen[key]).rstrip("\n"), "```"]
    parts += ["", DOCS_END]
    text = page.read_text(encoding="utf-8")
    start, end = text.index(DOCS_START), text.index(DOCS_END) + len(DOCS_END)
    page.write_text(text[:start] + "\n".join(parts) + text[end:], encoding="utf-8")


def _last_lines(screen: str, n: int = 12, width: int = 100) -> str:
    """The bottom of ``screen`` as the terminal showed it: lines wrapped at its width, and
    the empty rows above the input line's toolbar as one."""
    lines: list[str] = []
    for line in screen.rstrip().splitlines():
        line = line.rstrip()
        rows = [line[i : i + width] for i in range(0, len(line), width)] or [""]
        for row in rows:
            if not (row.strip() == "" and lines and lines[-1] == ""):
                lines.append(row.rstrip())
    return "\n".join(lines[-n:]) + "\n"


if __name__ == "__main__":
    if "--docs" not in sys.argv[1:] or shutil.which("tmux") is None:
        sys.exit("usage: python tests/tmux_kit.py --docs   (needs tmux: apt-get install -y tmux)")
    with tempfile.TemporaryDirectory() as tmp:
        panes = play_chat(Path(tmp))
    write_docs(panes, Path(__file__).resolve().parent.parent / "docs" / "getting-started.md")
    print("docs/getting-started.md: the chat panes rewritten")
