"""What a person sees while a turn plays: the answer as the model writes it, and on a
terminal a status line (what the run does now, and how full its working context is) and a
one-line notice after each distillation.

The answer streams to stdout. The status line is drawn on stderr, only where stderr is a
terminal, and cleared before any other line prints. Nothing here is recorded: a
:class:`Screen` is a run's listener (events) and watcher (:mod:`loomrt.activity`).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from loomrt.activity import Activity, AnswerText
from loomrt.cli._common import plural
from loomrt.cli._render import short
from loomrt.events import Event

__all__ = ["Screen", "doing", "meter", "notice", "tool_line"]

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
VERBS = {"recap": "recapping", "compaction": "compacting", "fold": "folding", "stateful": "distilling"}


def doing(activity: Activity, *, background: bool = False) -> str:
    """An activity in a few words: ``thinking``, ``calling read_file``, ``recapping 12 messages``."""
    match activity.doing:
        case "calling":
            return f"calling {activity.tool}"
        case "distilling":
            verb = VERBS.get(activity.mode or "", "distilling")
            return f"{verb} in the background" if background else f"{verb} {plural(activity.messages, 'message')}"
        case "retrying":
            return f"retrying the model call (attempt {activity.attempt + 1})"
        case other:
            return other


def meter(tokens: int, budget: int, width: int = 10) -> str:
    """The pressure meter: ``▰▰▰▱▱▱▱▱▱▱ 2.4k/8.2k tokens``."""
    full = 0 if budget <= 0 else min(width, round(width * tokens / budget))
    return f"{'▰' * full}{'▱' * (width - full)} {_k(tokens)}/{_k(budget)} tokens"


def _k(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def notice(e: Event) -> str | None:
    """The one line a distillation (or a declined one) gets, else None."""
    d = e.data
    mode = d.get("mode")
    sizes = f"{d.get('tokens_before', 0):,} → {d.get('tokens_after', 0):,} tokens"
    pressure = f" (pressure {d['pressure']:,} of {d['budget']:,})" if d.get("pressure") and d.get("budget") else ""
    if e.kind == "distillation":
        seqs = d.get("span_seqs") or []
        span = f" (#{seqs[0]}–#{seqs[-1]})" if len(seqs) > 1 else (f" (#{seqs[0]})" if seqs else "")
        return f"↳ {mode}: {plural(len(seqs), 'message')} evicted{span} · {sizes}{pressure} · the record keeps them"
    if e.kind == "distillation_declined":
        return f"↳ {mode} declined: {d.get('reason')} · {sizes}"
    return None


def tool_line(e: Event) -> str:
    """A tool's result in one line: ``· read_file → 120 lines …`` (``✗`` for an error)."""
    d = e.data
    mark = "✗" if d.get("is_error") else "·"
    said = (
        "(private: `runs events --include-private` shows it)" if d.get("private") else short(d.get("content") or "", 80)
    )
    return f"  {mark} {d.get('name')} → {said}"


class Screen:
    """Draws one run's turns for a person. ``stream``: the answer goes to ``out`` as it is
    written; ``status``: a status line with the pressure meter is drawn on ``err`` (a terminal).
    Call :meth:`attach` with the run once it exists, :meth:`answer` when a turn returns."""

    def __init__(self, *, stream: bool, status: bool, out: TextIO | None = None, err: TextIO | None = None):
        self.stream, self.status = stream, status
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.run: Any = None
        self.background = True
        """No turn plays (a chat waits for input, perhaps while its run folds): activities
        are kept for the input line's toolbar, not drawn; :meth:`begin` ends it."""
        self.doing = ""
        self.meter = ""
        self.streamed = ""
        """The text the current model call has streamed so far."""
        self.held: list[str] = []
        """Notices of the background, printed when the next turn starts."""
        self._since = time.monotonic()
        self._drawn = False
        self._open_line = False
        self._lock = threading.RLock()
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ wiring

    def attach(self, run: Any) -> None:
        """The run whose turns this screen draws (its sub-agents' are not)."""
        self.run = run
        self.measure()

    def watch(self, signal: Activity | AnswerText) -> None:
        """A run's watcher (:mod:`loomrt.activity`)."""
        if self.run is None:
            return
        if signal.run_id != self.run.run_id:  # a sub-agent's: what it does, never its text
            if isinstance(signal, Activity) and not self.background:
                with self._lock:
                    self.doing = f"a sub-agent: {doing(signal)}"
                    self._draw()
            return
        if isinstance(signal, AnswerText):
            self._text(signal.text)
            return
        with self._lock:
            self._end_line()
            if signal.doing in ("thinking", "retrying"):  # a new model call: its own text follows
                self.streamed = ""
            self.doing = doing(signal, background=self.background)
            self._since = time.monotonic()
            self.measure()
            self._draw()

    def hear(self, e: Event) -> None:
        """A run's listener: a distillation's notice, and the meter after each step."""
        if self.run is None or e.run_id != self.run.run_id:
            return
        line = notice(e)
        with self._lock:
            if e.kind == "tool_result" and self.status and not self.background:  # a tool's step, in a line
                self._print(tool_line(e), style="2")
            if e.kind in ("model_call", "distillation", "distillation_declined", "user_input", "parked", "final"):
                self.measure()
            if line is None:
                self._draw()
            elif self.background:  # the work between turns is done: its notice waits for the prompt to return
                self.held.append(line)
                self.doing = ""
            else:
                self._print(line)

    def measure(self) -> None:
        """The meter from the run's working context now (called on the loop's thread only):
        the larger of its estimate and the prompt tokens the provider last reported."""
        if self.run is None:
            return
        tokens = max(self.run.estimate(), self.run.reported_prompt_tokens)
        self.meter = meter(tokens, self.run.budget)

    # ------------------------------------------------------------------ a turn

    def begin(self) -> None:
        """A turn starts: the background's notices print, and the status line is drawn."""
        self.flush()
        with self._lock:
            self.background = False
            self.doing, self.streamed, self._since = "thinking", "", time.monotonic()
            self._draw()
        if self.status and self._ticker is None:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """``with screen.turn():`` a turn plays, drawn live; a turn cut short (Ctrl-C, an
        error) leaves the screen on a fresh line for what is printed next."""
        self.begin()
        try:
            yield
        except BaseException:
            self.end()
            self.close_line()
            raise
        self.end()

    def close_line(self) -> None:
        """End the line the answer streamed on (a turn that failed: its error prints next)."""
        with self._lock:
            self._end_line()
            self.streamed = ""

    def answer(self, output: str | None) -> None:
        """The turn returned ``output``: what the stream has not shown of it is printed (all of
        it when nothing streamed; after a line break when the answer is not what streamed)."""
        self.end()
        text = output or ""
        with self._lock:
            shown = self.streamed if self._open_line else ""
            if shown and text.startswith(shown):
                rest = text[len(shown) :]
            elif shown and text.startswith(shown.rstrip()):
                rest = text[len(shown.rstrip()) :].lstrip(" ")
            else:
                rest = ("\n" if shown else "") + text
            self.out.write(rest + "\n")
            self.out.flush()
            self._open_line = False
            self.streamed = ""

    def end(self) -> None:
        """Stop drawing: the ticker stops, the status line is cleared, the background begins."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            self._clear()
            self.background = True
            self.doing = ""

    def flush(self) -> None:
        """Print the notices of the work done between turns (before a turn, and as the chat ends)."""
        with self._lock:
            held, self.held = self.held, []
            for line in held:
                self._print(line)

    def toolbar(self) -> str:
        """What the chat's input line shows under it: the meter, and the background's work
        (or the notice of what it did)."""
        with self._lock:
            return "  ".join(x for x in (self.meter, self.doing or (self.held[-1] if self.held else "")) if x)

    # ------------------------------------------------------------------ drawing

    def _text(self, piece: str) -> None:
        with self._lock:
            if not self.stream:
                return
            self._clear()
            self.out.write(piece)
            self.out.flush()
            self.streamed += piece
            self._open_line = True

    def _end_line(self) -> None:
        if self._open_line:
            self.out.write("\n")
            self.out.flush()
            self._open_line = False

    def _print(self, line: str, style: str = "36") -> None:
        """A line on stderr (on a terminal in ``style``, an SGR code: cyan by default)."""
        self._clear()
        self._end_line()
        if self.status:
            self.err.write(f"\x1b[{style}m{line}\x1b[0m\n")
        else:
            self.err.write(line + "\n")
        self.err.flush()
        self._draw()

    def _draw(self) -> None:
        if not self.status or self.background or self._open_line or not self.doing:
            return
        frame = SPINNER[int(time.monotonic() * 8) % len(SPINNER)]
        seconds = int(time.monotonic() - self._since)
        text = f"{frame} {self.doing}" + (f" {seconds}s" if seconds else "") + f"  ·  {self.meter}"
        width = shutil.get_terminal_size((80, 24)).columns - 1
        self.err.write(f"\r\x1b[2K\x1b[2m{text[:width]}\x1b[0m")
        self.err.flush()
        self._drawn = True

    def _clear(self) -> None:
        if self._drawn:
            self.err.write("\r\x1b[2K")
            self.err.flush()
            self._drawn = False

    def _tick(self) -> None:
        while not self._stop.wait(0.125):
            with self._lock:
                self._draw()
