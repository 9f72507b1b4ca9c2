"""The harness: a registry of workloads and measures, and what one benchmark run produces.

A **workload** plays the same scenario once per retention mode and returns a
:class:`WorkloadResult` (one :class:`ModeRun` per mode). A **mode measure** turns a
:class:`ModeRun` (and the append run beside it) into figures; a **standalone measure**
(runtime overhead, Recall latency) needs no workload. New modes appear by themselves
(every mode in :data:`loomrt.spec.RETENTION_MODES`, plus ``auto``); later issues add
workloads and measures with the decorators::

    @workload("forks", "a run forked at every boundary")
    def forks(config: BenchConfig, progress: Progress) -> WorkloadResult: ...

    @mode_measure("fork_cost")
    def fork_cost(run: ModeRun, base: ModeRun | None, config: BenchConfig) -> dict: ...
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "BenchConfig",
    "Progress",
    "NullProgress",
    "Probe",
    "ModeRun",
    "WorkloadResult",
    "Workload",
    "Measure",
    "WORKLOADS",
    "MEASURES",
    "workload",
    "mode_measure",
    "standalone_measure",
    "all_modes",
    "VARIANTS",
    "DEFAULT_VARIANTS",
    "split_variant",
    "known_variant",
    "soft_pct",
    "REFERENCE_RATIOS",
    "timed",
]

REFERENCE_RATIOS: dict[str, float] = {"compaction": 0.45, "recap": 0.30, "stateful": 0.20}
"""Input-token ratios to append at 200 turns, from the design this project follows."""


VARIANTS: dict[str, str] = {
    "no-recall": "the mode with context.recall off: what its working context alone keeps",
    "inject": "the mode with recall injection on (the runtime recalls before each call) and the Recall tool offered",
    "inject-only": "the mode with recall injection on and the Recall tool not offered: what the runtime's own recall "
    "brings back (a plain MODE offers the tool and injects nothing)",
    "backstop": "append with the compaction backstop in the model's window (append only)",
    "no-tools": "fold without its Describe, Expand and Grep tools: the cards and Recall alone (fold only)",
    "cards-only": "fold with neither its Describe, Expand and Grep tools nor Recall: what its cards alone keep "
    "(fold only; fold/no-recall still Greps the raw record, fold/no-tools still recalls)",
    "no-defer": "fold without cache-idle deferral (fold.cache_idle_s: 0): it folds at the soft watermark, as a run "
    "whose prompt cache went cold between turns does (fold only)",
    "sloppy": "fold with a summariser that invents a value in some leaf cards and fails some calls (an empty reply, "
    "or a provider error), drawn from the seed: what the verified-card check catches and the fallback path "
    "writes (fold only)",
    "soft-N": "fold/no-defer with fold.soft_pct N (10 to 99; its target the smaller of 25 and N): how fold's input "
    "moves with its watermark (fold only; not played by default)",
}
"""Options a workload can play a mode with, written ``MODE/OPTION``."""

DEFAULT_VARIANTS = [
    "append/backstop",
    "recap/no-recall",
    "compaction/no-recall",
    "stateful/no-recall",
    "fold/no-recall",
    "fold/no-tools",
    "fold/cards-only",
    "fold/no-defer",
    "fold/sloppy",
    "recap/inject-only",
    "compaction/inject-only",
    "stateful/inject-only",
    "fold/inject-only",
]
"""The variants ``loomrt bench run`` plays besides the modes (chat200 and agentic)."""


def split_variant(name: str) -> tuple[str, str | None]:
    """``"recap/no-recall"`` → ``("recap", "no-recall")``; a plain mode → ``(mode, None)``."""
    base, _, option = name.partition("/")
    return base, option or None


def known_variant(name: str) -> bool:
    """Whether ``name`` is a mode, or a mode with a known option (``backstop`` only on append)."""
    base, option = split_variant(name)
    if base not in all_modes():
        return False
    if soft_pct(option) is not None:
        return base == "fold"
    only = {"backstop": "append", "no-tools": "fold", "cards-only": "fold", "no-defer": "fold", "sloppy": "fold"}
    if option in ("inject", "inject-only") and base == "append":
        return False
    return option is None or option in VARIANTS and only.get(option, base) == base


def soft_pct(option: str | None) -> int | None:
    """N of a ``soft-N`` option (10 to 99), else None."""
    match = re.fullmatch(r"soft-(\d{2})", option or "")
    return int(match.group(1)) if match and int(match.group(1)) >= 10 else None


def all_modes() -> list[str]:
    """Every retention mode the runtime knows, append first, then ``auto``."""
    from loomrt.spec import RETENTION_MODES

    return ["append", *[m for m in RETENTION_MODES if m != "append"], "auto"]


@dataclass
class BenchConfig:
    """What to run and how. Every workload reads the fields it needs."""

    modes: list[str] = field(default_factory=lambda: [*all_modes(), *DEFAULT_VARIANTS])
    """The modes (and variants, ``MODE/OPTION``) each workload is played in (append is
    always added: ratios need it)."""
    quick: bool = False
    """A small, fast configuration (fewer turns and steps): the CI smoke test."""
    seed: int = 7
    """The seed every generated workload derives from."""
    budget_tokens: int = 8192
    window_tokens: int = 32768
    """The model's window: the budget of ``append/backstop`` (the scripted model's own window is unbounded)."""
    keep_last_n: int = 6
    recall: bool = True
    """context.recall for every mode (fidelity counts what Recall returns)."""
    cache_discount: float = 0.10
    """The price of a cached input token as a fraction of an uncached one."""
    model: str | None = None
    """A real model (litellm string, or local/...) instead of the scripted one."""
    data: Path | None = None
    """A LoCoMo-format JSON file (the locomo workload needs it)."""
    conversations: list[str] | None = None
    """LoCoMo sample ids to replay (default: the first one with --quick, else all)."""
    embedder: str = "default"
    """Recall's embedder: ``default`` (recall's own), ``hash`` (deterministic, fast) or ``none``."""
    overhead_sizes: list[int] = field(default_factory=lambda: [100, 1000, 10000])
    """History lengths (messages) at which the runtime overhead is measured."""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["data"] = str(self.data) if self.data else None
        return out

    def make_embedder(self) -> Any:
        """The embedder to hand to the runtime: None lets recall choose its default (MiniLM)."""
        return None if self.embedder == "default" else self.embedder

    def play_embedder(self) -> Any:
        """The embedder of the workloads played in every mode (chat200, chat200_lead, agentic,
        agentic_asked, locomo): the one :meth:`make_embedder` names, behind a cache of vectors
        this config's modes share, so a chat played in 19 modes and variants is embedded once.
        Their figures are tokens and answers; a timed measure takes :meth:`make_embedder`'s, cold."""
        if "_play_embedder" not in self.__dict__:  # not a field: to_json leaves it out
            from loomrt.recall.embedders import NO_EMBEDDER, CachedEmbedder, resolve_embedder

            inner = resolve_embedder(self.make_embedder())
            self.__dict__["_play_embedder"] = NO_EMBEDDER if inner is None else CachedEmbedder(inner)
        return self.__dict__["_play_embedder"]


class Progress(Protocol):
    """Where the harness reports progress (the CLI draws a rich bar; tests pass NullProgress)."""

    def start(self, label: str, total: int) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def note(self, text: str) -> None: ...


class NullProgress:
    """Progress that goes nowhere; ``notes`` keeps what was said."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass(frozen=True)
class Probe:
    """A planted value to look for at the end of a run: in the working context, or via Recall."""

    query: str
    needles: tuple[str, ...]
    """Any of these found verbatim counts as a hit."""
    label: str = ""


@dataclass
class ModeRun:
    """One workload played in one mode: the figures the measures read, taken from the run."""

    mode: str
    resolved: str = ""
    status: str = ""
    error: str | None = None
    seconds: float = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Per model call, in order: purpose, input_tokens, output_tokens, messages (the prompt)."""
    series: list[int] = field(default_factory=list)
    """Cumulative input tokens after each unit of the workload (a turn, or an iteration)."""
    distillations: int = 0
    declined: int = 0
    found: list[str] = field(default_factory=list)
    """Per probe: ``context``, ``recall`` or ``lost``."""
    answered: list[bool] = field(default_factory=list)
    """Per question asked during the run: whether the model had the value when it needed it."""
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorkloadResult:
    """What a workload produced: one :class:`ModeRun` per mode, and workload-level figures."""

    name: str
    unit: str
    """What one point of a series is: ``turn`` or ``iteration``."""
    runs: dict[str, ModeRun] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    """How the workload was generated (turns, facts, sizes): printed with the figures."""


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    play: Callable[[BenchConfig, Progress], WorkloadResult]
    needs: str | None = None
    """A config field the workload cannot run without (e.g. ``data``)."""


@dataclass(frozen=True)
class Measure:
    name: str
    description: str
    kind: str
    """``mode`` (figures per ModeRun) or ``standalone`` (its own run)."""
    fn: Callable[..., dict[str, Any]]


WORKLOADS: dict[str, Workload] = {}
MEASURES: dict[str, Measure] = {}


def workload(
    name: str, description: str, *, needs: str | None = None
) -> Callable[[Callable[..., WorkloadResult]], Callable[..., WorkloadResult]]:
    """Register a workload: ``fn(config, progress) -> WorkloadResult``."""

    def wrap(fn: Callable[..., WorkloadResult]) -> Callable[..., WorkloadResult]:
        WORKLOADS[name] = Workload(name, description, fn, needs)
        return fn

    return wrap


def mode_measure(
    name: str, description: str
) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]]:
    """Register a per-mode measure: ``fn(run, append_run_or_None, config) -> figures``."""

    def wrap(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        MEASURES[name] = Measure(name, description, "mode", fn)
        return fn

    return wrap


def standalone_measure(
    name: str, description: str
) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]]:
    """Register a measure with its own run: ``fn(config, progress) -> figures`` (or ``{"skipped": why}``)."""

    def wrap(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        MEASURES[name] = Measure(name, description, "standalone", fn)
        return fn

    return wrap


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started
