"""Agent definitions: the pydantic models, YAML loading with precise errors, and the JSON Schema.

A definitions file looks like::

    agents:
      assistant:
        model: local/qwen2.5-coder-1.5b
        system_prompt: You are a helpful assistant.
        context: {mode: recap, budget_tokens: 4096}

An optional ``defaults:`` block applies to every agent unless the agent overrides a key.
Relative paths (``system_prompt_file``, ``scripted/PATH``) resolve against the file's folder.
Loading errors name the file, line, column and key path (see :class:`loomrt.errors.SpecError`).
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import jsonschema
import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from loomrt.errors import SpecError
from loomrt.spec_modes import FoldSpec, StatefulSpec
from loomrt.spec_reach import SPAWN_TOOLS, ChildrenState, McpServerSpec, _Strict

__all__ = [
    "McpServerSpec",
    "ChildrenState",
    "SPAWN_TOOLS",
    "RETENTION_MODES",
    "AGENTS_FILE_MAX_BYTES",
    "mode_names",
    "StatefulSpec",
    "FoldSpec",
    "ContextSpec",
    "Capabilities",
    "AgentSpec",
    "AgentsFile",
    "load_agents",
    "load_agents_text",
    "agents_json_schema",
    "definition_hash",
    "SCHEMA_URL",
]

RETENTION_MODES: dict[str, Any] = {
    "append": "loomrt.run.reducers.append:AppendMode",
    "recap": "loomrt.run.reducers.recap:RecapMode",
    "stateful": "loomrt.run.reducers.stateful:StatefulMode",
    "compaction": "loomrt.run.reducers.compaction:CompactionMode",
    "fold": "loomrt.run.reducers.fold:FoldMode",
}
"""The retention modes, written once: name → the mode's class (or ``"module:Class"``,
imported when a run first uses it). ``auto`` is not a mode but a choice among them."""


def mode_names() -> tuple[str, ...]:
    """Every value ``context.mode`` accepts: the registered modes, then ``auto``."""
    return (*RETENTION_MODES, "auto")


SCHEMA_URL = "https://loomrt.dev/schema/agents.schema.json"


INJECT_MIN_TOKENS = 128
"""The smallest default reserve for recall injection: below it a budget injects nothing."""


class ContextSpec(_Strict):
    """How a run keeps its working context under budget."""

    mode: str = Field("append", json_schema_extra=lambda schema: schema.update(enum=list(mode_names())))
    """Retention mode: append (keep everything), recap, stateful, compaction, fold (a tree
    of summary cards that unfold to the exact words), or auto
    (recap on local models and interactive runs, stateful on frontier APIs)."""
    budget_tokens: int = Field(8192, ge=256)
    """The working-context budget in tokens (capped by the model's context window)."""
    keep_last_n: int = Field(6, ge=0)
    """The most recent messages, never evicted by a distillation."""
    keep_first: bool = True
    """Pin the task (the first user input) so it survives every distillation verbatim."""
    pins: list[str] = Field(default_factory=list)
    """Fixed texts that always hold (standing instructions, parameters of the task): they go
    into the system prompt, which is never summarised."""
    pins_max_tokens: int = Field(1024, ge=0)
    """The token budget of the run's pins (operator's and model's); a pin over it is refused."""
    model_pins: bool = False
    """Grant the Pin tool: the model may pin a record message or a text (decisions the user
    made, open questions it still owes)."""
    recap_max_chars: int = Field(2000, ge=100)
    """recap mode: the longest recap the model may write."""
    autorecap_at_pct: int = Field(80, ge=50, le=95)
    """recap mode: distil when pressure reaches this percentage of the budget."""
    autocompact_at_pct: int = Field(80, ge=50, le=95)
    """compaction mode (and the append backstop): distil at this percentage of the budget."""
    backstop: bool = False
    """append mode: compact anyway when pressure reaches autocompact_at_pct (off by default)."""
    summarizer_model: str | None = None
    """An optional cheaper model for recaps and summaries; defaults to the agent's model."""
    state_schema: dict[str, Any] | None = None
    """stateful mode: the JSON Schema of the state Σ (its root must be an object)."""
    on_invalid_patch: Literal["retry", "fail"] = "retry"
    """stateful mode: retry an invalid patch (showing the model the error) or fail at once."""
    max_patch_retries: int = Field(2, ge=0, le=10)
    """stateful mode: how many times an invalid patch is retried before the run fails."""
    propose_schema: bool = False
    """stateful mode: offer the model a propose_schema field in emit_state. A proposal is
    recorded (schema_proposed), never applied; an operator adopts it with `loomrt agents version`."""
    recall: bool = False
    """Index every evicted span and grant the Recall tool to search it."""
    recall_max_entries: int = Field(4096, ge=16)
    """recall: the FIFO cap of the run's recall index, in entries."""
    recall_max_tokens: int = Field(1200, ge=64)
    """recall: the most tokens one Recall result may return."""
    recall_tool: bool = True
    """recall: grant the Recall tool. Off, the model cannot search by itself, and the runtime's
    injection (recall_inject) is how the evicted words come back."""
    recall_inject: Literal["auto", "on", "off"] = "auto"
    """recall: before each model call the runtime searches the evicted history (and memory)
    with the turn's input and puts the best passages, verbatim, into that call's prompt only
    (a recall_injected event; never into the working context). auto: on when recall is on and
    the mode distils (not append). Turn it off for an agent that must see only what it asked for."""
    recall_inject_tokens: int | None = Field(None, ge=64)
    """recall: the tokens reserved off the top of the budget for injected passages (the
    watermarks apply to the budget less this reserve; at most a quarter of the budget).
    Default: the smaller of 12% of the budget and 1,500 (none below 128, too few for a passage)."""
    harvest_to_memory: bool = False
    """Bank every evicted span for `loomrt consolidate`, which turns batches of them into
    durable facts (docs/memory.md). Needs memory_scopes: the first one is where its facts go."""
    memory_scopes: list[Literal["user", "agent", "project"]] = Field(default_factory=list)
    """The durable-memory scopes this agent may read (Recall searches them) and, with
    harvest_to_memory, write (the first one): user (the run's --user / LOOMRT_USER), agent
    (this agent's name), project (the agents file's project:). Empty: no durable memory."""
    harvest_max_tokens: int = Field(8000, ge=64)
    """harvest: the largest span that is banked; a larger one is refused with an event, never truncated."""
    message_max_tokens: int | None = Field(None, ge=64)
    """The largest message the working context takes whole; a larger one (a huge tool
    result, a pasted file) is cut there with a note, and its full text stays on the record.
    Default: a quarter of the budget."""
    stateful: StatefulSpec = Field(default_factory=StatefulSpec)
    """stateful mode's own keys."""
    fold: FoldSpec = Field(default_factory=FoldSpec)
    """fold mode's own keys."""

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, value: str) -> str:
        if value not in mode_names():
            expected = ", ".join(f"'{m}'" for m in mode_names())
            raise PydanticCustomError("literal_error", "Input should be one of {expected}", {"expected": expected})
        return value

    @field_validator("state_schema")
    @classmethod
    def _schema_is_valid(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return value
        try:
            jsonschema.validators.validator_for(value).check_schema(value)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"not a valid JSON Schema: {exc.message}") from None
        if value.get("type") != "object":
            raise ValueError("the root of state_schema must be {type: object}")
        return value

    @field_validator("recall_inject", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:
        """YAML reads a bare ``on`` / ``off`` as a boolean."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    def injects(self) -> bool:
        """Whether a run of this definition recalls for its model before each call."""
        if not self.recall or self.recall_inject == "off":
            return False
        return self.recall_inject == "on" or (self.mode != "append" or self.backstop)

    def inject_reserve(self, budget: int) -> int:
        """The tokens reserved for injected passages out of ``budget`` (0 when it does not inject)."""
        if not self.injects():
            return 0
        if self.recall_inject_tokens:
            return min(self.recall_inject_tokens, budget // 4)
        default = min(budget * 12 // 100, 1500)
        return default if default >= INJECT_MIN_TOKENS else 0  # too small a budget to hold a passage

    @model_validator(mode="after")
    def _inject_needs_recall(self) -> ContextSpec:
        if self.recall_inject == "on" and not self.recall:
            raise ValueError("recall_inject: on needs recall: true (injection searches the recall index)")
        return self

    @model_validator(mode="after")
    def _stateful_needs_schema(self) -> ContextSpec:
        if self.mode == "stateful" and self.state_schema is None:
            raise ValueError("mode stateful needs a state_schema (a JSON Schema whose root is an object)")
        return self


class Capabilities(_Strict):
    """Facts about a model that the registry cannot know (your own endpoints)."""

    local: bool | None = None
    """The model runs on your own hardware (auto then resolves to recap)."""
    context_window: int | None = Field(None, ge=256)
    """The model's context window in tokens."""
    tool_calling: bool | None = None
    """The model calls tools natively (else loomrt uses constrained JSON decisions)."""
    structured_output: bool | None = None
    """The model honours a JSON Schema response_format."""


class AgentSpec(_Strict):
    """One agent definition. Immutable once loaded: a run works on a deep clone."""

    model: str
    """A litellm model string: openai/gpt-4o, ollama/llama3, local/qwen2.5-coder-1.5b, scripted/PATH."""
    description: str = ""
    """What the agent is for (shown by `loomrt agents list`)."""
    system_prompt: str | None = None
    """The system prompt (or use system_prompt_file)."""
    system_prompt_file: str | None = None
    """A file holding the system prompt, relative to the definitions file."""
    spawnable: list[str] = Field(default_factory=list)
    """The agents of this file it may spawn with the spawn and parallel_spawn tools (empty: none)."""
    max_concurrent_children: int = Field(4, ge=1, le=32)
    """Children playing at once; the rest of a batch queues (queued time is not the child's)."""
    max_live_children: int = Field(32, ge=1, le=256)
    """Children of one run alive at once (playing or queued); a batch that would pass it is refused whole."""
    max_child_timeout_s: float | None = Field(None, gt=0)
    """The longest timeout_s a spawn may ask for; a request above it is refused, not clamped."""
    children_state: ChildrenState | None = None
    """stateful parents: merge-patch each child's Σ into this one's at ``into`` (no model call)."""
    mcp_servers: list[McpServerSpec] = Field(default_factory=list)
    """MCP servers whose tools the agent may use, started when a run first needs them."""
    tools: list[str] = Field(default_factory=list)
    """Allowlist of tool names; empty means no tools (default-deny). An MCP server's tools
    are ``SERVER.TOOL`` or ``SERVER.*``."""
    max_iterations: int = Field(20, ge=1)
    """The most model calls in one turn before the run stops."""
    max_tokens: int = Field(1024, ge=16)
    """The most tokens the model may write in one reply."""
    temperature: float | None = Field(None, ge=0, le=2)
    """Sampling temperature (provider default if unset)."""
    api_base: str | None = None
    """The provider endpoint, for self-hosted or proxied models."""
    api_key_env: str | None = None
    """The environment variable holding the API key (never put a key in this file)."""
    timeout_s: float | None = Field(None, gt=0)
    """Seconds before one model call times out. Default: 120 on a hosted model; on a local
    model, a limit scaled to the call (60 s + 1 s per 8 prompt tokens + 1 s per token asked
    for), since CPU generation is slow. A local model that times out is retried once, with
    the limit doubled."""
    retries: int = Field(3, ge=0, le=10)
    """Retries on 429, 5xx and timeouts, with exponential backoff and jitter."""
    capabilities: Capabilities = Field(default_factory=Capabilities)
    """Declared facts about the model (override the registry)."""
    context: ContextSpec = Field(default_factory=ContextSpec)
    """Retention: how the working context stays under budget."""

    @field_validator("mcp_servers")
    @classmethod
    def _unique_servers(cls, servers: list[McpServerSpec]) -> list[McpServerSpec]:
        names = [s.name for s in servers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"MCP server names must be unique; {', '.join(twice)} appears more than once")
        return servers

    @field_validator("tools")
    @classmethod
    def _known_sources(cls, tools: list[str], info: Any) -> list[str]:
        servers = {s.name for s in info.data.get("mcp_servers") or []}
        for i, name in enumerate(tools):
            server, dot, tool = name.partition(".")
            if not dot:
                continue
            if server not in servers:
                declared = ", ".join(sorted(servers)) or "none"
                raise ValueError(
                    f"tools[{i}] {name!r} names MCP server {server!r}, which mcp_servers does not "
                    f"declare (declared: {declared})"
                )
            if not tool or "." in tool:
                raise ValueError(f"tools[{i}] {name!r} must be SERVER.TOOL or SERVER.*")
        return tools

    @model_validator(mode="after")
    def _one_prompt(self) -> AgentSpec:
        if self.system_prompt is not None and self.system_prompt_file is not None:
            raise ValueError("give system_prompt or system_prompt_file, not both")
        if any(t in SPAWN_TOOLS for t in self.tools) and not self.spawnable:
            raise ValueError("spawn and parallel_spawn need spawnable: the agents this one may spawn")
        if self.children_state is not None and self.context.state_schema is None:
            raise ValueError("children_state merges children's Σ into this agent's Σ: it needs context.state_schema")
        if "Recall" in self.tools and not self.context.recall:
            raise ValueError(
                "Recall is granted by context.recall: true (which also indexes the evicted spans); "
                "set that instead of listing Recall in tools"
            )
        return self

    def system_text(self) -> str:
        """The system prompt, read from system_prompt_file if that is how it was given."""
        if self.system_prompt_file is not None:
            return Path(self.system_prompt_file).read_text(encoding="utf-8")
        return self.system_prompt or ""

    def clone(self, **overrides: Any) -> AgentSpec:
        """A deep clone with top-level or ``context`` overrides applied; self is untouched."""
        data = copy.deepcopy(self.model_dump())
        overrides = copy.deepcopy(overrides)  # the caller's dicts are not shared either
        ctx = overrides.pop("context", None) or {}
        data.update(overrides)
        data["context"].update(ctx)
        return AgentSpec.model_validate(data)


class AgentsFile(_Strict):
    """A definitions file: ``agents:`` (name → definition) and optional ``defaults:``."""

    defaults: dict[str, Any] = Field(default_factory=dict)
    """Keys applied to every agent unless the agent sets them (context keys merge one by one)."""
    project: str | None = Field(None, min_length=1, max_length=200)
    """The project this file's agents work for: the ``project`` durable-memory scope
    (default: the name of the file's folder)."""
    agents: dict[str, AgentSpec]
    """The agents, by name."""
    _problems: dict[str, SpecError] = PrivateAttr(default_factory=dict)

    def agent(self, name: str) -> AgentSpec:
        """The agent ``name``, ready to run: a problem with its own files (a system prompt
        file that does not resolve), found when the file was loaded, is raised now. A run
        resolves only the agent it plays, so a copied file whose *other* agents point at
        missing files still runs this one; ``loomrt agents validate`` checks them all."""
        if name in self._problems:
            raise self._problems[name]
        return self.agents[name]

    def problems(self) -> dict[str, SpecError]:
        """The agents whose files did not resolve, and why (empty for a file that loads whole)."""
        return dict(self._problems)

    def unknown_spawnable(self) -> tuple[str, int, str] | None:
        """The first ``spawnable`` entry naming no agent of this file: (agent, index, name)."""
        for name, spec in self.agents.items():
            for i, child in enumerate(spec.spawnable):
                if child not in self.agents:
                    return name, i, child
        return None


def definition_hash(spec: AgentSpec) -> str:
    """The content hash of a definition (the system prompt file's text included)."""
    data = spec.model_dump(mode="json")
    data["system_prompt"] = spec.system_text() if spec.system_prompt_file else spec.system_prompt
    data["system_prompt_file"] = None  # the text counts, not where the checkout lives
    for key, owner in (("model", data), ("summarizer_model", data["context"])):
        value = owner.get(key)
        if isinstance(value, str) and value.startswith("scripted/"):
            owner[key] = "scripted/" + Path(value).name
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- loading

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


def agents_json_schema() -> dict[str, Any]:
    """The JSON Schema of a definitions file (for editors and the configuration reference)."""
    schema = AgentsFile.model_json_schema()
    schema["$id"] = SCHEMA_URL
    schema["title"] = "loomrt agents file"
    return schema
