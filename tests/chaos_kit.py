"""Sabotages of the crash harness's promises, for tests/test_sabotage.py.

The harness kills real ``loomrt`` processes, so a sabotage must hold in every process it
starts as well as in the test's own (where the harness recovers): :func:`everywhere` applies
one here through ``monkeypatch`` and, through a ``sitecustomize`` module on ``PYTHONPATH``,
in every Python process the test starts. Each sabotage takes the ``setattr`` to apply it with.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Setattr = Callable[[Any, str, Any], None]


def pay_distillation_apart(setattr: Setattr) -> None:
    """A summary's model call is committed in its own transaction, before the distillation
    it is for: a process killed between the two leaves a paid summary on the record, and
    the resumed run pays for it again."""
    from loomrt.run.reducers import summarize

    call_model = summarize.call_model

    async def committed_alone(run: Any, *args: Any, **kw: Any) -> Any:
        response = await call_model(run, *args, **kw)
        await run.flush()
        return response

    setattr(summarize, "call_model", committed_alone)


def lose_recall_on_reopen(setattr: Setattr) -> None:
    """A run opened again from its record to go on (``runs resume``, or the next input sent
    in a new process) drops the recall index it rebuilt: what was evicted before the crash
    cannot be recalled by the run that goes on. A run only opened to be read is untouched."""
    from loomrt.runtime import Runtime

    def drop(run: Any) -> None:
        if run.toolset.recall is not None:
            run.toolset.recall._backlog.clear()

    _on_resume(setattr, opened=drop)
    send = Runtime.send

    async def sending(self: Any, run: Any, text: str, **kw: Any) -> Any:
        if run.view.last_seq and not getattr(run, "_sabotage_sent", False):  # opened from its record
            run._sabotage_sent = True
            if run.view.turns:  # not a run this process started
                drop(run)
        return await send(self, run, text, **kw)

    setattr(Runtime, "send", sending)


def stray_context_on_resume(setattr: Setattr) -> None:
    """A resumed run ends its turn holding a working context its record does not: a message
    is added to it that was never recorded."""
    from loomrt.messages import Message

    def stray(run: Any) -> None:
        run.view.context.append(Message(role="user", content="A note the record does not hold."))

    _on_resume(setattr, played=stray)


def _on_resume(
    setattr: Setattr, opened: Callable[[Any], None] | None = None, played: Callable[[Any], None] | None = None
) -> None:
    """Break ``Runtime.resume``: ``opened`` on the run it opens from the record, ``played`` on
    it once the resumed turn is over."""
    from loomrt.runtime import Runtime

    resume, aopen = Runtime.resume, Runtime.aopen

    async def opening(self: Any, run_id: str) -> Any:
        run = await aopen(self, run_id)
        if getattr(self, "_sabotage_resuming", None) == []:
            self._sabotage_resuming.append(run)
            if opened is not None:
                opened(run)
        return run

    async def resuming(self: Any, run_id: str) -> Any:
        self._sabotage_resuming = []
        try:
            result = await resume(self, run_id)
            if played is not None and self._sabotage_resuming:
                played(self._sabotage_resuming[0])
            return result
        finally:
            self._sabotage_resuming = None

    setattr(Runtime, "aopen", opening)
    setattr(Runtime, "resume", resuming)


def everywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sabotage: Callable[[Setattr], None]) -> None:
    """Apply ``sabotage`` in this process and in every Python process started from here on."""
    site = tmp_path / "sabotage-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"import chaos_kit\nchaos_kit.{sabotage.__name__}(setattr)\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    sabotage(monkeypatch.setattr)
