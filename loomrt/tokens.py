"""Token estimates for the working context, cached per message.

Messages are immutable, so each one is counted once. The encoding is cl100k_base from
the file litellm ships (what litellm's token counter uses for models it has no tokenizer
for); if it cannot be loaded, a characters/4 estimate stands in.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from loomrt.messages import Message

__all__ = ["count_messages", "count_text", "count_tools", "cut_text", "MESSAGE_OVERHEAD", "count_dicts"]

MESSAGE_OVERHEAD = 4
"""Tokens a chat template adds around each message (role markers)."""


@lru_cache(maxsize=1)
def _encoding() -> Any:
    """cl100k_base from the copy litellm ships (litellm's own token counter uses the same
    file), loaded without importing litellm itself (a multi-second import)."""
    try:
        import importlib.util
        import os

        import tiktoken

        spec = importlib.util.find_spec("litellm")
        if spec and spec.submodule_search_locations:
            bundled = os.path.join(list(spec.submodule_search_locations)[0], "litellm_core_utils", "tokenizers")
            os.environ.setdefault("TIKTOKEN_CACHE_DIR", bundled)
        return tiktoken.get_encoding("cl100k_base")
    except Exception:  # noqa: BLE001 - any failure falls back to the estimate
        return None


@lru_cache(maxsize=65536)
def count_text(text: str) -> int:
    """Tokens in ``text`` (cl100k_base, model-independent so figures are comparable)."""
    if not text:
        return 0
    enc = _encoding()
    if enc is not None:
        return len(enc.encode(text, disallowed_special=()))
    return max(1, len(text) // 4)


def cut_text(text: str, limit: int) -> str:
    """The longest start of ``text`` (cut at a line or word end where one is near) that
    fits ``limit`` tokens."""
    if count_text(text) <= limit:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # the longest prefix that fits, by bisection on characters
        mid = (lo + hi + 1) // 2
        if count_text(text[:mid]) <= limit:
            lo = mid
        else:
            hi = mid - 1
    head = text[:lo]
    for sep in ("\n", " "):
        at = head.rfind(sep)
        if at > lo * 0.8:
            return head[:at]
    return head


def count_tools(tools: Any) -> int:
    """Tokens the tool schemas sent with a call take (name, description, parameters)."""
    total = 0
    for t in tools:
        total += count_text(f"{t.name} {t.description} {json.dumps(t.parameters, sort_keys=True)}") + 8
    return total


def _message_key(m: Message) -> str:
    calls = [(c.name, json.dumps(c.arguments, sort_keys=True)) for c in m.tool_calls]
    return f"{m.role}\x00{m.content}\x00{calls}"


@lru_cache(maxsize=65536)
def _count_key(key: str) -> int:
    return count_text(key.split("\x00", 1)[1]) + MESSAGE_OVERHEAD


def count_messages(messages: list[Message] | tuple[Message, ...]) -> int:
    """The estimated prompt size of ``messages`` in tokens."""
    return sum(_count_key(_message_key(m)) for m in messages) + 3


def count_dicts(messages: list[dict[str, Any]]) -> int:
    """The same estimate for messages already in litellm format."""
    return count_messages(
        [
            Message.from_dict(
                {
                    **m,
                    "tool_calls": [
                        {
                            "id": tc.get("id", ""),
                            "name": tc["function"]["name"],
                            "arguments": _loads(tc["function"].get("arguments")),
                        }
                        for tc in m.get("tool_calls") or []
                    ],
                }
            )
            for m in messages
        ]
    )


def _loads(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        out = json.loads(raw or "{}")
        return out if isinstance(out, dict) else {"value": out}
    except (TypeError, ValueError):
        return {"raw": str(raw)}
