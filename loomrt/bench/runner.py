"""Run the selected workloads and measures and gather every figure into one JSON object."""

from __future__ import annotations

import datetime as _dt
import platform
import time
from typing import Any

from loomrt.bench.core import (
    MEASURES,
    REFERENCE_RATIOS,
    WORKLOADS,
    BenchConfig,
    ModeRun,
    NullProgress,
    Progress,
    WorkloadResult,
)

__all__ = ["DEFAULT_TARGETS", "available_targets", "run_bench", "workload_figures"]

DEFAULT_TARGETS = [
    "chat200",
    "chat200_lead",
    "agentic",
    "agentic_asked",
    "locomo",
    "curves",
    "overhead",
    "concurrency",
    "recall_latency",
    "recall_scale",
    "recall_clusters",
    "recall_needles",
    "recall_inject",
    "mcp",
    "fanout",
    "audit",
    "integrity",
    "fork_cost",
    "store",
    "ui",
]
"""What ``loomrt bench run`` runs when no workload is named (locomo only with ``--data``)."""


def _load() -> None:
    # registration happens on import
    import loomrt.bench.agentic_asked  # noqa: F401
    import loomrt.bench.audit_measure  # noqa: F401
    import loomrt.bench.curves  # noqa: F401
    import loomrt.bench.fanout  # noqa: F401
    import loomrt.bench.fork_measure  # noqa: F401
    import loomrt.bench.harvest_speed  # noqa: F401
    import loomrt.bench.inject_measure  # noqa: F401
    import loomrt.bench.integrity_measure  # noqa: F401
    import loomrt.bench.load  # noqa: F401
    import loomrt.bench.local_chat  # noqa: F401
    import loomrt.bench.local_recaps  # noqa: F401
    import loomrt.bench.local_speed  # noqa: F401
    import loomrt.bench.locomo  # noqa: F401
    import loomrt.bench.mcp_measure  # noqa: F401
    import loomrt.bench.measures  # noqa: F401
    import loomrt.bench.recall_clusters  # noqa: F401
    import loomrt.bench.store_measure  # noqa: F401
    import loomrt.bench.ui_measure  # noqa: F401
    import loomrt.bench.workloads  # noqa: F401


def available_targets() -> dict[str, str]:
    """Every workload and standalone measure by name, with its description."""
    _load()
    out = {name: w.description for name, w in WORKLOADS.items()}
    out.update({name: m.description for name, m in MEASURES.items() if m.kind == "standalone"})
    return out


def workload_figures(result: WorkloadResult, config: BenchConfig) -> dict[str, Any]:
    """Apply every mode measure to every run of ``result``."""
    base = result.runs.get("append")
    backstop = result.runs.get("append/backstop")
    modes: dict[str, Any] = {}
    for mode, run in result.runs.items():
        figures: dict[str, Any] = {
            "resolved": run.resolved,
            "status": run.status,
            "seconds": round(run.seconds, 2),
        }
        if run.error:
            figures["error"] = run.error
        for m in MEASURES.values():
            if m.kind == "mode":
                figures.update(m.fn(run, base, config))
        if backstop is not None:
            figures["ratio_backstop"] = _ratio(_input(run), _input(backstop))
        run.figures = figures
        modes[mode] = figures
    return {
        "unit": result.unit,
        "params": result.params,
        "modes": modes,
        "series": {mode: run.series for mode, run in result.runs.items()},
        **result.extra,
    }


def _input(run: ModeRun) -> int:
    return sum(c["input_tokens"] for c in run.calls)


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def run_bench(targets: list[str] | None, config: BenchConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run ``targets`` (workload and standalone-measure names; default :data:`DEFAULT_TARGETS`).

    A workload whose input is missing (locomo without ``--data``) or a measure whose
    dependency is not installed is reported under ``skipped`` with the reason; one that
    raises is reported under ``failed`` (with the error), and the others still run.
    """
    _load()
    progress = progress or NullProgress()
    explicit = bool(targets)
    targets = list(targets or DEFAULT_TARGETS)
    if not explicit and config.model and config.model.startswith("local/"):
        targets.append("local_overhead")  # the runtime's cost over bare llama.cpp, on the same model
    unknown = [t for t in targets if t not in WORKLOADS and not (t in MEASURES and MEASURES[t].kind == "standalone")]
    if unknown:
        known = ", ".join(available_targets())
        raise ValueError(f"unknown workload or measure {', '.join(unknown)}. Known: {known}")
    started = time.perf_counter()
    out: dict[str, Any] = {
        "loomrt_bench": 1,
        "when": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": _cpus(),
            "load_before": _load_avg(),
        },
        "config": config.to_json(),
        "reference_ratios": REFERENCE_RATIOS,
        "workloads": {},
        "measures": {},
        "skipped": {},
        "failed": {},
    }
    for name in targets:
        if name in WORKLOADS:
            w = WORKLOADS[name]
            if w.needs and not getattr(config, w.needs):
                why = f"needs --{w.needs}"
                if explicit:
                    raise ValueError(f"the {name} workload {why} (e.g. --data path/to/locomo.json)")
                out["skipped"][name] = why
                continue
            progress.note(f"workload {name}")
            try:
                out["workloads"][name] = workload_figures(w.play(config, progress), config)
            except Exception as exc:  # noqa: BLE001 - one broken target never loses the others' figures
                out["failed"][name] = f"{type(exc).__name__}: {exc}"
                progress.note(f"{name} failed: {out['failed'][name]}")
        else:
            progress.note(f"measure {name}")
            try:
                figures = MEASURES[name].fn(config, progress)
            except Exception as exc:  # noqa: BLE001
                out["failed"][name] = f"{type(exc).__name__}: {exc}"
                progress.note(f"{name} failed: {out['failed'][name]}")
                continue
            if "skipped" in figures:
                out["skipped"][name] = figures["skipped"]
            else:
                out["measures"][name] = figures
    out["seconds"] = round(time.perf_counter() - started, 1)
    out["machine"]["load_after"] = _load_avg()
    return out


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _load_avg() -> float | None:
    """The 1-minute load average: timings on a busy machine are not comparable."""
    import os

    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
