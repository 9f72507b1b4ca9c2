"""stateful: a JSON-Schema-validated state Σ plus the last observation O is all that survives.

The model's only way to act is the ``emit_state`` tool::

    {reasoning, patch, action?: {tool, arguments}, done?, final?, propose_schema?}

``patch`` is an RFC 7386 JSON merge-patch on Σ; the result is validated against
``context.state_schema`` (the full schema, ``required`` included). An invalid patch is
shown back to the model with the validation error and retried up to
``max_patch_retries``; ``on_invalid_patch: fail`` fails at once. ``propose_schema`` is
recorded, never applied. Each boundary keeps only system, the pinned task, Σ and O (and, in an interactive
run, the input of the turn in progress, until that turn ends).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jsonschema

from loomrt.errors import StateError
from loomrt.events import Event
from loomrt.messages import Message, ToolCall
from loomrt.providers.base import ModelResponse, ToolSchema
from loomrt.run.reducers.base import Reduction, RetentionMode
from loomrt.run.splice import splice
from loomrt.run.steps import AskAgain, FinalOutput, NextStep, RunTools
from loomrt.tokens import count_text
from loomrt.visibility import withhold

if TYPE_CHECKING:
    from loomrt.run.projection import RunView
    from loomrt.run.state import RunState

__all__ = [
    "StatefulMode",
    "StatefulSlot",
    "state_share",
    "merge_patch",
    "validate_state",
    "initial_state",
    "emit_state_schema",
    "STATEFUL_PROMPT",
]

EMIT_STATE = "emit_state"

STATEFUL_PROMPT = (
    "You act only by calling the emit_state tool. Each call gives your reasoning, a JSON "
    "merge-patch (RFC 7386) on your state, optionally an action {{tool, arguments}} to run one "
    "tool, and done: true with final (your answer) when the task is finished. After each step "
    "you see only your state and the last observation, so keep in the state everything you "
    "need later. The state must validate against this JSON Schema:\n{schema}\n"
    "The state starts as: {initial}"
)


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge-patch (``null`` deletes a key); ``target`` is untouched."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def validate_state(state: Any, schema: dict[str, Any]) -> str | None:
    """None if ``state`` is valid, else one readable line per problem."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(state), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    lines = []
    for e in errors[:5]:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        lines.append(f"at {where}: {e.message}")
    return "; ".join(lines)


def initial_state(schema: dict[str, Any]) -> dict[str, Any]:
    """Σ before the first patch: the schema's property defaults."""
    props = schema.get("properties") or {}
    return {k: copy.deepcopy(v["default"]) for k, v in props.items() if isinstance(v, dict) and "default" in v}


def emit_state_schema(state_schema: dict[str, Any], tool_names: list[str], *, propose: bool = False) -> dict[str, Any]:
    """The parameters of emit_state; ``patch`` follows Σ's properties (all optional).

    ``propose_schema`` is offered only when ``propose`` (``context.propose_schema``) is on:
    small models under a grammar fill an offered optional object with noise on every step.
    """
    patch: dict[str, Any] = {"type": "object", "description": "JSON merge-patch on the state"}
    if state_schema.get("properties"):
        patch["properties"] = copy.deepcopy(state_schema["properties"])
    properties: dict[str, Any] = {"reasoning": {"type": "string"}, "patch": patch}
    if tool_names:
        properties["action"] = {
            "type": "object",
            "properties": {"tool": {"type": "string", "enum": tool_names}, "arguments": {"type": "object"}},
            "required": ["tool"],
        }
    properties |= {"done": {"type": "boolean"}, "final": {"type": "string"}}
    if propose:
        properties["propose_schema"] = {"type": "object"}
    # in the order a grammar has the model write them: its reasoning, the patch, the action,
    # and only then whether it is done
    return {"type": "object", "properties": properties, "required": ["reasoning", "patch"]}


@dataclass
class StatefulSlot:
    """Stateful mode's own state on the run: Σ and the attempts at the current patch."""

    state: dict[str, Any] | None = None
    patch_failures: int = 0
    private_keys: set[str] = field(default_factory=set)
    """Σ's keys written from private material (:mod:`loomrt.visibility`)."""


class StatefulMode(RetentionMode):
    name = "stateful"

    def new_slot(self) -> StatefulSlot:
        return StatefulSlot()

    def state_of(self, slot: Any) -> dict[str, Any] | None:
        return slot.state if isinstance(slot, StatefulSlot) else None

    def replay(self, event: Event, view: RunView) -> None:
        slot: StatefulSlot = view.slot
        if event.kind == "state_update":
            slot.state, slot.patch_failures = event.data["state"], 0
            slot.private_keys = (slot.private_keys | set(event.data.get("private_keys") or ())) & set(slot.state or {})
        elif event.kind == "patch_rejected":
            slot.patch_failures = event.data.get("attempt", slot.patch_failures + 1)
            if event.data.get("feedback"):  # shown as a user message: there was no call to answer
                view.push(Message(role="user", content=event.data["feedback"], synthetic="feedback"))

    def system_lines(self, spec: Any) -> list[str]:
        schema = spec.context.state_schema or {"type": "object"}
        return [STATEFUL_PROMPT.format(schema=json.dumps(schema), initial=json.dumps(initial_state(schema)))]

    async def unanswered_calls(self, run: RunState, calls: list[ToolCall]) -> list[ToolCall]:
        """An accepted emit_state whose action had not returned: the action is the call to settle
        (it runs under the emit's id); a rejected or done one was answered in its own step."""
        if not any(c.name == EMIT_STATE for c in calls):
            return calls
        updates = await run.store.read(run.run_id, kinds=["state_update", "assistant_message"])
        last = updates[-1] if updates else None
        update = last.data if last is not None and last.kind == "state_update" else {}
        action = update.get("action")
        if not (action and action.get("tool") and not update.get("done")):
            return calls
        name, arguments = str(action["tool"]), dict(action.get("arguments") or {})
        return [ToolCall(id=c.id, name=name, arguments=arguments) if c.name == EMIT_STATE else c for c in calls]

    def offered_tools(self, run: RunState) -> tuple[ToolSchema, ...]:
        ctx = run.spec.context
        schema = emit_state_schema(ctx.state_schema or {}, sorted(run.toolset.tools), propose=ctx.propose_schema)
        return (ToolSchema(EMIT_STATE, "Update your state and optionally act or finish.", schema),)

    def tool_choice(self, run: RunState) -> str:
        return "required"

    def response_schema(self, run: RunState) -> dict[str, Any] | None:
        return self.offered_tools(run)[0].parameters

    def should_distil(self, run: RunState) -> bool:
        # every completed step, and every new turn, is a boundary: Σ and O are all that survive
        return bool(_plan(run)[2]) and len(run.context) != run.view.declined_at

    async def interpret(self, run: RunState, response: ModelResponse) -> NextStep:
        emit = next((c for c in response.tool_calls if c.name == EMIT_STATE), None)
        message = Message(role="assistant", content=response.text, tool_calls=(emit,) if emit else ())
        await run.add("assistant_message", {"message": message.to_dict()})
        if emit is None:
            return await self._reject(run, None, "you must act by calling emit_state (reasoning, patch, ...)")
        args = emit.arguments
        patch = args.get("patch", {})
        if not isinstance(patch, dict):
            return await self._reject(run, emit, f"patch must be a JSON object, got {type(patch).__name__}")
        schema = run.spec.context.state_schema or {"type": "object"}
        new_state = merge_patch(run.state if run.state is not None else initial_state(schema), patch)
        problem = validate_state(new_state, schema)
        if problem:
            return await self._reject(run, emit, f"the patched state is invalid: {problem}", patch=patch)
        size, share = count_text(json.dumps(new_state, ensure_ascii=False)), state_share(run)
        if size > share:
            return await self._reject(
                run,
                emit,
                (
                    f"the patched state would be {size} tokens, over its share of the budget ({share} tokens, "
                    "context.stateful.state_max_tokens). Keep only what you need later: shorten or remove entries "
                    "(a null deletes a key)"
                ),
                patch=patch,
            )
        action = args.get("action") if isinstance(args.get("action"), dict) else None
        # the step's prompt held private material: a private message, or Σ's private keys (Σ is in every
        # prompt), or a recalled passage (the block this step's call sent; its model_call is written with the step)
        block = run.view.injection
        recalled = (
            {s for p in block[2] if p.get("source") != "memory" for s in (p.get("seq"), p.get("before_seq"))}
            if block
            else set(run.view.injection_sent)
        )
        exposed = bool(run.view.slot.private_keys or recalled & run.view.private) or any(
            m.seq in run.view.private for m in run.context if m.seq is not None
        )
        await run.add(
            "state_update",
            {
                "state": new_state,
                "patch": patch,
                "reasoning": args.get("reasoning", ""),
                "action": action,
                "done": bool(args.get("done")),
                **({"private_keys": sorted(patch)} if exposed and patch else {}),
            },
        )
        if run.spec.context.propose_schema and isinstance(args.get("propose_schema"), dict) and args["propose_schema"]:
            await run.add("schema_proposed", {"schema": args["propose_schema"], "note": "recorded, never applied"})
        if args.get("done"):
            await self._observe(run, emit, "State accepted. Done.")
            final = args.get("final")
            if final is not None:
                return FinalOutput(str(final))
            shown, _ = withhold(new_state, run.view.slot.private_keys)  # the output is Σ as the run hands it out
            return FinalOutput(json.dumps(shown, ensure_ascii=False))
        if action and action.get("tool"):
            return RunTools(
                (ToolCall(id=emit.id, name=str(action["tool"]), arguments=dict(action.get("arguments") or {})),)
            )
        await self._observe(run, emit, "State accepted.")
        return AskAgain()

    async def _observe(self, run: RunState, emit: ToolCall, content: str, *, is_error: bool = False) -> None:
        await run.add(
            "tool_result", {"tool_call_id": emit.id, "name": EMIT_STATE, "content": content, "is_error": is_error}
        )

    async def _reject(self, run: RunState, emit: ToolCall | None, error: str, patch: Any = None) -> NextStep:
        attempt = run.view.slot.patch_failures + 1
        spec = run.spec.context
        fails = spec.on_invalid_patch == "fail" or attempt > spec.max_patch_retries
        feedback = f"Rejected: {error}. Call emit_state again with a corrected patch."
        data: dict[str, Any] = {"patch": patch, "error": error, "attempt": attempt}
        if emit is None and not fails:
            data["feedback"] = feedback
        await run.add("patch_rejected", data)
        if fails:
            raise StateError(
                f"stateful mode: {error} (after {attempt} attempt(s); on_invalid_patch="
                f"{spec.on_invalid_patch}, max_patch_retries={spec.max_patch_retries}). "
                "Fix the state_schema or the prompt, or raise max_patch_retries.",
                run_id=run.run_id,
            )
        if emit is not None:
            await self._observe(run, emit, feedback, is_error=True)
        return AskAgain()

    async def reduce(self, run: RunState) -> Reduction | None:
        head, current, span, last = _plan(run)
        if not span:
            return None
        state = run.state if run.state is not None else initial_state(run.spec.context.state_schema or {})
        sigma = Message(
            role="user", content=f"Your state Σ:\n{json.dumps(state, ensure_ascii=False)}", synthetic="state"
        )
        kept = [current] if current is not None else []
        if last is not None:
            content = last.content if last.synthetic else f"Last observation ({last.name or 'tool'}):\n{last.content}"
            kept.append(Message(role="user", content=content, synthetic="observation", seq=last.seq))
        return Reduction(context=[*head, sigma, *kept], evicted=span, payload={"state": state})


def state_share(run: RunState) -> int:
    """The most tokens Σ may take: ``context.stateful.state_max_tokens``, else half the budget."""
    return run.spec.context.stateful.state_max_tokens or run.budget // 2


def _plan(run: RunState) -> tuple[list[Message], Message | None, list[Message], Message | None]:
    """(head, the input of the turn in progress, the evictable span, the source of O).

    The turn's input stays until the turn ends (the pinned task is in the head); O is the
    last message when it is a tool result or feedback, not the input itself.
    """
    cut = splice(run.context, keep_last_n=0)
    current = next((m for m in reversed(cut.middle) if m.role == "user" and m.synthetic is None), None)
    last = run.context[-1] if run.context and run.context[-1] is not current else None
    if last is not None and (last.role != "tool" and last.synthetic != "feedback"):
        last = None
    span = [m for m in cut.middle if m.synthetic is None and m is not current]
    return cut.head, current, span, last
