"""The ``local_speed`` measure: a 12-turn chat on the embedded model, turn by turn, against
the machine's floor.

A turn's **floor** is what the machine cannot avoid: prefilling the tokens of the
messages no earlier call has sent (the new input and the turn's tool results) and
decoding as many tokens as the turn's calls wrote. Both rates are measured on this
machine just before and just after each chat (their mean is the chat's rate: a shared
machine's speed drifts), with the same model and threads, on a cold cache. Per turn it reports
the seconds, the floor, their ratio, the seconds to the first answer token, the share of
input tokens llama.cpp served from its prefix cache, and the model calls.

The chat is played as ``loomrt chat`` plays it: a recap due at the watermark is written
between turns (:func:`loomrt.run.between_turns.between_turns`), timed apart, since the user is typing then.

Run only when named (`loomrt bench run local_speed`): on 2 cores the default model takes
several minutes. It plays the chat twice: a turn that decides, then answers (two model
calls), and one that does both in one generation (``one_call_turns``). Goals (issue 43): a turn's median at most 1.25× its floor, a cached
share of at least 75% over the chat, the first answer token within 3 s of the turn's
start once its prefix is cached.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure
from loomrt.bench.local_chat import QUESTIONS, rejection_reasons
from loomrt.run.between_turns import between_turns

if TYPE_CHECKING:
    from loomrt.activity import Activity, AnswerText
    from loomrt.events import Event
    from loomrt.run.state import RunState
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentSpec

__all__ = ["TURNS", "speed_spec", "machine_rates", "bracketed", "play_timed", "turn_figures", "local_speed"]

TURNS = [
    "Hi! I am setting up a new database project, and I will ask you some questions along the way.",
    "My project code is ORCA-73, and the database will hold about 2.5 million rows. Please remember both.",
    "Use the calculate tool: how many rows is that per shard if I split it over 12 shards?",
    *QUESTIONS[:8],
    "What is my project code? Reply with the code only.",
]
"""An opening, two facts (which the recaps evict), one tool call, eight questions, the fact asked for."""


def speed_spec(model: str, *, max_tokens: int = 96, budget_tokens: int = 1500, one_call: bool = False) -> AgentSpec:
    """The agent a new user starts from: recap, recall on and injected, one tool; a turn
    decides then answers (two calls), or with ``one_call`` does both in one generation."""
    from loomrt.spec import AgentSpec

    return AgentSpec(
        model=model,
        system_prompt="You are a helpful assistant. Answer in two sentences at most.",
        tools=["calculate"],
        max_tokens=max_tokens,
        temperature=0,
        capabilities={"one_call_turns": one_call},  # declared either way, whatever the default
        context={"mode": "recap", "budget_tokens": budget_tokens, "recall": True, "recall_inject": "on"},
    )


def machine_rates(model: str, *, prompt_tokens: int = 512, decode_tokens: int = 64) -> dict[str, float]:
    """Prefill and decode tokens per second of ``model`` on this machine, on a cold cache."""
    import llama_cpp

    from loomrt.providers.local import n_threads
    from loomrt.providers.models import model_path

    llama = llama_cpp.Llama(
        model_path=str(model_path(model, progress=False)), n_ctx=2048, n_threads=n_threads(), verbose=False
    )
    words = ("the record keeps every word and each distillation is an event on it " * 200).split()
    tokens = llama.tokenize(" ".join(words).encode())[:prompt_tokens]
    started = time.perf_counter()
    llama.eval(tokens)
    prefill_s = time.perf_counter() - started
    started, made = time.perf_counter(), 0
    for _ in llama.generate([], temp=0, reset=False):
        made += 1
        if made >= decode_tokens:
            break
    decode_s = time.perf_counter() - started
    rates = {"prefill_tps": round(len(tokens) / prefill_s, 1), "decode_tps": round(made / decode_s, 1)}
    del llama
    return rates


def bracketed(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The machine's rates over a chat: the mean of those measured just before and just after
    it. A shared machine's speed drifts (on this 2-core machine, decode measured 13.0 tokens/s
    at one time and 9.1 an hour later with nothing else running), so rates measured once for
    two chats of twenty minutes would hold the second to a floor the machine no longer had."""
    return {name: round((before[name] + after[name]) / 2, 1) for name in before}


async def play_timed(
    runtime: Runtime, spec: AgentSpec, progress: Progress | None = None, *, inputs: list[str] = TURNS
) -> tuple[RunState, list[dict[str, Any]]]:
    """Play ``inputs`` as the chat does; per turn its first seq, seconds, seconds to the first
    answer token, and the seconds spent between it and the next (distilling)."""
    run = await runtime.astart(spec, interactive=True, name="local-speed")
    first_text: list[float] = []

    def watch(signal: Activity | AnswerText) -> None:
        if getattr(signal, "kind", None) == "answer_text" and not first_text:
            first_text.append(time.perf_counter())

    getattr(run, "watchers", []).append(watch)  # an older runtime streams nothing: first token unknown
    turns = []
    for text in inputs:
        first_seq, first_text[:] = run.last_seq + 1, []
        started = time.perf_counter()
        result = await runtime.send(run, text)
        took = time.perf_counter() - started
        between = time.perf_counter()
        await between_turns(run, runtime.coordination, read_ahead=True)  # as the chat does while you type
        turns.append(
            {
                "from_seq": first_seq,
                "seconds": took,
                "first_token_s": round(first_text[0] - started, 2) if first_text else None,
                "between_s": round(time.perf_counter() - between, 2),
                "status": result.status,
                "answer": (result.output or "")[:160],
            }
        )
        if progress is not None:
            progress.advance()
    return run, turns


def turn_figures(
    events: list[Event], turns: list[dict[str, Any]], rates: dict[str, float], count: Callable[[str], int]
) -> dict[str, Any]:
    """Each turn's figures from the record (its model calls and new messages) and its timing;
    ``count(text)`` is the model's token count of a text."""
    rows = []
    bounds = [t["from_seq"] for t in turns] + [10**12]
    for turn, lo, hi in zip(turns, bounds, bounds[1:], strict=False):
        mine = [e for e in events if lo <= e.seq < hi]
        answered = next((i for i, e in enumerate(mine) if e.kind in ("parked", "final", "error")), len(mine))
        calls = [e.data for e in mine[:answered] if e.kind == "model_call"]
        usage = [c.get("usage") or {} for c in calls]
        new = [e.data.get("content", "") for e in mine if e.kind in ("user_input", "tool_result")]
        new_tokens = sum(count(str(t)) for t in new)
        written = sum(int(u.get("output_tokens", 0)) for u in usage)
        floor = new_tokens / rates["prefill_tps"] + written / rates["decode_tps"]
        rows.append(
            {
                "seconds": round(turn["seconds"], 2),
                "floor_s": round(floor, 2),
                "over_floor": round(turn["seconds"] / floor, 2) if floor else None,
                "first_token_s": turn["first_token_s"],
                "input_tokens": sum(int(u.get("input_tokens", 0)) for u in usage),
                "cached_tokens": sum(int(u.get("cached_tokens", 0)) for u in usage),
                "new_tokens": new_tokens,
                "output_tokens": written,
                "model_calls": len(calls),
                "distilled_in_turn": sum(e.kind == "distillation" for e in mine[:answered]),
                "between_s": turn["between_s"],
                "status": turn["status"],
            }
        )
    total_in = sum(r["input_tokens"] for r in rows)
    firsts = [r["first_token_s"] for r in rows[1:] if r["first_token_s"] is not None]
    return {
        "turns": rows,
        "median_s": round(statistics.median(r["seconds"] for r in rows), 2),
        "median_floor_s": round(statistics.median(r["floor_s"] for r in rows), 2),
        "median_over_floor": round(statistics.median(r["over_floor"] for r in rows if r["over_floor"]), 2),
        "cached_share": round(sum(r["cached_tokens"] for r in rows) / total_in, 3) if total_in else None,
        "median_first_token_s": round(statistics.median(firsts), 2) if firsts else None,
        "model_calls_per_turn": round(sum(r["model_calls"] for r in rows) / len(rows), 2),
        "recaps": sum(e.kind == "distillation" for e in events),
        "recaps_rejected": sum(e.kind == "summary_rejected" for e in events),
        "rejections": rejection_reasons(events),
        "turns_failed": sum(r["status"] == "failed" for r in rows),
    }


@standalone_measure(
    "local_speed",
    "a 12-turn chat on the embedded model: each turn's seconds against its floor, first token, cached share",
)
def local_speed(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    try:
        import llama_cpp
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed (pip install 'loomrt[local]')"}
    from loomrt.providers.models import model_path
    from loomrt.record.sqlite import SQLiteStore
    from loomrt.runtime import Runtime

    model = config.model if config.model and config.model.startswith("local/") else "local/qwen2.5-coder-1.5b"
    vocab = llama_cpp.Llama(model_path=str(model_path(model, progress=False)), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False))

    out: dict[str, Any] = {"model": model}
    for variant, one_call in (("two_calls", False), ("one_call", True)):
        progress.start(f"local speed · {model} · {variant} · the machine's rates, then {len(TURNS)} turns", 2)
        before = machine_rates(model)
        with tempfile.TemporaryDirectory() as tmp:
            runtime = Runtime(SQLiteStore(Path(tmp) / "record.sqlite"), embedder=config.make_embedder())
            started = time.perf_counter()
            run, turns = asyncio.run(play_timed(runtime, speed_spec(model, one_call=one_call)))
            seconds = time.perf_counter() - started
            progress.advance()
            after = machine_rates(model)
            rates = bracketed(before, after)
            figures = turn_figures(runtime.store.events(run.run_id), turns, rates, count)
        progress.advance()
        out[variant] = {"seconds": round(seconds, 1), **rates, "rates_before": before, "rates_after": after, **figures}
    return out
