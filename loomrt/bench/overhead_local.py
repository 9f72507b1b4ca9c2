"""The runtime's overhead over bare llama-cpp-python: same model, same prompt, same tokens.

:func:`measure_local_overhead` times three ways of getting one reply from an embedded model:

- ``bare``: ``Llama.create_chat_completion`` on a ``Llama`` of its own, called in a worker
  thread as the runtime calls it (``bare_main_thread``: the same call on the main thread,
  which measured slower here, so it is reported but is not the baseline);
- ``gateway``: :class:`~loomrt.providers.gateway.LiteLLMProvider` (litellm, the ``local``
  provider, a worker thread);
- ``run``: a whole one-shot :class:`~loomrt.Runtime` run (the record in SQLite, the
  working context, the model call, the final event).

Each repeat runs them back to back (interleaved, so a change in machine load hits all
three alike), after one warm-up round that is not counted (model load, litellm import).
Both models start each call from an empty KV cache, so every call evaluates the whole
prompt and generates the same tokens (temperature 0). The result holds the medians and
the ratios to ``bare``; the goal is ``run_ratio <= 1.10``. CPU seconds (all threads of the
process) are reported beside wall-clock seconds: on a machine busy with other work they
are the steadier measure, especially with ``LOOMRT_LLAMA_THREADS=1``.

Run it: ``python -m loomrt.bench.overhead_local [MODEL] [REPEATS]``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["measure_local_overhead"]

SYSTEM = "You are a concise assistant."
PROMPT = "List three facts about the Moon, one line each."
MAX_TOKENS = 64


def measure_local_overhead(model: str = "local/smollm2-135m", repeats: int = 5) -> dict[str, Any]:
    """Median seconds per reply for bare llama-cpp-python, the gateway and a full run, and the ratios."""
    from llama_cpp import Llama

    from loomrt.providers import local
    from loomrt.providers.base import ModelRequest
    from loomrt.providers.gateway import LiteLLMProvider
    from loomrt.providers.models import get_model, model_path
    from loomrt.record.sqlite import SQLiteStore
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentSpec

    entry = get_model(model)
    path = model_path(model)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    bare = Llama(model_path=str(path), n_ctx=entry.context_window, n_threads=local.n_threads(), verbose=False)
    provider = LiteLLMProvider(model)
    spec = AgentSpec(model=model, system_prompt=SYSTEM, temperature=0, max_tokens=MAX_TOKENS)
    times: dict[str, list[float]] = {k: [] for k in ("bare", "bare_main_thread", "gateway", "run")}
    cpu: dict[str, list[float]] = {k: [] for k in times}
    tokens: dict[str, int] = {}

    def embedded() -> Any:
        return local.load(model, entry.context_window).llama

    with tempfile.TemporaryDirectory() as tmp:
        runtime = Runtime(SQLiteStore(Path(tmp) / "record.sqlite"))
        request = ModelRequest(messages=messages, max_tokens=MAX_TOKENS, temperature=0)
        for i in range(repeats + 1):
            elapsed, used = {}, {}
            for key, runner in (("bare_main_thread", _call), ("bare", _in_worker_thread)):
                bare.reset()  # type: ignore[no-untyped-call]
                t, c = time.perf_counter(), time.process_time()
                out = runner(
                    lambda: bare.create_chat_completion(messages=messages, max_tokens=MAX_TOKENS, temperature=0)  # type: ignore[arg-type]
                )
                elapsed[key], used[key] = time.perf_counter() - t, time.process_time() - c
                tokens[key] = out["usage"]["completion_tokens"]

            if i:  # the first round loaded the embedded model; from then on start it cold too
                embedded().reset()
            t, c = time.perf_counter(), time.process_time()
            reply = asyncio.run(provider.complete(request))
            elapsed["gateway"], used["gateway"] = time.perf_counter() - t, time.process_time() - c
            tokens["gateway"] = reply.usage.output_tokens

            embedded().reset()
            t, c = time.perf_counter(), time.process_time()
            result = runtime.run_sync(spec, PROMPT)
            elapsed["run"], used["run"] = time.perf_counter() - t, time.process_time() - c
            tokens["run"] = result.usage.output_tokens
            if result.status != "done":
                raise RuntimeError(f"the benchmark run failed: {result.error}")
            if i:  # round 0 is the warm-up
                for key, value in elapsed.items():
                    times[key].append(value)
                    cpu[key].append(used[key])
    bare.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    return {
        "model": model,
        "repeats": repeats,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "completion_tokens": tokens,
        "same_tokens": len(set(tokens.values())) == 1,
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "gateway_ratio": round(med["gateway"] / med["bare"], 4),
        "run_ratio": round(med["run"] / med["bare"], 4),
        "median_cpu_s": {k: round(v, 4) for k, v in med_cpu.items()},
        "run_cpu_ratio": round(med_cpu["run"] / med_cpu["bare"], 4),
        "tokens_per_s_bare": round(tokens["bare"] / med["bare"], 1),
        "goal": "run_ratio <= 1.10",
        "meets_goal": med["run"] / med["bare"] <= 1.10,
        "n_threads": local.n_threads(),
    }


def _call(fn: Callable[[], Any]) -> Any:
    return fn()


def _in_worker_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a fresh thread, as the runtime does (llama.cpp measured faster there)."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(fn()))
    worker.start()
    worker.join()
    return out[0]


if __name__ == "__main__":  # pragma: no cover - a manual entry point
    args = sys.argv[1:]
    report = measure_local_overhead(args[0] if args else "local/smollm2-135m", int(args[1]) if len(args) > 1 else 5)
    print(json.dumps(report, indent=2))
