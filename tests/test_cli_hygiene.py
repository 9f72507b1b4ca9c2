"""Output hygiene (issue 44): every event renders as a line a person reads, never a dict; a
provider error never shows an object repr; libraries' progress bars stay out of the output."""

from __future__ import annotations

import subprocess
import sys
import types
import typing
from typing import Any

import pytest

from loomrt.cli._render import describe
from loomrt.errors import ProviderError
from loomrt.events import EVENT_KINDS, Event
from loomrt.payloads import PAYLOADS

JSON_SHOWN = ("tool_call", "state_update", "patch_rejected")
"""Kinds whose line shows a JSON value the model wrote (a tool's arguments, Σ's patch)."""


def _sample(annotation: Any) -> Any:
    """A plain value of a payload field's type."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return _sample(args[0])
    if origin is typing.Literal:
        return args[0]
    base = origin or annotation
    samples: dict[Any, Any] = {str: "text", int: 7, float: 1.5, bool: True, dict: {}, list: [3, 8], tuple: [3, 8]}
    return samples.get(base, "text")


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: p.model_fields["kind"].annotation.__args__[0])
def test_every_event_renders_as_a_readable_line(payload: Any) -> None:
    kind = payload.model_fields["kind"].annotation.__args__[0]
    data = {name: _sample(f.annotation) for name, f in payload.model_fields.items() if name != "kind"}
    line = describe(Event(run_id="r", seq=1, kind=kind, data=data))
    assert line and "\n" not in line
    assert not any(mark in line for mark in ("{'", "': ", "object at")), line  # no Python repr
    if kind not in JSON_SHOWN:  # no payload dumped as JSON either
        assert not any(f'"{name}"' in line for name in data), line


def test_every_kind_has_a_payload() -> None:
    assert len(PAYLOADS) == len(EVENT_KINDS)


def test_a_provider_error_names_objects_plainly() -> None:
    error = ProviderError("openai/x: could not connect (ssl=<ssl.SSLContext object at 0x7f3a2c1d9e50>)")
    assert str(error) == "openai/x: could not connect (ssl=ssl.SSLContext)"


@pytest.mark.slow
def test_loading_the_embedder_prints_no_progress_bar() -> None:
    pytest.importorskip("sentence_transformers")
    code = "from loomrt.recall.embedders import MiniLMEmbedder; MiniLMEmbedder.model()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Loading weights" not in done.stderr and "it/s" not in done.stderr, done.stderr


INSPECTION = [
    "runs list", "runs show", "runs events", "runs export", "runs verify", "runs private", "agents list",
    "memory search", "memory list", "memory show", "db status", "workers list", "bench list", "recall", "doctor",
]  # fmt: skip


@pytest.mark.parametrize("name", INSPECTION)
def test_every_inspection_command_takes_json(name: str) -> None:
    """docs/cli.md says so: `runs export` and `bench list` were the two that did not."""
    import typer.main

    from loomrt.cli.app import app

    command: Any = typer.main.get_command(app)
    for word in name.split():
        command = command.commands[word]
    assert any("--json" in getattr(p, "opts", []) for p in command.params)
