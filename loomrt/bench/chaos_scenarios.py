"""The chaos harness's scenarios: scripted agents covering every mode, and what a user sends them.

:func:`write_scenarios` writes their agents file, scripts and the file their tools read;
:mod:`loomrt.bench.chaos` plays them and kills them, and :mod:`loomrt.bench.chaos_checks`
checks what is left.
"""

from __future__ import annotations

import json
import random
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = ["Scenario", "SCENARIOS", "CHAT_INPUTS", "TASK", "write_scenarios"]


@dataclass(frozen=True)
class Scenario:
    """One scripted agent and what a user sends it."""

    agent: str
    interactive: bool
    inputs: tuple[str, ...]
    consolidate: bool = False
    """Harvest: after the chat, a consolidator process drains the banked spans (the echo
    extractor), and the recovered run's bank and durable memory must equal the uninterrupted one's."""
    fork: tuple[int, int] | None = None
    """A fork ``(AT, PARENT)``: the parent chats the first PARENT inputs; ``loomrt runs fork
    --at`` forks it at its answer to input AT; the fork goes on with the other inputs, one
    ``loomrt runs continue`` each. The fork is the run that is checked."""

    @property
    def own_inputs(self) -> tuple[str, ...]:
        """The inputs of the run that is checked: the fork's, where there is one."""
        return self.inputs[self.fork[1] :] if self.fork else self.inputs

    @property
    def parent_inputs(self) -> tuple[str, ...]:
        """The inputs the scenario's first run is sent: all of them, or the parent's before a fork."""
        return self.inputs[: self.fork[1]] if self.fork else self.inputs


_TOPICS = [
    "the harbour bridge repairs",
    "the spring budget",
    "the library move",
    "the night-bus timetable",
    "the school garden",
    "the clinic rota",
    "the new bakery",
    "the river clean-up",
]


def _chat_inputs(n: int) -> tuple[str, ...]:
    rng = random.Random(5)
    out = []
    for i in range(n):
        a, b = rng.sample(_TOPICS, 2)
        out.append(
            f"Update {i + 1}: {a} needs another look and {b} is nearly settled; the reference for "
            f"today is REF-{1000 + 37 * i}. Please keep track of it, since we will come back to it "
            f"after the weekend, once {a} has been discussed with everyone involved."
        )
    return tuple(out)


CHAT_INPUTS = _chat_inputs(8)
TASK = "Read the incident notes in notes.txt, compute the totals, and report."

SCENARIOS = [
    Scenario("chat-recap", True, CHAT_INPUTS),
    Scenario("chat-compaction", True, CHAT_INPUTS),
    Scenario("chat-append", True, CHAT_INPUTS),
    Scenario("chat-pins", True, CHAT_INPUTS),
    Scenario("chat-fold", True, CHAT_INPUTS),
    Scenario("chat-harvest", True, CHAT_INPUTS, consolidate=True),
    Scenario("fork-fold", True, CHAT_INPUTS, fork=(3, 5)),
    Scenario("tools-compaction", False, (TASK,)),
    Scenario("tools-stateful", False, (TASK,)),
    Scenario("tools-mcp", False, (TASK,)),
    Scenario("fanout-stateful", False, ("Check the four stations and merge what they found.",)),
]
"""Every mode is covered: recap, compaction, fold and append with the backstop in a chat
(and recap banking its spans for a consolidator process: harvest); a fold chat forked
part way, whose fork goes on in processes of its own (and folds again);
compaction and stateful in a one-shot run with tools (a large tool result, a calculation);
compaction with the tools of an MCP server (a tool source, its own process); and a stateful
parent fanning out to four stateful children whose Σ it merges (the spawn ledger)."""


def write_scenarios(folder: Path) -> Path:
    """The scenarios' agents file, scripts and the file their tools read; the agents file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    notes = "\n".join(
        f"note {i}: the pump at station {i % 7} reported {10 + i} litres per minute at {i:02d}:15." for i in range(60)
    )
    (folder / "notes.txt").write_text(notes + "\n", encoding="utf-8")
    replies = "\n".join(f'  - text: "Noted update {i + 1}; I will keep its reference in mind."' for i in range(8))
    (folder / "chat.yaml").write_text(f"turns:\n{replies}\nsummaries:\n  - extractive: 500\n", encoding="utf-8")
    pin = '  - tool_call: {name: Pin, arguments: {text: "The user keeps every reference; the pump audit is due at 16:00.", reason: "a decision"}}'
    (folder / "pins.yaml").write_text(f"turns:\n{pin}\n{replies}\nsummaries:\n  - extractive: 500\n", encoding="utf-8")
    path = json.dumps(str((folder / "notes.txt").resolve()))
    (folder / "tools.yaml").write_text(
        textwrap.dedent("""\
        turns:
          - tool_call: {name: read_file, arguments: {path: NOTES}}
          - tool_call: {name: calculate, arguments: {expression: "10 + 11 + 12"}}
          - tool_call: {name: read_file, arguments: {path: NOTES}}
          - tool_call: {name: calculate, arguments: {expression: "33 * 2"}}
          - text: "The pumps reported 33 litres in the first three notes, 66 over two readings."
        summaries:
          - extractive: 400
        """).replace("NOTES", path),
        encoding="utf-8",
    )
    (folder / "state.yaml").write_text(
        textwrap.dedent("""\
        turns:
          - emit_state:
              reasoning: Read the notes first.
              patch: {step: 1, facts: []}
              action: {tool: read_file, arguments: {path: NOTES}}
          - emit_state:
              reasoning: The first three notes give 10, 11 and 12.
              patch: {step: 2, facts: ["10 + 11 + 12"]}
              action: {tool: calculate, arguments: {expression: "10 + 11 + 12"}}
          - emit_state:
              reasoning: Check the doubled total.
              patch: {step: 3, facts: ["10 + 11 + 12", "33 * 2"]}
              action: {tool: calculate, arguments: {expression: "33 * 2"}}
          - emit_state:
              reasoning: Done.
              patch: {step: 4}
              done: true
              final: "33 litres over the first three notes; 66 doubled."
        summaries:
          - extractive: 400
        """).replace("NOTES", path),
        encoding="utf-8",
    )
    (folder / "mcp.yaml").write_text(
        textwrap.dedent("""\
        turns:
          - tool_call: {name: mcp__notes__read_notes, arguments: {}}
          - tool_call: {name: mcp__notes__add, arguments: {numbers: [10, 11, 12]}}
          - tool_call: {name: mcp__notes__read_notes, arguments: {}}
          - tool_call: {name: mcp__notes__add, arguments: {numbers: [33, 33]}}
          - text: "The pumps reported 33 litres in the first three notes, 66 over two readings."
        summaries:
          - extractive: 400
        """),
        encoding="utf-8",
    )
    (folder / "fanout.yaml").write_text(
        json.dumps(
            {
                "turns": [
                    {
                        "emit_state": {
                            "reasoning": "Ask every station.",
                            "patch": {"step": 1},
                            "action": {
                                "tool": "parallel_spawn",
                                "arguments": {
                                    "spawns": [{"agent": "station", "prompt": f"Check station {i}."} for i in range(4)]
                                },
                            },
                        }
                    },
                    {
                        "emit_state": {
                            "reasoning": "Merged.",
                            "patch": {"step": 2},
                            "done": True,
                            "final": "All four stations checked.",
                        }
                    },
                ]
            }
        ),
        encoding="utf-8",
    )
    (folder / "station.yaml").write_text(
        json.dumps(
            {
                "turns": [
                    {
                        "emit_state": {
                            "reasoning": "Read the notes.",
                            "patch": {"step": 1},
                            "action": {
                                "tool": "read_file",
                                "arguments": {"path": str((folder / "notes.txt").resolve())},
                            },
                        }
                    },
                    {
                        "emit_state": {
                            "reasoning": "Sum them.",
                            "patch": {"step": 2},
                            "action": {"tool": "calculate", "arguments": {"expression": "10 + 11 + 12"}},
                        }
                    },
                    {
                        "emit_state": {
                            "reasoning": "Done.",
                            "patch": {"facts": ["33 litres"]},
                            "done": True,
                            "final": "33 litres",
                        }
                    },
                ],
                "summaries": [{"extractive": 300}],
            }
        ),
        encoding="utf-8",
    )
    notes_server = {
        "name": "notes",
        "command": sys.executable,
        "private": True,
        "args": ["-m", "loomrt.bench.notes_server", str((folder / "notes.txt").resolve())],
    }
    chat = {"model": "scripted/chat.yaml", "system_prompt": "You keep track of what the user tells you."}
    tools = {
        "system_prompt": "You investigate incidents with tools.",
        "tools": ["read_file", "calculate"],
        "max_iterations": 12,
    }
    small = {"budget_tokens": 700, "keep_last_n": 2, "recall": True}
    schema = {
        "type": "object",
        "properties": {"step": {"type": "integer"}, "facts": {"type": "array", "items": {"type": "string"}}},
    }
    agents = {
        # recall injection on (its reserve off the small budget): a kill between the
        # recall_injected event and its call is among the planned ones
        "chat-recap": {
            **chat,
            "context": {
                "mode": "recap",
                **small,
                "budget_tokens": 1000,
                "recall_inject": "on",
                "recall_inject_tokens": 250,
            },
        },
        "chat-compaction": {**chat, "context": {"mode": "compaction", **small}},
        "chat-append": {**chat, "context": {"mode": "append", "backstop": True, **small}},
        "chat-pins": {**chat, "model": "scripted/pins.yaml", "context": {"mode": "recap", "model_pins": True, **small}},
        # folds only at the hard watermark, in the turn: when a soft fold runs depends on the
        # clock (cache-idle deferral, the chat's between-turns thread), and every kill is
        # compared with an uninterrupted run
        "chat-harvest": {
            **chat,
            "context": {"mode": "recap", **small, "harvest_to_memory": True, "memory_scopes": ["user"]},
        },
        "chat-fold": {
            **chat,
            "context": {
                "mode": "fold",
                **small,
                "budget_tokens": 1100,
                "fold": {"keep_recent": 4, "leaf_min_messages": 4, "soft_pct": 100, "hard_pct": 100},
            },
        },
        "fork-fold": {
            **chat,
            "context": {
                "mode": "fold",
                **small,
                "budget_tokens": 1100,
                "fold": {"keep_recent": 4, "leaf_min_messages": 4, "soft_pct": 100, "hard_pct": 100},
            },
        },
        "tools-compaction": {
            "model": "scripted/tools.yaml",
            **tools,
            "context": {"mode": "compaction", "budget_tokens": 1200, "keep_last_n": 2, "recall": True},
        },
        "tools-stateful": {
            "model": "scripted/state.yaml",
            **tools,
            "context": {"mode": "stateful", "budget_tokens": 1200, "recall": True, "state_schema": schema},
        },
        "fanout-stateful": {
            "model": "scripted/fanout.yaml",
            "system_prompt": "You coordinate station checks.",
            "tools": ["parallel_spawn"],
            "spawnable": ["station"],
            "max_concurrent_children": 2,
            "children_state": {"into": "/results", "key": "index"},
            "context": {
                "mode": "stateful",
                "budget_tokens": 4096,
                "recall": True,
                "state_schema": {
                    "type": "object",
                    "properties": {"step": {"type": "integer"}, "results": {"type": "object"}},
                },
            },
        },
        "station": {
            "model": "scripted/station.yaml",
            **tools,
            "context": {"mode": "stateful", "budget_tokens": 1200, "recall": True, "state_schema": schema},
        },
        "tools-mcp": {
            "model": "scripted/mcp.yaml",
            "system_prompt": tools["system_prompt"],
            "max_iterations": 12,
            "mcp_servers": [notes_server],
            "tools": ["notes.*"],
            "context": {"mode": "compaction", "budget_tokens": 1200, "keep_last_n": 2, "recall": True},
        },
    }
    (folder / "agents.yaml").write_text(yaml.safe_dump({"agents": agents}, sort_keys=False), encoding="utf-8")
    return folder / "agents.yaml"
