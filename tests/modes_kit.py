"""Helpers shared by the retention-mode tests (test_modes.py, test_stateful.py)."""

from __future__ import annotations

import json

from spine_kit import events, runtime, tool_call, write

from loomrt import load_agents

SCHEMA = {
    "type": "object",
    "properties": {
        "step": {"type": "integer"},
        "notes": {"type": "object"},
        "found": {"type": "array", "items": {"type": "string"}, "default": []},
    },
    "required": ["step"],
}


# Scripted accounts that are about their spans (the prose check rejects one that is not):
S1 = "S1: the assistant used calculate on each expression."
S2 = "S2: again the assistant used calculate on each expression."
R1 = "R1: I used calculate on each expression of the task."
R2 = "R2: I used calculate on each expression again."


def agent(tmp_path, context=None, **fields):
    """One agent 'a', written to agents.yaml and loaded from there."""
    body = {"model": "scripted/unused.yaml", "system_prompt": "You are careful.", "tools": ["calculate"], **fields}
    if context is not None:
        body["context"] = context
    path = write(tmp_path, "agents.yaml", json.dumps({"agents": {"a": body}}))
    return load_agents(path).agents["a"]


def calc(n: int, usage: int | None = None) -> dict:
    return tool_call("calculate", usage=usage, expression=f"{n}+{n}")


def emit(patch, **kw) -> dict:
    return {"emit_state": {"reasoning": "thinking", "patch": patch, **kw}}


def start(tmp_path, spec, provider, **kw):
    rt = runtime(tmp_path, provider, **kw)
    return rt, rt.start(spec, name="a")


def distillations(rt, run_id):
    return [e.data for e in events(rt, run_id, "distillation")]


def request_contents(request) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in request.messages]


def turn_requests(provider):
    return [c for c in provider.calls if c.purpose == "turn"]
