"""Playing one workload in one mode: a real runtime, a recorded provider, probes at the end.

:func:`play_mode` builds the agent definition every mode shares (``budget_tokens``,
``keep_last_n``, ``recall``), starts a run on a fresh in-memory record, lets the workload
drive it, and reads the figures back from the record and the provider's requests.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from loomrt.bench.core import BenchConfig, ModeRun, Probe, soft_pct, split_variant
from loomrt.bench.model import BenchModel, prompt_text
from loomrt.bench.sloppy import SloppySummariser, invented_in_cards
from loomrt.errors import LoomError
from loomrt.events import message_of
from loomrt.messages import Message
from loomrt.providers.base import ModelProvider, ModelRequest, ModelResponse, ToolSchema
from loomrt.record.sqlite import SQLiteStore
from loomrt.run.state import RunState
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import FunctionProvider
from loomrt.tokens import count_dicts, count_messages, count_tools
from loomrt.tools import Tool

__all__ = [
    "Recorder",
    "prompt_parts",
    "DISTILLED",
    "recall_available",
    "bench_spec",
    "play_mode",
    "probe_run",
    "folding_figures",
    "STATE_SCHEMA",
]

STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "notes": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "default": {},
            "description": "Exact values worth keeping (paths, codes, numbers, names), by what they are.",
        },
    },
    "required": ["notes"],
}
"""Σ for the stateful mode in every workload: the exact values the agent keeps."""

Drive = Callable[[Runtime, RunState, BenchModel | None, ModeRun], Awaitable[None]]


class Recorder:
    """Wraps a provider and keeps, per call, its purpose, usage and the cached prefix.

    The cached prefix of a call is the run of leading messages identical to the previous
    call's prompt (any purpose: a distillation call in between breaks the cache, as it does
    on a provider), and the tool schemas when they are the previous call's (providers put
    them first in the cached prefix), in estimated tokens.
    """

    def __init__(self, inner: ModelProvider):
        self.inner = inner
        self.model = inner.model
        self.capabilities = inner.capabilities
        self.calls: list[dict[str, Any]] = []
        self._previous: list[dict[str, Any]] = []
        self._previous_tools: tuple[ToolSchema, ...] = ()
        self.run: RunState | None = None
        """The run whose turn prompts are split into parts (:func:`prompt_parts`), once started."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        parts = prompt_parts(self.run.context, request) if self.run is not None and request.purpose == "turn" else None
        response = await self.inner.complete(request)
        messages = request.messages
        k = 0
        while k < min(len(messages), len(self._previous)) and messages[k] == self._previous[k]:
            k += 1
        cached = count_dicts(messages[:k]) - 3 if k else 0
        if request.tools and request.tools == self._previous_tools:  # providers cache the schemas first
            cached += count_tools(request.tools)
        self._previous, self._previous_tools = messages, request.tools
        self.calls.append(
            {
                "purpose": request.purpose,
                "input_tokens": response.usage.input_tokens,
                "output_tokens": response.usage.output_tokens,
                "cached_prefix_tokens": min(cached, response.usage.input_tokens),
                "messages": len(messages),
                "recall_call": any(_calls_recall(c) for c in response.tool_calls),
                **({"parts": parts} if parts else {}),
            }
        )
        return response


DISTILLED = frozenset({"recap", "summary", "card", "state"})
"""The ``synthetic`` tags of what a distillation put in the working context."""


def prompt_parts(context: list[Message], request: ModelRequest) -> dict[str, int] | None:
    """A turn prompt's estimated tokens by part: ``head`` (the system prompt, the pinned task
    and pins), ``tools`` (the schemas offered), ``distilled`` (recaps, summaries, cards, Σ)
    and ``raw`` (the record's messages as said, whole, cut or held as a reference). None when
    the prompt is not the working context (a length that differs)."""
    if len(context) != len(request.messages):
        return None
    parts = {"head": 0, "tools": count_tools(request.tools), "distilled": 0, "raw": 0}
    for m in context:
        part = (
            "distilled"
            if m.synthetic in DISTILLED
            else "head"
            if m.role == "system" or m.pinned or m.synthetic == "pin"
            else "raw"
        )
        parts[part] += count_messages([m])
    return parts


def _calls_recall(call: Any) -> bool:
    """A Recall call, directly or as the action of an ``emit_state`` call."""
    if call.name == "Recall":
        return True
    action = call.arguments.get("action") if isinstance(call.arguments, dict) else None
    return isinstance(action, dict) and action.get("tool") == "Recall"


def recall_available() -> bool:
    """Whether ``loomrt.recall`` can index evicted spans (the recall issue has landed)."""
    try:
        from loomrt.recall import RunRecall  # noqa: F401
    except ImportError:
        return False
    return True


def bench_spec(
    config: BenchConfig,
    mode: str,
    *,
    system: str,
    tools: list[str] | None = None,
    max_iterations: int = 20,
    max_tokens: int = 1024,
) -> AgentSpec:
    """The definition every mode of a workload shares; only the context block differs.

    ``mode`` is a retention mode or a variant of one (:func:`~loomrt.bench.core.split_variant`):
    ``MODE/no-recall`` turns Recall off, ``fold/no-tools`` fold's Describe, Expand and Grep,
    ``fold/cards-only`` both (what fold's cards alone keep),
    ``fold/no-defer`` its cache-idle deferral (every fold at the soft watermark), ``fold/soft-N``
    the same with ``fold.soft_pct`` N, ``fold/sloppy`` its summariser spoilt on purpose
    (:mod:`loomrt.bench.sloppy`, in :func:`play_mode`); ``append/backstop`` is append with the compaction backstop
    in the model's window (``config.window_tokens``): the baseline that could run.
    """
    base, option = split_variant(mode)
    backstop, soft = option == "backstop", soft_pct(option)
    recall = config.recall and option not in ("no-recall", "cards-only") and recall_available()
    return AgentSpec(
        model=config.model or "bench/scripted",
        system_prompt=system,
        tools=list(tools or []),
        max_iterations=max_iterations,
        max_tokens=max_tokens,
        context={
            "mode": base,
            "budget_tokens": config.window_tokens if backstop else config.budget_tokens,
            "backstop": backstop,
            "keep_last_n": config.keep_last_n,
            "recall": recall,
            # a plain MODE offers the Recall tool alone, as published before injection existed
            "recall_inject": "on" if option in ("inject", "inject-only") and recall else "off",
            "recall_tool": option != "inject-only",
            "state_schema": STATE_SCHEMA,
            # a scripted run plays hours of conversation in seconds: the per-10-minute spend
            # guard would turn most cards into fallbacks, which no real run at this pace sees
            "fold": {
                "max_calls_per_10min": 10_000,
                "tools": option not in ("no-tools", "cards-only"),
                **({"cache_idle_s": 0} if option == "no-defer" or soft is not None else {}),
                **({"soft_pct": soft, "target_pct": min(25, soft)} if soft is not None else {}),
            },
        },
    )


def _provider(
    config: BenchConfig,
    spec: AgentSpec,
    model: Callable[[ModelRequest], ModelResponse] | None,
    *,
    local: bool,
) -> ModelProvider:
    if model is not None:
        return FunctionProvider(model, local=local, context_window=10**7, name="bench/scripted")  # append unbounded
    from loomrt.providers import resolve_provider

    return resolve_provider(spec, config.model)


async def probe_run(run: RunState, probes: list[Probe]) -> list[str]:
    """For each probe: ``context`` if a needle is in the final working context verbatim,
    ``recall`` if Recall (top 5, the probe's paraphrased query) returns it verbatim in a
    result that is not one of the run's own answers (role ``assistant``), else ``lost``."""
    context = prompt_text([m.to_litellm() for m in run.context])
    tool = run.toolset.tools.get("Recall")
    found: list[str] = []
    for p in probes:
        if any(n in context for n in p.needles):
            found.append("context")
            continue
        if tool is not None:
            out = json.loads(await tool.call({"query": p.query, "top_k": 5}))
            sources = [r.get("text", "") for r in out.get("results", []) if r.get("role") != "assistant"]
            if any(n in text for n in p.needles for text in sources):
                found.append("recall")
                continue
        found.append("lost")
    return found


def folding_figures(run: RunState, events: list[Any]) -> dict[str, Any]:
    """The folded size (the final working context's tokens ÷ the history's), and for fold
    the cards written, how many are fallbacks, the deepest, the verbatim check's figures, and
    the folds skipped on a summariser's error. ``fold/sloppy`` adds what its summariser
    spoilt (``summariser_faults``) and how many invented values reached a card."""
    history = [m for e in events if (m := message_of(e)) is not None and m.role != "system"]
    out: dict[str, Any] = {"folded_size": round(count_messages(run.context) / max(1, count_messages(history)), 4)}
    cards = [c for e in events if e.kind == "distillation" for c in e.data.get("cards") or ()]
    if cards:
        checks = [e.data.get("verify") or {} for e in events if e.kind == "distillation"]
        out.update(
            cards=len(cards),
            fallback_cards=sum(bool(c.get("fallback")) for c in cards),
            card_depth=max(int(c["depth"]) for c in cards),
            values_checked=sum(v.get("values", 0) for v in checks),
            values_invented=sum(v.get("invented", 0) for v in checks),
            cards_rejected=sum(v.get("rejected", 0) for v in checks),
            folds_skipped=sum(e.kind == "fold_skipped" for e in events),
        )
    return out


def _series(events: list[Any], unit: str) -> list[int]:
    total, series = 0, []
    for e in events:
        if e.kind == "model_call":
            total += int((e.data.get("usage") or {}).get("input_tokens", 0))
            if unit == "iteration" and e.data.get("purpose") == "turn":
                series.append(total)
        elif unit == "turn" and e.kind in ("parked", "final", "error"):
            series.append(total)
    return series


def play_mode(
    config: BenchConfig,
    mode: str,
    *,
    spec: AgentSpec,
    drive: Drive,
    probes: list[Probe],
    make_model: Callable[[], BenchModel],
    unit: str,
    interactive: bool,
    local: bool,
    tools: list[Tool] | None = None,
    name: str = "bench",
) -> ModeRun:
    """Play one workload in ``mode`` on a fresh runtime and read its figures back."""
    model = None if config.model else make_model()
    sloppy = (
        SloppySummariser(model, seed=config.seed) if model is not None and split_variant(mode)[1] == "sloppy" else None
    )
    recorder = Recorder(_provider(config, spec, sloppy or model, local=local))
    runtime = Runtime(
        SQLiteStore(":memory:"),
        providers=lambda s, m: recorder,
        tools=tools or [],
        embedder=config.play_embedder(),
    )
    out = ModeRun(mode=mode)
    started = time.perf_counter()

    async def go() -> None:
        run = await runtime.astart(spec, name=name, interactive=interactive)
        recorder.run = run
        out.resolved = run.mode.name
        try:
            await drive(runtime, run, model, out)
        except LoomError as exc:
            out.error = str(exc)
        out.found = await probe_run(run, probes)
        events = runtime.store.events(run.run_id)
        out.series = _series(events, unit)
        out.distillations = sum(e.kind == "distillation" for e in events)
        out.declined = sum(e.kind == "distillation_declined" for e in events)
        out.figures.update(folding_figures(run, events))
        if sloppy is not None:
            out.figures.update(
                summariser_faults=dict(sloppy.faults), invented_in_cards=invented_in_cards(sloppy.planted, events)
            )
        errors = [e.data.get("message") for e in events if e.kind == "error"]
        out.error = out.error or (errors[-1] if errors else None)
        out.status = "failed" if out.error else "done"

    asyncio.run(go())
    out.seconds = time.perf_counter() - started
    out.calls = recorder.calls
    return out
