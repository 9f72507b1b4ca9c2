"""The ``locomo`` workload: a LoCoMo-format file replayed turn by turn in every mode.

Each turn of a conversation is one user input (``[date] Speaker: text``, as
:func:`loomrt.bench.locomo_recall.render_turn` writes it) and the scripted model acknowledges it
briefly; distillations write fixed-size summaries of the most recent lines. The figures per
mode are the same as for the generated workloads; the probes are the answerable questions
(categories 1-4) whose evidence turns were replayed, a hit being any evidence turn's text
found verbatim. Evidence recall@k comes from :func:`loomrt.bench.locomo_recall.evaluate_locomo`.
The file is read from the path given; nothing of it is copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loomrt.bench.core import BenchConfig, ModeRun, Probe, Progress, WorkloadResult, workload
from loomrt.bench.model import BenchModel
from loomrt.bench.play import bench_spec, play_mode
from loomrt.bench.workloads import raise_failed, with_append
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.run.state import RunState
from loomrt.runtime import Runtime

__all__ = ["locomo", "ListenerModel"]

SYSTEM = (
    "You are listening to a long conversation between two friends, turn by turn. Acknowledge each turn "
    "in a few words; later you will be asked about what they said."
)


@dataclass
class ListenerModel(BenchModel):
    """Acknowledges every turn with the same few words."""

    def turn(self, request: ModelRequest) -> ModelResponse:
        return self.act(request, text="Noted; go on.")


def _samples(config: BenchConfig) -> list[tuple[str, dict[str, Any]]]:
    from loomrt.bench.locomo_recall import load_locomo, sample_id

    samples = [(sample_id(s, i), s) for i, s in enumerate(load_locomo(config.data))]  # type: ignore[arg-type]
    if config.conversations:
        wanted = set(config.conversations)
        missing = wanted - {cid for cid, _ in samples}
        if missing:
            raise ValueError(f"no conversation {', '.join(sorted(missing))} in {config.data}")
        return [(cid, s) for cid, s in samples if cid in wanted]
    return samples[:1] if config.quick else samples


@workload("locomo", "a LoCoMo-format file replayed turn by turn in every mode, plus evidence recall@k", needs="data")
def locomo(config: BenchConfig, progress: Progress) -> WorkloadResult:
    """Replays the first conversation chosen in every mode (``--quick``: its first 150 turns),
    and measures evidence recall@k over every conversation chosen."""
    from loomrt.bench.locomo_recall import ANSWERABLE, evaluate_locomo, evidence_ids, render_turn, turns_of

    chosen = _samples(config)
    cid, sample = chosen[0]
    turns = turns_of(sample)[: 150 if config.quick else None]
    text_of = {t.dia_id: t.text for t in turns}
    probes = []
    for q in sample["qa"]:
        ids = evidence_ids(q.get("evidence"))
        if q.get("category") in ANSWERABLE and ids and ids <= set(text_of):
            probes.append(Probe(str(q["question"]), tuple(text_of[i] for i in sorted(ids)), str(q.get("category"))))
    inputs = [render_turn(t) for t in turns]
    result = WorkloadResult(
        "locomo",
        "turn",
        params={
            "file": str(config.data),
            "replayed": cid,
            "turns": len(turns),
            "probes": len(probes),
            "conversations": [c for c, _ in chosen],
        },
    )

    async def drive(runtime: Runtime, run: RunState, model: BenchModel | None, out: ModeRun) -> None:
        for text in inputs:
            res = await runtime.send(run, text)
            progress.advance()
            if res.status == "failed":
                raise_failed(res.error)

    for mode in with_append(config.modes):
        progress.start(f"locomo {cid} · {mode}", len(inputs))
        result.runs[mode] = play_mode(
            config,
            mode,
            spec=bench_spec(config, mode, system=SYSTEM),
            drive=drive,
            probes=probes,
            make_model=lambda: ListenerModel(seed=config.seed),
            unit="turn",
            interactive=True,
            local=True,
            name="locomo",
        )

    assert config.data is not None  # the workload runs only with --data
    total = sum(len(turns_of(s)) + len(s["qa"]) for _, s in chosen)
    for key, replies, mode in (
        ("evidence_recall", False, "compaction"),
        ("evidence_recall_chat", True, "compaction"),
        ("evidence_recall_fold", False, "fold"),
    ):
        progress.start(f"locomo evidence recall@k · {mode} · {'chat' if replies else 'observer'} replay", total)
        last = {"done": 0}

        def tick(done: int, _total: int, _what: str, last: dict[str, int] = last) -> None:
            progress.advance(done - last["done"])
            last["done"] = done

        result.extra[key] = evaluate_locomo(
            config.data,
            conversations=[c for c, _ in chosen],
            embedder=config.play_embedder(),
            progress=tick,
            replies=replies,
            mode=mode,
        )
    return result
