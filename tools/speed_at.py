"""Issue 43's before and after: ``local_speed``'s chat, played by the loomrt of any commit.

    python tools/speed_at.py 31d80c6 HEAD [--model local/qwen2.5-coder-1.5b] [--out FILE]

Each commit is checked out into a temporary worktree, and this file plays the same 12-turn
chat through that commit's own ``Runtime`` (``astart``, then ``send`` for each input) in a
process of its own, one commit after the other, on the same machine. A commit that has
``loomrt.run.between_turns`` gets the chat's between-turns work after each answer, timed
apart (the user types then), as ``loomrt chat`` does; an older one did that work inside the
turn, and that is what it is measured doing.

What llama.cpp did is counted here, not taken from what each commit records (an older
commit did not report cached tokens for the embedded model): every ``create_completion``
is wrapped, and its prompt, the prefix its cache already held, its tokens written and the
time of its first token are kept. A call that continues the previous one's prompt and
output (a one-call answer's free rest) is not counted as a second prompt. The figures are
``local_speed``'s: per turn the seconds, the floor (prefill of the new input, decode of
what was written, at rates measured first on a cold cache), the first answer token (the
first token of the turn's last call), the cached share of input and the model calls.

Only stable interfaces are used: ``Runtime(SQLiteStore(path))``, ``astart``, ``send``,
``store.events``, and the agent keys every commit knows. ``tests/test_speed_at.py`` checks
the counting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MAPPED = ("providers", "recall", "harvest")  # pyproject's package-dir: loomrt.providers is providers/
TURNS = [
    "Hi! I am setting up a new database project, and I will ask you some questions along the way.",
    "My project code is ORCA-73, and the database will hold about 2.5 million rows. Please remember both.",
    "Use the calculate tool: how many rows is that per shard if I split it over 12 shards?",
    "What is a write-ahead log?",
    "What is MVCC?",
    "What does fsync do?",
    "What is a B-tree?",
    "What is a bloom filter?",
    "What is sharding?",
    "What is a vector clock?",
    "What is two-phase commit?",
    "What is my project code? Reply with the code only.",
]
"""``loomrt.bench.local_speed.TURNS``, written out so that every commit plays the same words."""


def agent(model: str) -> dict[str, Any]:
    """``local_speed``'s agent in the keys every commit knows (each commit's defaults apply)."""
    return {
        "model": model,
        "system_prompt": "You are a helpful assistant. Answer in two sentences at most.",
        "tools": ["calculate"],
        "max_tokens": 96,
        "temperature": 0,
        "context": {"mode": "recap", "budget_tokens": 1500, "recall": True},
    }


class Calls:
    """Every llama.cpp completion, as it happened."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def install(self) -> None:
        import llama_cpp

        real, rows = llama_cpp.Llama.create_completion, self.rows

        def counted(llama: Any, prompt: Any = None, *a: Any, **kw: Any) -> Any:
            tokens = list(prompt) if isinstance(prompt, list) else []
            cached = llama_cpp.Llama.longest_token_prefix(llama._input_ids.tolist(), tokens[:-1]) if tokens else 0
            row = {"started": time.perf_counter(), "prompt": tokens, "cached": cached, "first_token": None}
            row["grammar"] = kw.get("grammar") is not None

            def first(input_ids: Any, logits: Any) -> bool:
                if row["first_token"] is None and len(input_ids) > len(tokens):
                    row["first_token"] = time.perf_counter()
                return False

            criteria = list(kw.get("stopping_criteria") or [])
            kw["stopping_criteria"] = llama_cpp.StoppingCriteriaList([first, *criteria])
            out = real(llama, prompt, *a, **kw)
            row["written"] = int(out["usage"]["completion_tokens"])
            previous = rows[-1] if rows else None
            row["continues"] = bool(
                previous
                and len(tokens) > len(previous["prompt"])
                and tokens[: len(previous["prompt"])] == previous["prompt"]
                and len(tokens) - len(previous["prompt"]) <= previous["written"]
            )
            rows.append(row)
            return out

        llama_cpp.Llama.create_completion = counted


def machine_rates(model: str) -> dict[str, float]:
    """Prefill and decode tokens per second on a cold cache: ``local_speed``'s own way, written
    out because an older commit has no ``loomrt.bench.local_speed``."""
    import llama_cpp

    from loomrt.providers.local import n_threads
    from loomrt.providers.models import model_path

    llama = llama_cpp.Llama(model_path=str(model_path(model)), n_ctx=2048, n_threads=n_threads(), verbose=False)
    words = ("the record keeps every word and each distillation is an event on it " * 200).split()
    tokens = llama.tokenize(" ".join(words).encode())[:512]
    started = time.perf_counter()
    llama.eval(tokens)
    prefill_s = time.perf_counter() - started
    started, made = time.perf_counter(), 0
    for _ in llama.generate([], temp=0, reset=False):
        made += 1
        if made >= 64:
            break
    decode_s = time.perf_counter() - started
    out = {"prefill_tps": round(len(tokens) / prefill_s, 1), "decode_tps": round(made / decode_s, 1)}
    del llama
    return out


async def play(model: str, folder: Path, calls: Calls) -> list[dict[str, Any]]:
    from loomrt.record.sqlite import SQLiteStore
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentSpec

    try:
        from loomrt.run.between_turns import between_turns
    except ImportError:  # an older commit: no work between turns
        between_turns = None
    runtime = Runtime(SQLiteStore(folder / "record.sqlite"))
    run = await runtime.astart(AgentSpec.model_validate(agent(model)), interactive=True, name="speed-at")
    turns = []
    for text in TURNS:
        first_call, first_seq = len(calls.rows), run.last_seq + 1
        started = time.perf_counter()
        result = await runtime.send(run, text)
        ended, last_call = time.perf_counter(), len(calls.rows)
        between = 0.0
        if between_turns is not None:
            try:
                await between_turns(run, runtime.coordination, read_ahead=True)
            except TypeError:  # a commit before read_ahead
                await between_turns(run, runtime.coordination)
            between = time.perf_counter() - ended
        turns.append(
            {
                "started": started,
                "seconds": ended - started,
                "calls": (first_call, last_call),
                "from_seq": first_seq,
                "between_s": round(between, 2),
                "status": result.status,
                "answer": (result.output or "")[:120],
            }
        )
    events = runtime.store.events(run.run_id)
    for turn, upto in zip(turns, [t["from_seq"] for t in turns[1:]] + [10**12], strict=True):
        mine = [e for e in events if turn["from_seq"] <= e.seq < upto]
        turn["new_text"] = [str(e.data.get("content", "")) for e in mine if e.kind in ("user_input", "tool_result")]
        turn["distillations"] = sum(e.kind == "distillation" for e in mine)
        turn["rejected"] = sum(e.kind == "summary_rejected" for e in mine)
    return turns


def figures(turns: list[dict[str, Any]], calls: Calls, rates: dict[str, float], count: Any) -> dict[str, Any]:
    rows = []
    for turn in turns:
        lo, hi = turn["calls"]
        made = calls.rows[lo:hi]
        prompts = [c for c in made if not c["continues"]]
        written = sum(c["written"] for c in made)
        new_tokens = sum(count(t) for t in turn["new_text"])
        floor = new_tokens / rates["prefill_tps"] + written / rates["decode_tps"]
        last = prompts[-1] if prompts else None
        first = last["first_token"] - turn["started"] if last and last["first_token"] else None
        rows.append(
            {
                "seconds": round(turn["seconds"], 2),
                "floor_s": round(floor, 2),
                "over_floor": round(turn["seconds"] / floor, 2) if floor else None,
                "first_token_s": round(first, 2) if first is not None else None,
                "input_tokens": sum(len(c["prompt"]) for c in prompts),
                "cached_tokens": sum(c["cached"] for c in prompts),
                "new_tokens": new_tokens,
                "output_tokens": written,
                "model_calls": len(prompts),
                "under_grammar": sum(c["grammar"] for c in made),
                "distillations": turn["distillations"],
                "rejected": turn["rejected"],
                "between_s": turn["between_s"],
                "status": turn["status"],
                "answer": turn["answer"],
            }
        )
    total_in = sum(r["input_tokens"] for r in rows)
    return {
        "turns": rows,
        "median_s": round(statistics.median(r["seconds"] for r in rows), 2),
        "median_floor_s": round(statistics.median(r["floor_s"] for r in rows), 2),
        "median_over_floor": round(statistics.median(r["over_floor"] for r in rows if r["over_floor"]), 2),
        "cached_share": round(sum(r["cached_tokens"] for r in rows) / total_in, 3) if total_in else None,
        "median_first_token_s": round(statistics.median(r["first_token_s"] for r in rows[1:] if r["first_token_s"]), 2),
        "model_calls_per_turn": round(sum(r["model_calls"] for r in rows) / len(rows), 2),
        "distillations": sum(r["distillations"] for r in rows),
        "rejected": sum(r["rejected"] for r in rows),
        "seconds": round(sum(r["seconds"] + r["between_s"] for r in rows), 1),
    }


def measure(model: str) -> dict[str, Any]:
    """This process's loomrt (the commit's): the rates, then the chat."""
    import llama_cpp

    from loomrt.providers.models import model_path

    rates = machine_rates(model)
    calls = Calls()
    calls.install()
    with tempfile.TemporaryDirectory() as tmp:
        turns = asyncio.run(play(model, Path(tmp), calls))
    vocab = llama_cpp.Llama(model_path=str(model_path(model)), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False))

    return {"model": model, **rates, **figures(turns, calls, rates, count)}


def at(commit: str, model: str) -> dict[str, Any]:
    """Check ``commit`` out apart and measure it in a process of its own."""
    sha = subprocess.run(["git", "rev-parse", commit], cwd=REPO, capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="speed-at-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha.strip()], cwd=REPO, check=True)
        try:
            for name in MAPPED:
                (tree / "loomrt" / name).symlink_to(tree / name, target_is_directory=True)
            env = {**os.environ, "PYTHONPATH": str(tree)}
            done = subprocess.run(
                [sys.executable, __file__, "--measure", "--model", model],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise SystemExit(f"{commit}: the chat failed:\n{done.stderr[-3000:]}")
            return {"commit": sha.strip()[:12], **json.loads(done.stdout.strip().splitlines()[-1])}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commits", nargs="*", default=["HEAD"])
    parser.add_argument("--model", default="local/qwen2.5-coder-1.5b")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.model)))
        return
    results = []
    for commit in args.commits:
        print(f"{commit}: playing {len(TURNS)} turns", file=sys.stderr)
        results.append(at(commit, args.model))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "turns"}), file=sys.stderr)
    text = json.dumps(results, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
