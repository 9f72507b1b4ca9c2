"""Benchmarks: what each retention mode costs and what it still remembers.

Workloads (``chat200``, ``agentic``, ``locomo``) are played once per mode on real runs of
the runtime, driven by a scripted model whose token counts are exact; measures turn each
run into figures (input tokens and the ratio to append, cache-adjusted cost, fidelity) or
run on their own (runtime overhead, Recall latency). Add a workload or a measure with
:func:`workload`, :func:`mode_measure` or :func:`standalone_measure`. From the shell:
``loomrt bench run``; from Python::

    from loomrt.bench import BenchConfig, run_bench
    results = run_bench(["chat200"], BenchConfig(quick=True, embedder="hash"))
"""

from loomrt.bench.core import (
    MEASURES,
    REFERENCE_RATIOS,
    WORKLOADS,
    BenchConfig,
    ModeRun,
    Probe,
    WorkloadResult,
    mode_measure,
    standalone_measure,
    workload,
)
from loomrt.bench.runner import available_targets, run_bench

__all__ = [
    "BenchConfig",
    "MEASURES",
    "ModeRun",
    "Probe",
    "REFERENCE_RATIOS",
    "WORKLOADS",
    "WorkloadResult",
    "available_targets",
    "mode_measure",
    "run_bench",
    "standalone_measure",
    "workload",
]
