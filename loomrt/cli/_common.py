"""What every CLI command shares: finding the agents file, opening the runtime, and
turning user mistakes into one clear line and a non-zero exit (never a traceback)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console

from loomrt.errors import LoomError, NotFoundError, RunError, SpecError, StoreError

if TYPE_CHECKING:
    from loomrt.cli._screen import Screen
    from loomrt.events import Event
    from loomrt.runtime import Runtime

__all__ = [
    "out",
    "err",
    "agents_path",
    "load",
    "runtime",
    "terminal",
    "friendly",
    "print_json",
    "print_result",
    "plural",
    "playing",
    "when",
    "took",
]

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


def agents_path(explicit: Path | None) -> Path:
    """--agents FILE, else ./agents.yaml, else $LOOMRT_AGENTS."""
    if explicit is not None:
        return explicit
    local = Path("agents.yaml")
    if local.is_file():
        return local
    env = os.environ.get("LOOMRT_AGENTS")
    if env:
        return Path(env)
    raise SpecError("no agents file: pass --agents FILE, create ./agents.yaml, or set LOOMRT_AGENTS")


def load(explicit: Path | None, *, eager: bool = False) -> tuple[Path, Any]:
    """The agents file and its definitions; ``eager`` checks every agent's files now (validate),
    else each agent's when it is chosen (run, chat)."""
    from loomrt.spec_load import load_agents

    path = agents_path(explicit)
    return path, load_agents(path, eager=eager)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 prompt``, ``2 prompts``; ``many`` is the plural where it is not ``word`` + s."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def when(ts: float | None) -> str:
    """An epoch time as people read it: local ``YYYY-MM-DD HH:MM`` (``--json`` keeps the number)."""
    return "" if ts is None else dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def took(seconds: float) -> str:
    """A duration as people read it: ``0.4 s``, ``12 s``, ``3 min 5 s``, ``2 h 5 min``, ``3 d 4 h``."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    for big, small, a, b in ((86_400, 3_600, "d", "h"), (3_600, 60, "h", "min"), (60, 1, "min", "s")):
        if whole >= big:
            rest = (whole % big) // small
            return f"{whole // big} {a}" + (f" {rest} {b}" if rest else "")
    return f"{whole} s"


class _Playing:
    """The run this command plays, for the line Ctrl-C prints (reset by :func:`friendly`)."""

    run_id: str | None = None
    chat: bool = False


_playing = _Playing()


def playing(run_id: str, *, chat: bool = False) -> None:
    """Name the run this command plays (a chat: ``chat``), so that Ctrl-C says how to go on with it.
    The runtime from :func:`runtime` names the first run it records an event of by itself."""
    _playing.run_id = run_id
    _playing.chat = _playing.chat or chat


def _heard(e: Event) -> None:
    if _playing.run_id is None:  # the first run the command touches; its sub-agents come after
        _playing.run_id = e.run_id


def runtime(*, show_events: bool = False, user: str | None = None, screen: Screen | None = None) -> Runtime:
    """The runtime on the default record; ``show_events`` renders each event live on stderr;
    ``screen`` (a :class:`~loomrt.cli._screen.Screen`) draws the runs' turns live instead;
    ``user`` names the runs' ``user`` memory scope (default ``$LOOMRT_USER``)."""
    from loomrt.cli._render import EventPrinter
    from loomrt.runtime import Runtime

    listeners: list[Any] = [_heard, *([EventPrinter(err)] if show_events else [])]
    if screen is not None:
        return Runtime(listeners=[*listeners, screen.hear], watchers=[screen.watch], user=user)
    return Runtime(listeners=listeners, user=user)


def terminal(stream: object) -> bool:
    """Whether ``stream`` is a person's terminal (a status line is drawn only there)."""
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty())


def _interrupted() -> str:
    """What Ctrl-C prints: the run it stopped, and how to go on with it."""
    run_id = _playing.run_id
    if run_id is None:
        return "interrupted"
    if _playing.chat:
        return f"interrupted: the record keeps run {run_id} so far (`loomrt chat --continue {run_id}` reopens it)"
    return f"interrupted: the record keeps run {run_id} so far (`loomrt runs resume {run_id}` goes on from there)"


def print_json(obj: Any) -> None:
    """One JSON document on stdout (plain print: rich would wrap long lines)."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def print_result(result: Any, json_output: bool) -> None:
    """A run's (or a turn's) result: the JSON object, or the answer, or its error on stderr."""
    if json_output:
        print_json(result.to_json())
    elif result.status == "failed":
        err.print(f"[red]error:[/red] {result.error}", highlight=False)
    else:
        out.print(result.output or "", markup=False, highlight=False)


def friendly(fn: F) -> F:
    """Run a command; a loomrt error becomes ``error: ...`` on stderr and exit 2 (a user
    mistake) or 1 (a failed run)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _playing.run_id, _playing.chat = None, False
        try:
            return fn(*args, **kwargs)
        except (SpecError, NotFoundError) as exc:
            err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
            raise typer.Exit(2) from None
        except (RunError, StoreError, LoomError) as exc:
            err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
            raise typer.Exit(1) from None
        except ImportError as exc:
            err.print(
                f"[red]error:[/red] a part of loomrt is not installed: {exc}. "
                "Install everything with: pip install 'loomrt[all]'",
                highlight=False,
            )
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print(_interrupted(), highlight=False)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]
