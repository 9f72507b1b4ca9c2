"""Every exception loomrt raises on purpose.

The tree::

    LoomError                      base of everything below
    ├── SpecError                  a mistake in an agent definition or a call (file, line, key path)
    ├── RunError                   a run failed (carries the run id and the last event seq)
    │   ├── ProviderError          the model provider failed permanently, or retries ran out
    │   ├── ScriptExhaustedError   a scripted model was asked for more turns than its script has
    │   └── StateError             stateful mode: Σ could not be patched into a valid state
    ├── StoreError                 the record could not be read or written
    └── NotFoundError              a run id or agent name that does not exist

Control flow inside the loop is not an exception: a mode's reply is a small tagged value
(:mod:`loomrt.run.steps`), and an invalid patch or an unknown tool is shown to the model as
a tool result.

Every message says what was wrong and what to do about it.
"""

from __future__ import annotations

import re

__all__ = [
    "LoomError",
    "RunOwnedError",
    "FencedError",
    "SpecError",
    "RunError",
    "ProviderError",
    "ScriptExhaustedError",
    "StateError",
    "StoreError",
    "MovedOnError",
    "NotFoundError",
    "without_reprs",
]

_OBJECT_REPR = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")


def without_reprs(text: str) -> str:
    """``text`` with Python object reprs (``<ssl.SSLContext object at 0x7f…>``) named plainly
    (``ssl.SSLContext``): a library's message can carry them, and a person cannot use them."""
    return _OBJECT_REPR.sub(lambda m: m.group(1), text)


class LoomError(Exception):
    """Base class of every loomrt error."""


class SpecError(LoomError):
    """A mistake in an agent definition or in how loomrt was called.

    ``where`` is ``file:line:col`` when known, ``path`` the dotted key path.
    """

    def __init__(self, message: str, *, where: str | None = None, path: str | None = None):
        self.where = where
        self.path = path
        self.detail = message
        prefix = ""
        if where:
            prefix += f"{where}: "
        if path:
            prefix += f"{path}: "
        super().__init__(prefix + message)


class RunError(LoomError):
    """A run failed. ``run_id`` and ``last_seq`` say which and where."""

    def __init__(self, message: str, *, run_id: str | None = None, last_seq: int | None = None):
        self.run_id = run_id
        self.last_seq = last_seq
        self.detail = message
        super().__init__(message)

    def __str__(self) -> str:
        # computed on demand: the loop fills in run_id and last_seq after the error is raised
        where = f"run {self.run_id}" if self.run_id else ""
        if self.run_id and self.last_seq is not None:
            where += f" (after event #{self.last_seq})"
        return f"{where}: {self.detail}" if where else self.detail


class ProviderError(RunError):
    """The model provider failed permanently (or its retries ran out)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        run_id: str | None = None,
        last_seq: int | None = None,
    ) -> None:
        self.status = status
        self.retryable = retryable
        super().__init__(without_reprs(message), run_id=run_id, last_seq=last_seq)


class ScriptExhaustedError(RunError):
    """A scripted model ran out of replies."""


class StateError(RunError):
    """Stateful mode could not produce a valid Σ."""


class StoreError(LoomError):
    """The record could not be read or written."""


class MovedOnError(StoreError):
    """A guarded append found the run's record longer than the writer had read it: another
    process (the run's own, playing a turn) wrote meanwhile, so the write was refused."""


class RunOwnedError(StoreError):
    """Another worker owns the run (its lease has not expired): this one may not play it."""


class FencedError(StoreError):
    """A write carried an owner's epoch, and a newer owner has the run now: the writer lost
    its lease (it slept, or its heartbeat stopped) and must not write."""


class NotFoundError(LoomError):
    """A run id, agent name or file that does not exist."""
