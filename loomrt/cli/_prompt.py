"""The chat's input line for a person at a terminal: the arrow keys edit it, the up arrow
brings back earlier inputs (kept in ``$LOOMRT_HOME/chat_history`` across chats), and under
it a toolbar shows the pressure meter and any work the run does in the background.

prompt_toolkit draws it; without prompt_toolkit, the standard library's readline edits the
line and keeps the same history file (no toolbar).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["LineReader", "history_path", "PROMPT"]

PROMPT = "you> "


def history_path() -> Path:
    """Where the chat keeps the lines a person typed: ``$LOOMRT_HOME/chat_history``."""
    from loomrt.record.sqlite import loomrt_home

    return loomrt_home() / "chat_history"


class LineReader:
    """Reads one input line at a time from a person; None at the end (Ctrl-D)."""

    def __init__(self, *, toolbar: Callable[[], str] | None = None, history: Path | None = None):
        self.history = history or history_path()
        self.session: Any = None
        try:
            if not (sys.stdin.isatty() and sys.stdout.isatty()):
                raise ImportError("prompt_toolkit draws on a terminal only")
            from prompt_toolkit import PromptSession
            from prompt_toolkit.history import FileHistory
        except ImportError:  # readline edits the line where prompt_toolkit is not installed
            self._readline()
            return
        self.session = PromptSession(
            history=FileHistory(str(self.history)),
            bottom_toolbar=(lambda: f" {toolbar()} ") if toolbar is not None else None,
            refresh_interval=0.5 if toolbar is not None else 0,
        )

    def read(self) -> str | None:
        try:
            if self.session is not None:
                return str(self.session.prompt(PROMPT))
            line = input(PROMPT)
        except EOFError:
            return None
        self._remember()
        return line

    def _readline(self) -> None:
        with contextlib.suppress(ImportError, OSError):
            import readline

            if self.history.is_file():
                readline.read_history_file(self.history)

    def _remember(self) -> None:
        with contextlib.suppress(ImportError, OSError):
            import readline

            readline.write_history_file(self.history)
