"""The ``local_chat`` measure: a 12-turn chat on the embedded model, on a small budget.

An early fact, ten questions, then the fact asked for. Every recap is written by the
model itself and must pass the prose check. Reported: whether every turn survived, the
recaps made and rejected, whether the last answer holds the fact, and the seconds. Run
only when named (`loomrt bench run local_chat --model local/qwen2.5-coder-1.5b`): on 2
cores the default model takes several minutes.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure

__all__ = ["FACT", "QUESTIONS", "FINAL_QUESTION", "CODE", "chat_spec", "play_chat", "local_chat"]

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


def chat_spec(model: str, *, max_tokens: int = 96, budget_tokens: int = 1200) -> Any:
    """The agent of the chat: recap mode, recall on, a budget that forces recaps."""
    from loomrt.spec import AgentSpec

    return AgentSpec(
        model=model,
        system_prompt="You are a concise assistant. Answer in two sentences at most.",
        max_tokens=max_tokens,
        temperature=0,
        context={
            "mode": "recap",
            "budget_tokens": budget_tokens,
            "keep_last_n": 2,
            "recall": True,
            "recap_max_chars": 600,
        },
    )


async def play_chat(runtime: Any, spec: Any, progress: Progress | None = None) -> tuple[Any, list[Any]]:
    """Play the chat through ``runtime``; the run and each turn's result."""
    run = await runtime.astart(spec, interactive=True, name="local-chat")
    results = []
    for text in [FACT, *QUESTIONS, FINAL_QUESTION]:
        results.append(await runtime.send(run, text))
        if progress is not None:
            progress.advance()
    return run, results


@standalone_measure(
    "local_chat", "a 12-turn chat on the embedded model: recaps it writes, every turn survives, the fact at the end"
)
def local_chat(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed (pip install 'loomrt[local]')"}
    from loomrt.record.sqlite import SQLiteStore
    from loomrt.runtime import Runtime

    model = config.model if config.model and config.model.startswith("local/") else "local/qwen2.5-coder-1.5b"
    progress.start(f"local chat · {model}", 2 + len(QUESTIONS))
    with tempfile.TemporaryDirectory() as tmp:
        runtime = Runtime(SQLiteStore(Path(tmp) / "record.sqlite"), embedder=False)
        started = time.perf_counter()
        run, results = asyncio.run(play_chat(runtime, chat_spec(model), progress))
        seconds = time.perf_counter() - started
        kinds = [e.kind for e in runtime.store.events(run.run_id)]
    return {
        "model": model,
        "turns": len(results),
        "turns_failed": sum(r.status == "failed" for r in results),
        "recaps": kinds.count("distillation"),
        "recaps_rejected": kinds.count("summary_rejected"),
        "declined": kinds.count("distillation_declined"),
        "fact_answered": CODE in (results[-1].output or ""),
        "last_answer": (results[-1].output or "")[:200],
        "seconds": round(seconds, 1),
        "seconds_per_turn": round(seconds / len(results), 1),
    }
