"""``fold/sloppy``: the summariser that gets fold's cards wrong on purpose (loomrt.bench.sloppy)."""

from __future__ import annotations

from loomrt.providers.base import ModelRequest, ModelResponse


def test_sloppy_summariser_spoils_fold_calls_alike_on_every_run() -> None:
    """``fold/sloppy`` (fold only): the summariser's faults are drawn from the seed and the
    prompt, so a run makes the same mistakes every time, and it plants only values its
    source does not hold, in leaf cards only."""
    from loomrt.bench.core import known_variant
    from loomrt.bench.model import BenchModel
    from loomrt.bench.sloppy import SloppySummariser, SummariserOutage
    from loomrt.run.reducers.fold.writer import INSTRUCTIONS

    class Quiet(BenchModel):
        def turn(self, request: ModelRequest) -> ModelResponse:
            return self.respond(request, "ok")

    assert known_variant("fold/sloppy") and not known_variant("recap/sloppy")

    def requests(depth: int) -> list[ModelRequest]:
        return [
            ModelRequest(
                messages=[
                    {"role": "system", "content": INSTRUCTIONS[depth]},
                    {"role": "user", "content": f"TRANSCRIPT START\n[#{i}] user: port 8080 opened at 10:{i:02d}\nEND"},
                ],
                purpose="fold",
            )
            for i in range(60)
        ]

    def play(depth: int) -> tuple[list[str], SloppySummariser]:
        sloppy, out = SloppySummariser(Quiet()), []
        for r in requests(depth):
            try:
                out.append(sloppy(r).text)
            except SummariserOutage:
                out.append("<error>")
        return out, sloppy

    first, sloppy = play(0)
    assert play(0)[0] == first
    assert {"invented", "empty", "error"} <= set(sloppy.faults) and sloppy.faults["calls"] == 60
    assert len(sloppy.planted) == sloppy.faults["invented"] and "8080" not in sloppy.planted
    assert sum(any(v in text for v in sloppy.planted) for text in first) == sloppy.faults["invented"]
    assert play(1)[1].planted == []  # a rollup is not checked for values: nothing is planted there
