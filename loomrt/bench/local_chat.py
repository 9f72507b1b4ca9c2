"""The ``local_chat`` measure: a 13-turn chat on the embedded model, on a small budget.

An opening line (the task, pinned), a fact in the second turn (which the recaps evict),
ten questions, then the fact asked for. Every recap is written by the model itself and
must pass the prose check. The chat is played twice, with recall injection off (the model
must call Recall itself) and on (the runtime brings the evicted words back). Reported for
each: whether every turn survived, the recaps made and rejected, Recall calls, blocks
injected, whether the last answer holds the fact, and the seconds. Run only when named
(`loomrt bench run local_chat --model local/qwen2.5-coder-1.5b`): on 2 cores the default
model takes several minutes a chat.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure

__all__ = [
    "OPENING",
    "FACT",
    "QUESTIONS",
    "rejection_reasons",
    "FINAL_QUESTION",
    "CODE",
    "chat_spec",
    "play_chat",
    "local_chat",
    "chat_figures",
]

OPENING = "Hi! I am setting up a new database project, and I will ask you some questions along the way."

CODE = "ZEBRA-41"
FACT = f"My project code is {CODE}. Please remember it; I will ask for it later."
QUESTIONS = [
    "What is a write-ahead log?",
    "What is MVCC?",
    "What does fsync do?",
    "What is a B-tree?",
    "What is a bloom filter?",
    "What is sharding?",
    "What is a vector clock?",
    "What is two-phase commit?",
    "What is a checkpoint in a database?",
    "What is a tombstone in an LSM tree?",
]
FINAL_QUESTION = "What is my project code? Reply with the code only."


def chat_spec(model: str, *, max_tokens: int = 96, budget_tokens: int = 1200, inject: bool = False) -> Any:
    """The agent of the chat: recap mode, recall on, a budget that forces recaps; recall
    injection on or off (its reserve on top of the budget, so both chats recap alike)."""
    from loomrt.spec import AgentSpec

    return AgentSpec(
        model=model,
        system_prompt="You are a concise assistant. Answer in two sentences at most.",
        max_tokens=max_tokens,
        temperature=0,
        context={
            "mode": "recap",
            "budget_tokens": budget_tokens + (INJECT_TOKENS if inject else 0),
            "keep_last_n": 2,
            "recall": True,
            "recall_inject": "on" if inject else "off",
            **({"recall_inject_tokens": INJECT_TOKENS} if inject else {}),
            "recap_max_chars": 600,
        },
    )


async def play_chat(
    runtime: Any,
    spec: Any,
    progress: Progress | None = None,
    *,
    questions: int | None = None,
    turn_seconds: list[float] | None = None,
) -> tuple[Any, list[Any]]:
    """Play the chat through ``runtime`` (the first ``questions`` of the ten between the fact
    and the final question; all by default); the run and each turn's result. ``turn_seconds``
    gets each turn's seconds, from the input to the answer (the recaps written between turns,
    while a user would type, are not in them)."""
    from loomrt.run.between_turns import between_turns

    run = await runtime.astart(spec, interactive=True, name="local-chat")
    results = []
    for text in [OPENING, FACT, *QUESTIONS[:questions], FINAL_QUESTION]:
        started = time.perf_counter()
        results.append(await runtime.send(run, text))
        if turn_seconds is not None:
            turn_seconds.append(time.perf_counter() - started)
        await between_turns(run, runtime.coordination, read_ahead=True)  # as `loomrt chat` does while you type
        if progress is not None:
            progress.advance()
    return run, results


INJECT_TOKENS = 300
"""The chat's reserve for injected passages (context.recall_inject_tokens)."""


def rejection_reasons(events: list[Any]) -> list[dict[str, Any]]:
    """Each recap or summary the prose check rejected: its try, the reason, and the start of
    what the model wrote (so a rejection can be read, not only counted)."""
    return [
        {"attempt": e.data.get("attempt"), "reason": e.data.get("reason"), "text": str(e.data.get("text", ""))[:160]}
        for e in events
        if e.kind == "summary_rejected"
    ]


def chat_figures(
    store: Any, run: Any, results: list[Any], seconds: float, turn_seconds: list[float] | None = None
) -> dict[str, Any]:
    """What one played chat shows (``turn_seconds``: each turn's, as :func:`play_chat` gives them)."""
    from loomrt.audit import context_as_of

    events = store.events(run.run_id)
    kinds = [e.kind for e in events]
    asked = [e.seq for e in events if e.kind == "user_input"][-1]
    before_question = context_as_of(events, asked - 1, store)
    calls = [e for e in store.events(run.run_id, kinds=["tool_call"]) if e.data.get("name") == "Recall"]
    return {
        "turns": len(results),
        "turns_failed": sum(r.status == "failed" for r in results),
        "recaps": kinds.count("distillation"),
        "recaps_rejected": kinds.count("summary_rejected"),
        "rejections": rejection_reasons(events),
        "declined": kinds.count("distillation_declined"),
        "recall_calls": len(calls),
        "blocks_injected": kinds.count("recall_injected"),
        # the fact's own message gone from the context, and its value gone too (a recap
        # that kept the code leaves nothing for Recall or injection to bring back)
        "fact_turn_evicted": not any(m.content == FACT for m in before_question),
        "fact_evicted": not any(CODE in m.content for m in before_question),
        "fact_answered": CODE in (results[-1].output or ""),
        "last_answer": (results[-1].output or "")[:200],
        "seconds": round(seconds, 1),
        "seconds_per_turn": round(seconds / len(results), 1),
        **(
            {
                "turn_seconds_median": round(statistics.median(turn_seconds), 1),
                "turn_seconds_worst": round(max(turn_seconds), 1),
            }
            if turn_seconds
            else {}
        ),
    }


@standalone_measure(
    "local_chat",
    "a 13-turn chat on the embedded model, recall injection off and on: recaps it writes, the evicted fact at the end",
)
def local_chat(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed (pip install 'loomrt[local]')"}
    from loomrt.record.sqlite import SQLiteStore
    from loomrt.runtime import Runtime

    model = config.model if config.model and config.model.startswith("local/") else "local/qwen2.5-coder-1.5b"
    out: dict[str, Any] = {"model": model}
    for inject in (False, True):
        progress.start(f"local chat · {model} · injection {'on' if inject else 'off'}", 2 + len(QUESTIONS) + 1)
        with tempfile.TemporaryDirectory() as tmp:
            runtime = Runtime(SQLiteStore(Path(tmp) / "record.sqlite"), embedder=config.make_embedder())
            turns: list[float] = []
            started = time.perf_counter()
            run, results = asyncio.run(
                play_chat(runtime, chat_spec(model, inject=inject), progress, turn_seconds=turns)
            )
            out["inject" if inject else "no_inject"] = chat_figures(
                runtime.store, run, results, time.perf_counter() - started, turns
            )
    return out
