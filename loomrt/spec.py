"""Agent definitions: the pydantic models of an agents file, the definition hash, and the
JSON Schema.

:class:`AgentsFile` holds ``agents:`` (name → :class:`AgentSpec`) and ``defaults:``; an
:class:`AgentSpec` holds the model, the prompt, the tools and the retention
(:class:`ContextSpec`). Reading a file into these models, with errors that name the file,
line, column and key path, is :mod:`loomrt.spec_load` (:func:`~loomrt.spec_load.load_agents`).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import jsonschema
from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from loomrt.errors import SpecError
from loomrt.spec_modes import FoldSpec, StatefulSpec
from loomrt.spec_reach import SPAWN_TOOLS, ChildrenState, McpServerSpec, _Strict

__all__ = [
    "McpServerSpec",
    "ChildrenState",
    "SPAWN_TOOLS",
    "RETENTION_MODES",
    "mode_names",
    "StatefulSpec",
    "FoldSpec",
    "ContextSpec",
    "Capabilities",
    "AgentSpec",
    "AgentsFile",
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
    """recap mode: the longest recap block (and never over a fifth of the budget, at about
    three characters a token): what is carried from the earlier recap (its sentences with
    exact values first, at most half) and the model's recap of the new span after it."""
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
    one_call_turns: bool | None = None
    """The embedded model decides and answers in one generation (a grammar allows a
    tool-call object or plain text), its default; false: it decides, then answers in a
    second call."""


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


def agents_json_schema() -> dict[str, Any]:
    """The JSON Schema of a definitions file (for editors and the configuration reference)."""
    schema = AgentsFile.model_json_schema()
    schema["$id"] = SCHEMA_URL
    schema["title"] = "loomrt agents file"
    return schema
