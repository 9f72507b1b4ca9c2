"""Versioned definitions: write a new version of an agent with a new state_schema, then promote it.

A stateful agent's ``propose_schema`` is recorded and inert. An operator adopts it by
writing a new version of the definition (``loomrt agents version NAME --state-schema FILE`` or
``--from-run RUN_ID``), which writes a new version ``NAME@N`` into the same file, right
after NAME, leaving everything else in the file (comments included) as it was. Runs of
that version record its own content hash. ``loomrt agents promote NAME@N`` makes the
version the definition of NAME (a version is not a fork: a fork is a run that shares
another run's history). A model may suggest; only an operator decides.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loomrt.errors import NotFoundError, SpecError
from loomrt.spec import definition_hash
from loomrt.spec_load import load_agents, load_agents_text

__all__ = ["version_agent", "promote_agent", "Block"]

_VERSION = re.compile(r"^(?P<base>.+)@(?P<n>\d+)$")


@dataclass(frozen=True)
class Block:
    """Where one agent's entry sits in the file: lines [start, end), its indentation, its raw body."""

    name: str
    start: int
    end: int
    indent: int
    body: dict[str, Any]


def _blocks(text: str, filename: str) -> list[Block]:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    agents = next((v for k, v in root.value if k.value == "agents"), None) if root else None
    if not isinstance(agents, yaml.MappingNode):
        raise SpecError("no 'agents:' mapping", where=filename)
    raw = yaml.safe_load(text)["agents"]
    lines = text.splitlines()
    out = []
    for key, value in agents.value:
        mark = value.end_mark
        before = lines[mark.line][: mark.column] if mark.line < len(lines) else ""
        end = mark.line if not before.strip() else mark.line + 1  # a block ends where the next key starts
        while end - 1 > key.start_mark.line and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
            end -= 1  # comments above the next key belong to it
        out.append(Block(key.value, key.start_mark.line, end, key.start_mark.column, raw[key.value]))
    return out


def _render(name: str, body: dict[str, Any], indent: int, comment: str) -> list[str]:
    dumped = yaml.safe_dump({name: body}, sort_keys=False, allow_unicode=True, width=100)
    pad = " " * indent
    return [f"{pad}# {comment}\n"] + [pad + line + "\n" for line in dumped.splitlines()]


def version_agent(
    path: str | Path, name: str, state_schema: dict[str, Any], *, new_name: str | None = None
) -> tuple[str, str]:
    """Write a new version of ``name`` with ``state_schema`` after it; return (new name, its hash)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    defs = load_agents(p)
    if name not in defs.agents:
        raise NotFoundError(f"no agent named {name!r} in {p}. Known agents: {', '.join(sorted(defs.agents))}")
    blocks = _blocks(text, str(p))
    block = next(b for b in blocks if b.name == name)
    base = _VERSION.match(name).group("base") if _VERSION.match(name) else name  # type: ignore[union-attr]
    if new_name is None:
        taken = {int(m.group("n")) for b in blocks if (m := _VERSION.match(b.name)) and m.group("base") == base}
        new_name = f"{base}@{max(taken | {1}) + 1}"
    if new_name in defs.agents:
        raise SpecError(f"an agent named {new_name!r} already exists in {p}; pick another with --as")
    body = copy.deepcopy(block.body)
    body.setdefault("context", {})["state_schema"] = state_schema
    old_hash = definition_hash(defs.agents[name])
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    new_lines = _render(
        new_name,
        body,
        block.indent,
        f"version of {name} ({old_hash}) on {stamp}; promote with `loomrt agents promote {new_name}`",
    )
    candidate = "".join(lines[: block.end] + new_lines + lines[block.end :])
    checked = load_agents_text(candidate, filename=str(p), base_dir=p.resolve().parent)  # never write a broken file
    p.write_text(candidate, encoding="utf-8")
    return new_name, definition_hash(checked.agents[new_name])


def promote_agent(path: str | Path, version: str) -> tuple[str, str]:
    """Make version ``NAME@N`` the definition of NAME (the version's entry is removed); return (NAME, hash)."""
    p = Path(path)
    m = _VERSION.match(version)
    if not m:
        raise SpecError(f"{version!r} is not a version; versions are named NAME@N (see `loomrt agents list`)")
    base = m.group("base")
    text = p.read_text(encoding="utf-8")
    blocks = {b.name: b for b in _blocks(text, str(p))}
    if version not in blocks:
        raise NotFoundError(f"no agent named {version!r} in {p}")
    if base not in blocks:
        raise NotFoundError(f"the version's base agent {base!r} is not in {p}")
    lines = text.splitlines(keepends=True)
    src, dst = blocks[version], blocks[base]
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    replacement = _render(base, src.body, dst.indent, f"promoted from {version} on {stamp}")
    # drop the version's lines (and the comment line version_agent wrote above it), then replace the base
    version_start = (
        src.start - 1
        if src.start > 0 and lines[src.start - 1].strip().startswith(("# version of", "# forked from"))
        else src.start
    )
    edits = sorted([(version_start, src.end, []), (dst.start, dst.end, replacement)], reverse=True)
    for start, end, new in edits:
        lines[start:end] = new
    candidate = "".join(lines)
    checked = load_agents_text(candidate, filename=str(p), base_dir=p.resolve().parent)
    p.write_text(candidate, encoding="utf-8")
    return base, definition_hash(checked.agents[base])
