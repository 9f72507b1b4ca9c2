"""Tool use without native tool calling: a grammar-constrained JSON decision.

Small local models call tools unreliably (llama-cpp-python's ``chatml-function-calling``
with ``tool_choice="auto"`` never returns tool calls; Qwen writes the call as plain
text). For models whose capabilities say ``tool_calling: false``, the gateway instead asks
for exactly one JSON object that follows a schema (llama.cpp turns the schema into a
grammar, so the model cannot write anything else)::

    {"action": "<tool name>", "arguments": {...}}    call a tool (arguments follow its schema)
    {"action": "answer", "text": "..."}              answer in plain text

and translates it back into ordinary tool calls or text, so the run loop never knows.
``tool_choice="required"`` leaves out the ``answer`` branch. Stateful mode's ``emit_state``
goes through the same path: its arguments follow the emit_state parameters schema, so a
local stateful run cannot emit malformed JSON.

The history is rewritten for such models: an assistant's earlier tool calls become the
JSON decision it wrote, and tool results become user messages ("Result of calculate: 391"),
since small models' chat templates rarely know the ``tool`` role.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from loomrt.errors import ProviderError
from loomrt.messages import ToolCall
from loomrt.providers.base import ModelRequest, ToolSchema

__all__ = [
    "ANSWER",
    "ANSWER_NOW",
    "decision_schema",
    "decision_instructions",
    "plain_history",
    "parse_decision",
    "parse_json_reply",
    "unwrap_answer",
]

ANSWER = "answer"

ANSWER_NOW = {"role": "user", "content": "Now write that answer to me as plain text, not JSON."}
"""After a decision to answer, what asks for the answer itself: appended to the decision's
own prompt, so that the second call of the turn re-reads nothing the first one read."""


def decision_schema(tools: tuple[ToolSchema, ...], *, required: bool, answer_text: bool = True) -> dict[str, Any]:
    """The JSON Schema of one decision: a tool call per tool, plus ``answer`` unless ``required``.

    With ``answer_text=False`` the answer branch is only ``{"action": "answer"}``: the model
    decides, and writes the answer afterwards as free text under its own limit.
    """
    branches: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {"action": {"const": t.name}, "arguments": _object_schema(t.parameters)},
            "required": ["action", "arguments"],
        }
        for t in tools
    ]
    if not required or not tools:
        answer: dict[str, Any] = {"type": "object", "properties": {"action": {"const": ANSWER}}, "required": ["action"]}
        if answer_text:
            answer["properties"]["text"] = {"type": "string"}
            answer["required"].append("text")
        branches.append(answer)
    return branches[0] if len(branches) == 1 else {"oneOf": branches}


def _object_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    schema = dict(parameters or {})
    schema.setdefault("type", "object")
    return schema


def decision_instructions(
    tools: tuple[ToolSchema, ...], *, required: bool, answer_text: bool = True, one_call: bool = False
) -> str:
    """The system-prompt text that tells the model about its tools and the decision format;
    ``one_call``: a tool call as JSON, or else the answer itself as plain text."""
    lines = ["You can use these tools:"]
    for t in tools:
        lines.append(f"- {t.name}: {t.description} Arguments (JSON Schema): {json.dumps(t.parameters)}")
    if one_call and not required:
        lines.append(
            'To call a tool, reply with exactly one JSON object: {"action": "<tool name>", "arguments": {...}}'
        )
        lines.append("Otherwise write your answer to the user as plain text, not JSON.")
        lines.append("Call a tool when you need its result; answer when you have what you need.")
        return "\n".join(lines)
    lines.append("Reply with exactly one JSON object and nothing else.")
    lines.append('To call a tool: {"action": "<tool name>", "arguments": {...}}')
    if required:
        lines.append("You must call a tool.")
    else:
        if answer_text:
            lines.append('To answer the user: {"action": "answer", "text": ...} with your reply as the text.')
        else:
            lines.append('To answer the user: {"action": "answer"}; you then write the answer itself as plain text.')
        lines.append("Call a tool when you need its result; answer when you have what you need.")
    return "\n".join(lines)


def plain_history(messages: list[dict[str, Any]], instructions: str | None = None) -> list[dict[str, Any]]:
    """``messages`` without the ``tool`` role or ``tool_calls``, for models that lack them.

    ``instructions`` are appended to the system message (one is added if there is none).
    Consecutive messages of the same role are merged (some chat templates insist on
    alternating roles).
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "tool":
            role, content = "user", f"Result of {m.get('name') or 'the tool'}:\n{content}"
        elif role == "assistant" and m.get("tool_calls"):
            decisions = [_decision_text(tc) for tc in m["tool_calls"]]
            content = "\n".join([content, *decisions]) if content else "\n".join(decisions)
        if out and out[-1]["role"] == role and role != "system":
            out[-1] = {"role": role, "content": f"{out[-1]['content']}\n\n{content}"}
        else:
            out.append({"role": role, "content": content})
    if instructions:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{instructions}".strip()}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out


def _decision_text(tool_call: dict[str, Any]) -> str:
    fn = tool_call.get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        args = fn.get("arguments")
    return json.dumps({"action": fn.get("name"), "arguments": args}, ensure_ascii=False)


def parse_json_reply(text: str, *, model: str, finish_reason: str | None, max_tokens: int) -> Any:
    """The JSON value a constrained reply holds; a clear :class:`ProviderError` if it has none.

    A model without a grammar may wrap the object in prose or a code fence; the outermost
    ``{...}`` is then used. A reply cut off by ``max_tokens`` is not retryable (the same limit cuts it off again:
    raise ``max_tokens``). Any other invalid JSON is retryable (a fresh sample usually
    fixes it, and without a grammar a model can stray).
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ProviderError(f"{model}: the reply nests too deeply to read: {text[:200]!r}", retryable=True) from None
    except ValueError as exc:
        start, end = text.find("{"), text.rfind("}")
        if 0 <= start < end and finish_reason != "length":  # a model without a grammar may fence its JSON
            try:
                return json.loads(text[start : end + 1])
            except (ValueError, RecursionError):
                pass
        if finish_reason == "length":
            raise ProviderError(
                f"{model}: the JSON reply was cut off at max_tokens={max_tokens} and is incomplete. "
                "Raise max_tokens in the agent definition (a JSON reply needs room to close).",
                retryable=False,
            ) from None
        raise ProviderError(f"{model}: the reply is not valid JSON ({exc}): {text[:200]!r}", retryable=True) from None


def parse_decision(
    text: str, request: ModelRequest, *, model: str, finish_reason: str | None
) -> tuple[str, tuple[ToolCall, ...]]:
    """Translate a decision reply into (text, tool calls) for the run loop."""
    value = parse_json_reply(text, model=model, finish_reason=finish_reason, max_tokens=request.max_tokens)
    names = {t.name for t in request.tools}
    action = value.get("action") if isinstance(value, dict) else None
    if action == ANSWER and request.tool_choice != "required":
        return str(value.get("text") or ""), ()
    if action in names:
        args = value.get("arguments")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ProviderError(f"{model}: the arguments for {action} are not a JSON object: {args!r}", retryable=True)
        return "", (ToolCall(id=f"call_{secrets.token_hex(6)}", name=action, arguments=args),)
    allowed = sorted(names) + ([] if request.tool_choice == "required" else [ANSWER])
    raise ProviderError(
        f"{model}: the decision names action {action!r}, expected one of {allowed}: {text[:200]!r}", retryable=True
    )


def unwrap_answer(text: str) -> str | None:
    """An answer written as plain text, even by a model that wrote its decision again with
    the answer in it (``{"action": "answer", "text": "..."}``): the text inside; None when
    the reply is only a decision again (no answer in it)."""
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        try:
            value = json.loads(stripped)
        except ValueError:
            return text
        if isinstance(value, dict) and "action" in value:
            answer = value.get("text")
            return str(answer) if isinstance(answer, str) and answer.strip() else None
    return text
