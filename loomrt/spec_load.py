"""Reading an agents file: YAML in, a validated :class:`~loomrt.spec.AgentsFile` out, with
precise errors.

A definitions file looks like::

    agents:
      assistant:
        model: local/qwen2.5-coder-1.5b
        system_prompt: You are a helpful assistant.
        context: {mode: recap, budget_tokens: 4096}

An optional ``defaults:`` block applies to every agent unless the agent overrides a key.
``${VAR}`` and ``${VAR:-default}`` are replaced from the environment. Relative paths
(``system_prompt_file``, ``scripted/PATH``) resolve against the file's folder. Loading
errors name the file, line, column and key path (see :class:`loomrt.errors.SpecError`);
a file too large, or whose aliases expand too far, is refused before it is read whole.
The models themselves live in :mod:`loomrt.spec`.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from loomrt.errors import SpecError
from loomrt.spec import AgentsFile, AgentSpec

__all__ = [
    "AGENTS_FILE_MAX_BYTES",
    "YAML_MAX_NODES",
    "load_agents",
    "load_agents_text",
]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Located:
    """Line/column of every key path in a YAML document."""

    def __init__(self, filename: str, node: yaml.Node | None):
        self.filename = filename
        self.marks: dict[tuple[Any, ...], tuple[int, int]] = {}
        self.key_marks: dict[tuple[Any, ...], tuple[int, int]] = {}
        if node is not None:
            self._walk(node, ())

    def _walk(self, node: yaml.Node, path: tuple[Any, ...], seen: set[int] | None = None) -> None:
        self.marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        seen = set() if seen is None else seen
        if id(node) in seen:  # an alias of a node walked already: its keys were checked there
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, key.value)
                mark = (key.start_mark.line + 1, key.start_mark.column + 1)
                if sub in self.key_marks:  # PyYAML would silently keep the last one
                    raise SpecError(
                        f"duplicate key '{key.value}' (first at line {self.key_marks[sub][0]}). Keep one.",
                        where=f"{self.filename}:{mark[0]}:{mark[1]}",
                        path=_dotted(sub),
                    )
                self.key_marks[sub] = mark
                self._walk(value, sub, seen)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, (*path, i), seen)

    def where(self, path: tuple[Any, ...], *, key: bool = False) -> str:
        for p in (path[:n] for n in range(len(path), -1, -1)):
            mark = (self.key_marks.get(p) if key else None) or self.marks.get(p)
            if mark:
                return f"{self.filename}:{mark[0]}:{mark[1]}"
        return self.filename


YAML_MAX_NODES = 100_000
"""The most nodes an agents file may hold once its aliases are expanded (a definitions file
holds hundreds): past it, a few lines of aliases that refer to aliases (a "billion laughs")
would take minutes and gigabytes to read, so the file is refused."""


def _expanded_size(node: yaml.Node, limit: int) -> int:
    """How many nodes ``node`` stands for with every alias expanded (each distinct node is
    counted once and its size remembered, so this visits each node once), or ``limit + 1``
    as soon as it is known to be over ``limit``."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, done = stack.pop()
        if id(current) in sizes:
            continue
        children = (
            [n for pair in current.value for n in pair]
            if isinstance(current, yaml.MappingNode)
            else list(current.value)
            if isinstance(current, yaml.SequenceNode)
            else []
        )
        if not done:
            stack.append((current, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        sizes[id(current)] = min(limit + 1, 1 + sum(sizes.get(id(c), 1) for c in children))
    return sizes[id(node)]


def _alias_bomb(text: str, node: yaml.Node | None, filename: str) -> None:
    """Refuse a file whose aliases expand past :data:`YAML_MAX_NODES`, naming the alias used most."""
    if node is None or "*" not in text:
        return
    size = _expanded_size(node, YAML_MAX_NODES)
    if size <= YAML_MAX_NODES:
        return
    uses: dict[str, int] = {}
    for m in re.finditer(r"\*([^\s,\]\}]+)", text):
        uses[m.group(1)] = uses.get(m.group(1), 0) + 1
    name = max(uses, key=lambda k: uses[k]) if uses else "?"
    line = next((i + 1 for i, ln in enumerate(text.splitlines()) if f"*{name}" in ln), 0)
    raise SpecError(
        f"the file's aliases expand to more than {YAML_MAX_NODES:,} nodes (alias *{name} is used {uses.get(name, 0)} "
        "times, and aliases refer to aliases): write the repeated part once under defaults:, or repeat it plainly",
        where=f"{filename}:{line}" if line else filename,
    )


AGENTS_FILE_MAX_BYTES = 2 * 1024 * 1024
"""The largest agents file loomrt reads (2 MiB): definitions, not data; put long prompts in
``system_prompt_file`` files."""


def load_agents(path: str | os.PathLike[str], *, eager: bool = False) -> AgentsFile:
    """Load and validate a definitions file; raise :class:`SpecError` naming file:line:col and key."""
    p = Path(path)
    try:
        if p.is_file() and p.stat().st_size > AGENTS_FILE_MAX_BYTES:
            raise SpecError(
                f"the agents file is {p.stat().st_size:,} bytes, over the {AGENTS_FILE_MAX_BYTES:,}-byte limit; "
                "move long prompts into system_prompt_file files",
                where=str(p),
            )
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(
            "no such agents file. Pass --agents FILE, set LOOMRT_AGENTS, or create ./agents.yaml",
            where=str(p),
        ) from None
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise SpecError(
            f"the agents file is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}). "
            "Save it as UTF-8.",
            where=f"{p}:{line}",
        ) from None
    except OSError as exc:
        raise SpecError(f"cannot read the agents file: {exc.strerror or exc}", where=str(p)) from None
    return load_agents_text(text, filename=str(p), base_dir=p.resolve().parent, eager=eager)


_NAME_BAD = re.compile(r"[/\\\x00-\x1f\x7f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What an agent name may not hold: path separators, control characters, and the
bidirectional controls that make a name read as another."""


def load_agents_text(
    text: str, *, filename: str = "<agents>", base_dir: Path | None = None, eager: bool = True
) -> AgentsFile:
    """Load definitions from YAML text (relative paths resolve against ``base_dir``). With
    ``eager`` every agent's files must resolve; without, an agent whose files do not is
    refused only when it is chosen (:meth:`AgentsFile.agent`)."""
    base_dir = base_dir or Path.cwd()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _alias_bomb(text, node, filename)
        raw = yaml.safe_load(text)
    except ValueError as exc:  # a number too long to read (Python's limit on digits, 4,300)
        long_number = re.search(r"\d{1000,}", text)
        line = text[: long_number.start()].count("\n") + 1 if long_number else 0
        raise SpecError(
            f"a number in the file is too large to read ({exc}); write it as a quoted string if it is an id",
            where=f"{filename}:{line}" if line else filename,
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        raise SpecError(f"not valid YAML: {exc.problem}", where=where) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (a control character)
        line = text[: exc.position].count("\n") + 1
        raise SpecError(
            f"not valid YAML: character {exc.character!r} (code {ord(exc.character) if isinstance(exc.character, str) else exc.character}) "
            "is not allowed in a YAML file; remove it",
            where=f"{filename}:{line}",
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {exc}", where=filename) from None
    except RecursionError:
        raise SpecError("the file nests too deeply to read (thousands of levels); flatten it", where=filename) from None
    loc = _Located(filename, node)
    if not isinstance(raw, dict) or "agents" not in raw:
        raise SpecError("the top level must be a mapping with an 'agents:' key", where=loc.where(()))
    raw = _interpolate(raw, (), loc)
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SpecError(
            "'defaults:' must be a mapping of keys every agent gets", where=loc.where(("defaults",)), path="defaults"
        )
    agents = raw.get("agents")
    if not isinstance(agents, dict) or not agents:
        raise SpecError("'agents:' must map agent names to definitions", where=loc.where(("agents",)), path="agents")
    merged = {}
    deferred: dict[str, SpecError] = {}
    for name, body in agents.items():
        if not isinstance(name, str) or not name.strip() or _NAME_BAD.search(name):
            raise SpecError(
                f"the agent name {name!r} holds a path separator, a control character or a bidirectional "
                "control; name agents with letters, digits, '-', '_' and '.'",
                where=loc.where(("agents", name), key=True),
                path=f"agents.{name!r}",
            )
        if not isinstance(body, dict):
            raise SpecError(
                "an agent definition must be a mapping", where=loc.where(("agents", name)), path=f"agents.{name}"
            )
        try:
            merged[name] = _resolve_paths(_apply_defaults(defaults, body), base_dir, loc, name)
        except SpecError as exc:
            if eager:
                raise
            deferred[name] = exc
            merged[name] = {k: v for k, v in _apply_defaults(defaults, body).items() if k != "system_prompt_file"}
    try:
        top = {k: v for k, v in raw.items() if k != "agents"}
        top.setdefault("project", base_dir.name or None)  # the project scope: the file's folder by default
        loaded = AgentsFile.model_validate({**top, "agents": merged})
    except ValidationError as exc:
        raise _spec_error(exc, loc) from None
    loaded._problems = deferred
    unknown = loaded.unknown_spawnable()
    if unknown is not None:
        name, i, child = unknown
        raise SpecError(
            f"spawnable names {child!r}, which is not an agent of this file (agents: {', '.join(sorted(loaded.agents))})",
            where=loc.where(("agents", name, "spawnable", i)),
            path=f"agents.{name}.spawnable[{i}]",
        )
    return loaded


def _apply_defaults(defaults: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(defaults)
    for key, value in body.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = copy.deepcopy(value)
    return out


def _resolve_paths(body: dict[str, Any], base: Path, loc: _Located, name: str) -> dict[str, Any]:
    prompt_file = body.get("system_prompt_file")
    if isinstance(prompt_file, str):
        resolved = (base / prompt_file).resolve()
        if not resolved.is_file():
            what = "is not a regular file" if resolved.exists() else f"does not exist (looked in {resolved.parent})"
            raise _at_origin(
                SpecError(
                    f"system prompt file {prompt_file!r} {what}",
                    where=loc.where(("agents", name, "system_prompt_file")),
                    path=f"agents.{name}.system_prompt_file",
                ),
                ("agents", name, "system_prompt_file"),
                loc,
            )
        body["system_prompt_file"] = str(resolved)
    if "model" in body:
        body["model"] = _resolve_script(body["model"], base)
    context = body.get("context")
    if isinstance(context, dict) and "summarizer_model" in context:
        body["context"] = {**context, "summarizer_model": _resolve_script(context["summarizer_model"], base)}
    return body


def _resolve_script(model: Any, base: Path) -> Any:
    """``scripted/PATH`` with a relative PATH, made absolute against ``base``."""
    if isinstance(model, str) and model.startswith("scripted/"):
        script = Path(model.removeprefix("scripted/"))
        if not script.is_absolute():
            return "scripted/" + str((base / script).resolve())
    return model


def _interpolate(value: Any, path: tuple[Any, ...], loc: _Located, done: dict[int, Any] | None = None) -> Any:
    """``value`` with ``${VAR}`` replaced; a mapping or list an alias shares is walked once."""
    done = {} if done is None else done
    if isinstance(value, dict | list) and id(value) in done:
        return done[id(value)]
    if isinstance(value, dict):
        mapping: dict[Any, Any] = {}
        done[id(value)] = mapping
        mapping.update({k: _interpolate(v, (*path, k), loc, done) for k, v in value.items()})
        return mapping
    if isinstance(value, list):
        items: list[Any] = []
        done[id(value)] = items
        items.extend(_interpolate(v, (*path, i), loc, done) for i, v in enumerate(value))
        return items
    if isinstance(value, str) and "${" in value:

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise SpecError(
                f"environment variable {name} is not set. Set it, or write ${{{name}:-default}}",
                where=loc.where(path),
                path=_dotted(path),
            )

        return _ENV.sub(sub, value)
    return value


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")


def _fields_at(path: tuple[Any, ...]) -> list[str]:
    """The known keys of the model that owns ``path``'s last key."""
    model: type[BaseModel] = AgentsFile
    for i, part in enumerate(path[:-1]):
        if model is AgentsFile and part == "agents":
            model = AgentSpec
            continue
        if i == 1 and path[0] == "agents":
            continue  # the agent's name
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
    return list(model.model_fields)


def _spec_error(exc: ValidationError, loc: _Located) -> SpecError:
    err = exc.errors()[0]
    path = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    return _at_origin(_describe(err, path, loc), path, loc, key=err["type"] == "extra_forbidden")


def _at_origin(error: SpecError, path: tuple[Any, ...], loc: _Located, *, key: bool = False) -> SpecError:
    """``error`` about an agent's key, moved to ``defaults:`` when that is where the key is written."""
    if len(path) > 2 and path[0] == "agents" and path not in loc.marks and ("defaults", *path[2:]) in loc.marks:
        where = loc.where(("defaults", *path[2:]), key=key)
        return SpecError(
            f"{error.detail} (applies to agent '{path[1]}')", where=where, path=_dotted(("defaults", *path[2:]))
        )
    return error


def _describe(err: Any, path: tuple[Any, ...], loc: _Located) -> SpecError:
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        known = _fields_at(path)
        close = difflib.get_close_matches(str(path[-1]), known, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else f" Known keys: {', '.join(known)}."
        msg = f"unknown key '{path[-1]}'.{hint}"
        return SpecError(msg, where=loc.where(path, key=True), path=_dotted(path))
    if kind == "literal_error":
        allowed = err.get("ctx", {}).get("expected", "")
        allowed = ", ".join(a.strip().strip("'") for a in allowed.replace(" or ", ", ").split(","))
        return SpecError(f"{value!r} is not one of {allowed}", where=loc.where(path), path=_dotted(path))
    if kind == "missing":
        return SpecError("this key is required", where=loc.where(path[:-1]), path=_dotted(path))
    msg = err["msg"].removeprefix("Value error, ")
    if value is not None and not isinstance(value, (dict, list)):
        msg += f" (got {value!r})"
    return SpecError(msg, where=loc.where(path), path=_dotted(path))
