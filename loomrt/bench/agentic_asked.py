"""``agentic_asked``: the agentic workload played the hard way (issue 42, item 5).

In ``agentic`` each value is needed by the key of the line that holds it, verbatim; the
Recall query is the harness's key words; and every needle (and only needles and noise) sits
on an ERROR line, so stateful, which notes every ERROR line, equals append by construction.
Here:

- each needle sits on an ordinary log line (INFO or WARN), in words of its own;
- the same result carries two **lookalikes**: lines of the same service, of the same kind
  of value, that share one word of the question each (the needle's line shares two), so a
  reader who no longer sees the needle's line answers from a lookalike, wrongly, without
  recalling;
- the model is told what a step needs as a **question in other words** than the line's
  ("Which script broke orchard's upgrade?" for "schema upgrade halted, the broken script
  is: ..."), and when it recalls, it searches by that question as asked, as the chat's
  reader and the needles measure do.

The gold values stay here, with the workload, which grades the calls the model makes.
"""

from __future__ import annotations

import random

from loomrt.bench import workloads
from loomrt.bench.core import BenchConfig, Progress, WorkloadResult, workload
from loomrt.bench.model import Needle
from loomrt.bench.workloads import Step, agentic_needle, needle_service, play_agentic

__all__ = ["KINDS", "asked_script", "agentic_asked"]

KINDS: list[tuple[str, str, tuple[str, str]]] = [
    # (the needle's line before its value, the question, the two lookalikes' lines): {svc}
    # is the needle's service; a question shares two words with its line, one with each lookalike
    (
        "schema upgrade halted, the broken script is",
        "Which script broke {svc}'s upgrade?",
        ("upgrade dry run passed, checksum file is", "nightly script cache warmed from"),
    ),
    (
        "worker process crashed, exit reason code",
        "What code did {svc}'s worker die with?",
        ("retry budget exhausted, last http code", "worker queue drained, batch id"),
    ),
    (
        "{svc}-db pool limit applied from config",
        "How many connections may {svc}'s database pool open?",
        ("{svc}-db staging template default", "{svc}-db replica sync default"),
    ),
    (
        "replication fell behind on host",
        "Which of {svc}'s hosts lagged in replication?",
        ("replication slot created on primary", "backup snapshot taken from host"),
    ),
    (
        "regression first seen after release",
        "Which {svc}'s release brought the regression?",
        ("canary release promoted", "regression suite green on"),
    ),
    (
        "outage incident opened, tracking ticket",
        "Which ticket follows {svc}'s outage?",
        ("maintenance ticket closed", "outage drill scheduled, reference"),
    ),
]
"""What each kind of needle (``agentic_needle``'s kinds, in order) looks like in this variant."""


def _line(svc: str, text: str, value: str, rng: random.Random) -> str:
    """An ordinary log line of ``svc`` that ends ``text: value``."""
    level = rng.choice(["INFO", "INFO", "WARN", "DEBUG"])
    stamp = f"2026-03-{rng.randint(10, 28)}T0{rng.randint(0, 9)}:{rng.randint(10, 59)}:{rng.randint(10, 59)}Z"
    return f"{stamp} {level} {svc}[{rng.randint(100, 999)}]: {text}: {value}"


def asked_script(
    seed: int, *, steps: int = 150, needles: int = 18, huge: int = 3
) -> tuple[str, str, list[Step], list[Needle]]:
    """:func:`~loomrt.bench.workloads.agentic_script` with this variant's needles: asked by a
    paraphrased question, stated on an ordinary line among two lookalikes."""
    which: dict[str, int] = {}  # a needle's value -> its index (the planter's, never the model's)

    def needle(i: int, rng: random.Random) -> Needle:
        n, svc = agentic_needle(i, rng), needle_service(i)
        line, question, _ = KINDS[i % len(KINDS)]
        which[n.value] = i
        return Needle(line.format(svc=svc), n.value, question=question.format(svc=svc), kind=n.kind)

    def plant(n: Needle, _step_svc: str, rng: random.Random) -> list[str]:
        i = which[n.value]
        svc = needle_service(i)
        out = [_line(svc, n.key, n.value, rng)]
        for text in KINDS[i % len(KINDS)][2]:
            value = n.value
            while value == n.value:
                value = agentic_needle(i, rng).value  # the same kind of value, for the same service
            out.append(_line(svc, text.format(svc=svc), value, rng))
        return out

    return workloads.agentic_script(seed, steps=steps, needles=needles, huge=huge, needle=needle, plant=plant)


@workload(
    "agentic_asked",
    "agentic with needles on ordinary lines among lookalikes, asked in other words, recalled by the question",
)
def agentic_asked(config: BenchConfig, progress: Progress) -> WorkloadResult:
    """One one-shot run per mode, as ``agentic``; only how needles are stated and asked differs."""
    steps, n_needles, huge = (40, 6, 1) if config.quick else (150, 18, 3)
    generated = asked_script(config.seed, steps=steps, needles=n_needles, huge=huge)
    return play_agentic(config, progress, "agentic_asked", generated)
