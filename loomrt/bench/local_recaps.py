"""The ``local_recaps`` measure: a long chat on the embedded model, to count its recaps.

``local_chat`` and ``local_speed`` write a recap or two a chat since recaps are sized to the
budget, too few to count rejections by. This chat runs long enough for twenty or more: an
opening (pinned), then questions on many topics with a fact stated every few turns (names,
numbers, dates, which the recaps evict), on an 800-token budget. Every recap is written by
the model and must pass the prose check. Reported: recaps made, tries rejected and why,
recaps declined, each recap's seconds and size, and for each fact whether its value is
still in the context at the end (kept by a recap, or still verbatim). A recap the model
failed to write twice becomes an extract (a fallback), counted apart. Goal (issue 43): at
most 1 rejected try in 10, over at least 20 recaps. Run only when named (`loomrt bench run
local_recaps`): on 2 cores the default model takes about half an hour.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure
from loomrt.bench.local_chat import rejection_reasons

if TYPE_CHECKING:
    from loomrt.record.store import Store
    from loomrt.run.state import RunState
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentSpec

__all__ = ["OPENING", "FACTS", "TOPICS", "chat_inputs", "recaps_spec", "play_recaps", "recap_figures", "local_recaps"]

OPENING = "Hi! I run the platform team at a small company, and I will ask you questions all afternoon."

FACTS = {
    "Priya": "My colleague Priya owns the nightly backup job; it starts at 02:30.",
    "4,096": "Our main database server has 4,096 GB of disk and 256 GB of memory.",
    "14 March": "We migrate to the new data centre on 14 March.",
    "LARK-9": "The ticket for the migration is LARK-9.",
    "Tomasz": "Tomasz is on call next week; his pager number ends in 7781.",
    "3.8.1": "We pinned the message broker at version 3.8.1.",
}
"""The facts stated along the chat, each by the value the context must still hold at the end."""

TOPICS = [
    "What is a write-ahead log?",
    "What is a load balancer?",
    "What does DNS do?",
    "What is a container image?",
    "What is a mutex?",
    "What is TLS?",
    "What is a message queue?",
    "What is a cron job?",
    "What is RAID 10?",
    "What is a reverse proxy?",
    "What is garbage collection?",
    "What is a CDN?",
    "What is eventual consistency?",
    "What is a deadlock?",
    "What is an inode?",
    "What is a VLAN?",
    "What is a hash table?",
    "What is idempotency?",
    "What is a circuit breaker in microservices?",
    "What is blue-green deployment?",
    "What is a page cache?",
    "What is a firewall rule?",
    "What is a rate limiter?",
    "What is a semaphore?",
    "What is a replica set?",
    "What is an SSH key?",
    "What is a memory leak?",
    "What is a canary release?",
    "What is a socket?",
    "What is a health check?",
    "What is a time-series database?",
    "What is a snapshot backup?",
    "What is a thread pool?",
    "What is NAT?",
    "What is a service mesh?",
    "What is a checksum?",
    "What is a connection pool?",
    "What is swap space?",
    "What is a kernel panic?",
    "What is log rotation?",
    "What is a feature flag?",
    "What is consistent hashing?",
    "What is a race condition?",
    "What is an SLA?",
    "What is a heartbeat in a cluster?",
    "What is a read replica?",
    "What is infrastructure as code?",
    "What is a zombie process?",
    "What is a bastion host?",
    "What is an audit log?",
    "What is a cold standby?",
    "What is a DHCP lease?",
    "What is a dead letter queue?",
    "What is a distributed lock?",
    "What is an environment variable?",
    "What is a file descriptor?",
    "What is a forward proxy?",
    "What is a git rebase?",
    "What is a hot patch?",
    "What is HTTP keep-alive?",
    "What is a JSON Web Token?",
    "What is a leader election?",
    "What is a liveness probe?",
    "What is a mount point?",
    "What is MTU?",
    "What is an object store?",
    "What is an OOM killer?",
    "What is a packet capture?",
    "What is a partition key?",
    "What is a PID file?",
    "What is a point-in-time recovery?",
    "What is a post-mortem?",
    "What is a quorum?",
    "What is a rolling restart?",
    "What is a runbook?",
    "What is a secret manager?",
    "What is a sidecar container?",
    "What is a signal in Unix?",
    "What is a sticky session?",
    "What is a symlink?",
    "What is a systemd unit?",
    "What is TCP slow start?",
    "What is a TTL in DNS?",
    "What is a VPN?",
    "What is a webhook?",
    "What is a work queue?",
    "What is write amplification?",
    "What is a zero-downtime deploy?",
    "What is an ARP table?",
    "What is a backpressure signal?",
    "What is a cache stampede?",
    "What is a cgroup?",
    "What is a chaos experiment?",
    "What is a cold start?",
    "What is a config drift?",
    "What is a CPU steal time?",
]
"""Questions on many topics: each answer grows the context toward its next recap."""

FACT_EVERY = 16
"""A fact is stated every this many turns."""


def chat_inputs(topics: int | None = None) -> list[str]:
    """The chat's inputs: the opening, then the first ``topics`` questions (all by default)
    with a fact before every :data:`FACT_EVERY`-th, until the facts run out."""
    facts = iter(FACTS.values())
    inputs = [OPENING]
    for i, question in enumerate(TOPICS[:topics]):
        if i % FACT_EVERY == 0:
            fact = next(facts, None)
            if fact is not None:
                inputs.append(fact)
        inputs.append(question)
    return inputs


def recaps_spec(model: str, *, max_tokens: int = 96, budget_tokens: int = 800) -> AgentSpec:
    """The agent of the chat: recap mode on a budget that forces a recap every few turns,
    the model writing each; no tool and no recall (the recaps are what is counted)."""
    from loomrt.spec import AgentSpec

    return AgentSpec(
        model=model,
        system_prompt="You are a concise assistant. Answer in two sentences at most.",
        max_tokens=max_tokens,
        temperature=0,
        context={"mode": "recap", "budget_tokens": budget_tokens, "keep_last_n": 2, "recap_max_chars": 600},
    )


async def play_recaps(
    runtime: Runtime, spec: AgentSpec, inputs: list[str], progress: Progress | None = None
) -> tuple[RunState, list[float], list[float]]:
    """Play ``inputs`` as the chat does (a recap due is written between turns, while the user
    would type); the run, each turn's seconds, and the seconds of each reduction between turns."""
    from loomrt.run.between_turns import between_turns

    run = await runtime.astart(spec, interactive=True, name="local-recaps")
    turn_s, recap_s = [], []
    for text in inputs:
        started = time.perf_counter()
        await runtime.send(run, text)
        turn_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        if await between_turns(run, runtime.coordination, read_ahead=True):
            recap_s.append(time.perf_counter() - started)
        if progress is not None:
            progress.advance()
    return run, turn_s, recap_s


def recap_figures(store: Store, run: RunState, turn_s: list[float], recap_s: list[float]) -> dict[str, Any]:
    """What the played chat shows: the recaps, the rejected tries and why, and the facts kept."""
    events = store.events(run.run_id)
    kinds = [e.kind for e in events]
    distilled = [e.data for e in events if e.kind == "distillation"]
    recaps = [str(d.get("summary", "")) for d in distilled if not d.get("fallback")]
    rejected = kinds.count("summary_rejected")
    stated = [value for value, fact in FACTS.items() if any(e.data.get("content") == fact for e in events)]
    context = "\n".join(m.content for m in run.context)
    kept = [value for value in stated if value in context]
    tries = len(recaps) + rejected
    return {
        "turns": len(turn_s),
        "turns_failed": kinds.count("error"),
        "recaps": len(recaps),
        "recaps_rejected": rejected,
        "fallbacks": len(distilled) - len(recaps),
        "rejected_share": round(rejected / tries, 3) if tries else None,
        "rejections": rejection_reasons(events),
        "declined": kinds.count("distillation_declined"),
        "recap_chars_median": int(statistics.median(len(r) for r in recaps)) if recaps else None,
        "recap_seconds_median": round(statistics.median(recap_s), 1) if recap_s else None,
        "turn_seconds_median": round(statistics.median(turn_s), 1) if turn_s else None,
        "facts_stated": len(stated),
        "facts_kept": kept,
        "facts_lost": [value for value in stated if value not in kept],
        "goal_met": len(recaps) >= 20 and tries > 0 and rejected / tries <= 0.1,
    }


@standalone_measure(
    "local_recaps",
    "a long chat on the embedded model: the recaps it writes, the tries the prose check rejects, the facts kept",
)
def local_recaps(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed (pip install 'loomrt[local]')"}
    from loomrt.record.sqlite import SQLiteStore
    from loomrt.runtime import Runtime

    model = config.model if config.model and config.model.startswith("local/") else "local/qwen2.5-coder-1.5b"
    inputs = chat_inputs()
    progress.start(f"local recaps · {model} · {len(inputs)} turns", len(inputs))
    with tempfile.TemporaryDirectory() as tmp:
        runtime = Runtime(SQLiteStore(Path(tmp) / "record.sqlite"), embedder=False)
        started = time.perf_counter()
        run, turn_s, recap_s = asyncio.run(play_recaps(runtime, recaps_spec(model), inputs, progress))
        figures = recap_figures(runtime.store, run, turn_s, recap_s)
    return {"model": model, "seconds": round(time.perf_counter() - started, 1), **figures}
