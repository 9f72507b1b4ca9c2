"""The payload of every event kind, as typed, tagged models behind one ``TypeAdapter``.

The record stores ``data`` as JSON; these models say what each kind carries, so the
record, the CLI and (soon) MCP share one schema, published as
``docs/events.schema.json``. Every append is checked against it
(:func:`check_payload`): a payload that drifts from its documented shape is a bug caught
where it is written. Unknown extra keys are allowed, so a newer writer's additions never
break an older reader.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

__all__ = [
    "EventPayload",
    "PAYLOADS",
    "check_payload",
    "events_json_schema",
    "RunStarted",
    "UserInput",
    "ModelCall",
    "AssistantMessage",
    "ToolCallPayload",
    "ToolResult",
    "StateUpdate",
    "PatchRejected",
    "SchemaProposed",
    "Distillation",
    "DistillationDeclined",
    "SummaryRejected",
    "Retry",
    "CallbackError",
    "ToolSourceError",
    "SpawnChildStarted",
    "SpawnChildResult",
    "Notice",
    "Parked",
    "Resumed",
    "Error",
    "Final",
    "Cancelled",
    "PinPayload",
    "UnpinPayload",
    "MarkPrivate",
    "Declassify",
    "CardRejected",
    "FoldQueued",
    "DistillationQueued",
    "FoldSkippedPayload",
    "HarvestBanked",
    "HarvestError",
    "RunQueued",
    "RecallInjected",
]


class _Payload(BaseModel):
    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)


class RunStarted(_Payload):
    kind: Literal["run_started"]
    agent: str
    def_hash: str
    definition: dict[str, Any]
    """The run's own clone of the agent definition, as loaded."""
    requested_mode: str
    mode: str
    """The retention mode after ``auto`` was resolved."""
    model: str
    interactive: bool
    tools: list[str]
    system: str
    local: bool | None = None
    budget: int | None = None
    message_max_tokens: int | None = None
    forked_from: dict[str, Any] | None = None
    """A fork's origin: ``{run_id, seq}`` (not ``parent_run_id``, which names the spawner)."""
    catalog: list[dict[str, Any]] | None = None
    """fold: a fork's starting catalog, the parent's trimmed at the fork seq (cards by id, messages by seq)."""
    user: str | None = None
    """Whom the run works for (``--user`` / ``LOOMRT_USER``): its ``user`` memory scope."""
    project: str | None = None
    """The agents file's ``project:``: the run's ``project`` memory scope."""


class UserInput(_Payload):
    kind: Literal["user_input"]
    content: str
    said_at: float | None = None
    """When the words were said (epoch seconds), where that is not when they were recorded:
    a history imported from elsewhere. Every reader of when (the dates of recalled passages,
    fold's times, durable memory's absolute dates) reads this instead of the event's ``ts``."""


class ModelCall(_Payload):
    kind: Literal["model_call"]
    purpose: str
    """turn, recap, summary or state."""
    model: str
    usage: dict[str, int]
    seconds: float
    finish_reason: str | None = None
    prompt_hash: str | None = None
    """A hash of the messages sent (``loomrt.audit.prompt_hash``): ``runs verify`` checks it
    against the working context the record rebuilds."""
    prompt_from: str | None = None
    """``context`` when the messages sent were the run's working context (a turn)."""
    recall_injected: int | None = None
    """The seq of the ``recall_injected`` event whose block followed the working context in
    this call's prompt (``runs verify`` re-derives the prompt with it)."""
    injected_tokens: int | None = None
    """The runtime's estimate of that block's tokens (part of ``estimated_tokens``)."""


class AssistantMessage(_Payload):
    kind: Literal["assistant_message"]
    message: dict[str, Any]
    """role, content and tool_calls, as :meth:`loomrt.messages.Message.to_dict` writes them."""

    @field_validator("message")
    @classmethod
    def _calls_are_readable(cls, message: dict[str, Any]) -> dict[str, Any]:
        """Nothing unreadable is written: each tool call has a name and an object of arguments
        that nests at most a readable depth (a provider's reply is checked before this)."""
        from loomrt.providers.base import ARGUMENTS_MAX_DEPTH, nesting_depth

        for call in message.get("tool_calls") or ():
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ValueError(f"a tool call without a name: {call!r:.200}")
            if not isinstance(call.get("arguments", {}), dict):
                raise ValueError(f"the arguments of tool call {call['name']!r} are not an object")
            if nesting_depth(call.get("arguments")) > ARGUMENTS_MAX_DEPTH:
                raise ValueError(f"the arguments of tool call {call['name']!r} nest too deeply")
        return message


class ToolCallPayload(_Payload):
    kind: Literal["tool_call"]
    id: str
    name: str
    arguments: dict[str, Any]


class ToolResult(_Payload):
    kind: Literal["tool_result"]
    tool_call_id: str | None
    name: str | None
    content: str
    is_error: bool = False
    private: bool = False
    """Only its own run may see it (:mod:`loomrt.visibility`): a private tool, a
    ``Private`` result, or a private MCP server."""


class StateUpdate(_Payload):
    kind: Literal["state_update"]
    state: dict[str, Any]
    patch: dict[str, Any]
    reasoning: Any = ""
    action: dict[str, Any] | None = None
    done: bool = False
    private_keys: list[str] = Field(default_factory=list)
    """Σ's top-level keys this patch set while the step's prompt held private material: Σ as
    the run hands it out leaves them out (:func:`loomrt.visibility.withhold`)."""


class PatchRejected(_Payload):
    kind: Literal["patch_rejected"]
    patch: Any = None
    error: str
    attempt: int
    feedback: str | None = None


class SchemaProposed(_Payload):
    kind: Literal["schema_proposed"]
    schema_: dict[str, Any] = Field(alias="schema")
    note: str = ""


class Distillation(_Payload):
    kind: Literal["distillation"]
    mode: str
    span_seqs: list[int]
    tokens_before: int
    tokens_after: int
    pressure: int
    budget: int
    context: list[dict[str, Any]]
    """The working context after it: record messages by ``{seq}``, synthetic ones whole."""
    summary: str | None = None
    state: dict[str, Any] | None = None
    parts: int | None = None
    pointers_dropped: int | None = None
    cards: list[dict[str, Any]] | None = None
    """fold: the cards this fold wrote, whole (:class:`loomrt.run.cards.Card`); ``context``
    names them ``{card: ID}``."""
    folds: dict[str, int] | None = None
    """fold: leaves, rollups and externalised results this fold made."""
    verify: dict[str, int] | None = None
    """fold: values checked against the source, values invented, cards rejected, fallbacks."""
    hard: bool | None = None
    """fold: made at the hard watermark, in the turn (else between turns)."""


class DistillationDeclined(_Payload):
    kind: Literal["distillation_declined"]
    mode: str
    tokens_before: int
    tokens_after: int
    pressure: int | None = None
    paid: bool | None = None
    reason: str


class SummaryRejected(_Payload):
    kind: Literal["summary_rejected"]
    purpose: str
    reason: str
    attempt: int
    text: str


class Retry(_Payload):
    kind: Literal["retry"]
    attempt: int
    error: str
    delay_s: float
    status: int | None = None
    purpose: str | None = None


class CallbackError(_Payload):
    kind: Literal["callback_error"]
    callback: str
    error: str
    distillation_seq: int | None = None


class SpawnChildStarted(_Payload):
    kind: Literal["spawn_child_started"]
    tool_call_id: str
    """The parent's spawn or parallel_spawn call."""
    index: int
    """The entry's place in the call."""
    run_id: str
    """The child's run."""
    agent: str


class SpawnChildResult(_Payload):
    kind: Literal["spawn_child_result"]
    tool_call_id: str
    index: int
    run_id: str
    agent: str
    status: str
    """ok, failed, timeout, max_iterations or cancelled."""
    ok: bool
    output: str | None = None
    state: dict[str, Any] | None = None
    error: str | None = None
    usage: dict[str, int] | None = None
    """The child's tokens (its own children's included)."""


class ToolSourceError(_Payload):
    kind: Literal["tool_source_error"]
    server: str
    """The MCP server (its name in mcp_servers)."""
    phase: str
    """start (it could not start) or call (it died during a call)."""
    error: str


class Notice(_Payload):
    kind: Literal["notice"]
    message: str
    source: str = ""
    """Which part says it (recall, harvest, ...)."""


class Parked(_Payload):
    kind: Literal["parked"]
    output: str | None = None
    after_error: str | None = None
    """Set when the turn failed: the chat parks for the next input instead of ending."""


class Resumed(_Payload):
    kind: Literal["resumed"]
    from_seq: int
    input: str | None = None


class Error(_Payload):
    kind: Literal["error"]
    message: str
    type: str


class Final(_Payload):
    kind: Literal["final"]
    output: str | None = None
    state: dict[str, Any] | None = None


class Cancelled(_Payload):
    kind: Literal["cancelled"]
    reason: str
    """Who cancelled it and how (an MCP client's cancel_run, a cancelled request)."""
    output: str | None = None
    """The last answer before the cancellation, if any."""


class PinPayload(_Payload):
    kind: Literal["pin"]
    pin: str
    """The pin's id: ``#SEQ`` for a record message, ``text-N`` for a text."""
    seq: int | None = None
    """The pinned record message (its full text is what is kept)."""
    text: str | None = None
    """A pinned text (the model's Pin tool)."""
    note: str = ""
    """Why it is pinned."""
    by: str = "operator"
    """operator or model."""


class UnpinPayload(_Payload):
    kind: Literal["unpin"]
    pin: str
    by: str = "operator"


class MarkPrivate(_Payload):
    kind: Literal["mark_private"]
    seq: int
    """The record message that only its own run may see from now on."""
    by: str = "operator"
    """operator (``loomrt runs private``), or runtime: the message is derived private."""
    derived_from: int | None = None
    """by runtime: the private message it repeats (:class:`loomrt.visibility.Taint`)."""


class Declassify(_Payload):
    kind: Literal["declassify"]
    seq: int
    """A message the runtime marked derived private that is not private from now on."""
    by: str = "operator"


class RecallInjected(_Payload):
    kind: Literal["recall_injected"]
    query: str
    """What the runtime searched for: the turn's user input (and, after a tool result, its rarest words)."""
    passages: list[dict[str, Any]]
    """The passages, in the order the block shows them: ``source`` (run, family or memory),
    ``seq`` (or a memory ``id``), ``score``, ``cosine``, ``bm25``, ``tokens``, ``date``,
    ``speaker``, ``text`` (verbatim) and ``before`` (the end of the message before a short one)."""
    tokens: int
    """The block's estimated tokens (at most ``context.recall_inject_tokens``)."""
    sources: list[str] = Field(default_factory=list)
    """The sources searched."""
    query_seqs: list[int] = Field(default_factory=list)
    """The record seqs the query's words came from (a reader withholds the query when one is private)."""


class CardRejected(_Payload):
    kind: Literal["card_rejected"]
    depth: int
    reason: str
    """Not shorter than its source, over 3× its target, or a value its source does not hold."""
    attempt: int
    text: str
    target_tokens: int


class FoldQueued(_Payload):
    kind: Literal["fold_queued"]
    pressure: int
    budget: int
    reason: str


class DistillationQueued(_Payload):
    """A recap or compaction due at its watermark in an interactive run: written between
    turns, while the user types (or by ``loomrt worker`` once the chat has closed)."""

    kind: Literal["distillation_queued"]
    mode: str
    pressure: int
    budget: int


class FoldSkippedPayload(_Payload):
    kind: Literal["fold_skipped"]
    reason: str
    error: str
    failures: int
    """Consecutive failed folds; at 5 folding pauses until ``paused_until``."""
    paused_until: float | None = None


class HarvestBanked(_Payload):
    kind: Literal["harvest_banked"]
    distillation_seq: int
    """The distillation whose evicted span this is."""
    outcome: Literal["banked", "already_banked", "empty", "refused"]
    """banked; already banked (the same key); empty (no conversation in it: counted, not
    banked); refused (over context.harvest_max_tokens: never truncated)."""
    scope: str
    """The durable-memory scope its facts will go to (``user:alice``)."""
    turns: int
    redacted: int = 0
    """Secrets replaced by ``[redacted secret]`` before banking."""
    tokens: int | None = None
    reason: str | None = None


class HarvestError(_Payload):
    kind: Literal["harvest_error"]
    message: str
    """What is misconfigured and what to do (recorded once per run, the first time it is hit)."""


class RunQueued(_Payload):
    kind: Literal["run_queued"]
    by: str | None = None
    """Who queued it (``loomrt run --detach``): a run waiting, with its input recorded, for any
    ``loomrt worker`` to claim and play it (its status is ``queued`` until one does)."""


PAYLOADS: tuple[type[_Payload], ...] = (
    RunStarted,
    UserInput,
    ModelCall,
    AssistantMessage,
    ToolCallPayload,
    ToolResult,
    StateUpdate,
    PatchRejected,
    SchemaProposed,
    Distillation,
    DistillationDeclined,
    SummaryRejected,
    Retry,
    CallbackError,
    ToolSourceError,
    SpawnChildStarted,
    SpawnChildResult,
    Notice,
    Parked,
    Resumed,
    Error,
    Final,
    Cancelled,
    PinPayload,
    UnpinPayload,
    MarkPrivate,
    Declassify,
    CardRejected,
    FoldQueued,
    DistillationQueued,
    FoldSkippedPayload,
    HarvestBanked,
    HarvestError,
    RunQueued,
    RecallInjected,
)

EventPayload = Annotated[
    RunStarted
    | UserInput
    | ModelCall
    | AssistantMessage
    | ToolCallPayload
    | ToolResult
    | StateUpdate
    | PatchRejected
    | SchemaProposed
    | Distillation
    | DistillationDeclined
    | SummaryRejected
    | Retry
    | CallbackError
    | ToolSourceError
    | SpawnChildStarted
    | SpawnChildResult
    | Notice
    | Parked
    | Resumed
    | Error
    | Final
    | Cancelled
    | PinPayload
    | UnpinPayload
    | MarkPrivate
    | Declassify
    | CardRejected
    | FoldQueued
    | DistillationQueued
    | FoldSkippedPayload
    | HarvestBanked
    | HarvestError
    | RunQueued
    | RecallInjected,
    Field(discriminator="kind"),
]
"""Any event's payload, tagged by its ``kind``."""

_ADAPTER: TypeAdapter[Any] = TypeAdapter(EventPayload)


def check_payload(kind: str, data: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the kind and the key when ``data`` is not a valid payload."""
    try:
        _ADAPTER.validate_python({**data, "kind": kind})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"][1:]) or "(payload)"
        raise ValueError(f"a {kind} event's payload is invalid at {where}: {err['msg']}") from None


def events_json_schema() -> dict[str, Any]:
    """The JSON Schema of an event payload (one branch per kind)."""
    schema = _ADAPTER.json_schema(by_alias=True)
    schema["title"] = "loomrt event payload"
    return schema
