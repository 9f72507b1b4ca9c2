"""Smoke tests of the benchmark harness: a small, fast configuration of each workload and
measure, asserting that it runs on the real runtime and that its figures are sane (not
exact timings). The hash embedder stands in for MiniLM."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from loomrt.bench import BenchConfig, run_bench
from loomrt.bench.core import MEASURES, WORKLOADS, NullProgress, Probe, WorkloadResult, mode_measure, workload
from loomrt.bench.play import Recorder, bench_spec, play_mode
from loomrt.bench.workloads import ChatModel, agentic_script, chat_script
from loomrt.providers.base import ModelRequest, ModelResponse, Usage
from loomrt.testing import FunctionProvider

LOCOMO_MINI = Path(__file__).parent / "data" / "locomo-mini.json"
DISTILLING = ("recap", "compaction")


@pytest.fixture(scope="module")
def quick() -> dict:
    """chat200 and agentic in every mode, quick, played once for the module."""
    return run_bench(["chat200", "agentic"], BenchConfig(quick=True, embedder="hash"))


@pytest.mark.slow
def test_every_mode_is_played_and_append_is_the_baseline(quick: dict) -> None:
    for name in ("chat200", "agentic"):
        modes = quick["workloads"][name]["modes"]
        assert list(modes) == [
            "append",
            "recap",
            "stateful",
            "compaction",
            "fold",
            "auto",
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
        assert all(f["status"] == "done" for f in modes.values()), {m: f.get("error") for m, f in modes.items()}
        assert modes["append"]["ratio"] == 1.0
        assert modes["append"]["distillations"] == 0


@pytest.mark.slow
def test_distilling_modes_spend_less_than_append(quick: dict) -> None:
    for name in ("chat200", "agentic"):
        modes = quick["workloads"][name]["modes"]
        for mode in DISTILLING:
            f = modes[mode]
            assert f["distillations"] >= 1
            assert 0 < f["ratio"] < 1
            assert f["distillation_input_tokens"] > 0  # a summary call's input is a cost too
            assert f["input_tokens"] < modes["append"]["input_tokens"]
            assert f["peak_prompt_tokens"] < modes["append"]["peak_prompt_tokens"]
            assert f["reference_ratio"] in (0.45, 0.30)
    stateful = quick["workloads"]["agentic"]["modes"]["stateful"]
    assert stateful["distillations"] >= 1 and 0 < stateful["ratio"] < 1


@pytest.mark.slow
def test_auto_resolves_by_provider_tier(quick: dict) -> None:
    assert quick["workloads"]["chat200"]["modes"]["auto"]["resolved"] == "recap"  # local, interactive
    assert quick["workloads"]["agentic"]["modes"]["auto"]["resolved"] == "stateful"  # frontier, with a schema


@pytest.mark.slow
def test_fidelity_and_cache_figures_are_in_bounds(quick: dict) -> None:
    for w in quick["workloads"].values():
        for f in w["modes"].values():
            assert 0 <= f["retrievable"] <= 1
            assert f["in_context"] + f["via_recall"] + f["lost"] == f["probes"] > 0
            assert 0 <= f["answered"] <= 1 and f["questions"] > 0
            assert 0 <= f["cached_share"] <= 1
            assert 0 < f["cache_cost"] <= f["input_tokens"]
        # append keeps everything in its working context, and the reader finds every answer there
        assert w["modes"]["append"]["retrievable"] == w["modes"]["append"]["answered"] == 1.0
        assert w["modes"]["append"]["recall_calls"] == 0
        assert w["modes"]["append"]["in_context"] == w["modes"]["append"]["probes"]


@pytest.mark.slow
def test_a_turn_prompt_is_split_into_its_parts_and_tool_schemas_are_paid_for(quick: dict) -> None:
    for name, w in quick["workloads"].items():
        modes = w["modes"]
        parts = {m: f["prompt_parts"] for m, f in modes.items()}
        assert parts["append"]["distilled"] == 0 and parts["append"]["raw"] > parts["recap"]["raw"], name
        for mode in ("recap", "compaction", "fold"):
            assert parts[mode]["distilled"] > 0, (name, mode)
        # Recall's schema, and fold's Describe, Expand and Grep, are on every call that offers them
        assert parts["recap"]["tools"] > parts["recap/no-recall"]["tools"]
        assert parts["fold"]["tools"] > parts["fold/no-tools"]["tools"]

    # a provider bills the schemas: the same prompt with a tool reports more input tokens
    from loomrt.bench.model import schema_tokens
    from loomrt.bench.workloads import ChatModel
    from loomrt.providers.base import ModelRequest, ToolSchema

    tool = ToolSchema("Grep", "Search the exact words of this run's history.", {"type": "object", "properties": {}})
    messages = [{"role": "user", "content": "What is my door code?"}]
    bare = ChatModel(seed=7).respond(ModelRequest(messages=messages), "4417")
    offered = ChatModel(seed=7).respond(ModelRequest(messages=messages, tools=(tool,)), "4417")
    assert offered.usage.input_tokens - bare.usage.input_tokens == schema_tokens((tool,)) > 5


@pytest.mark.slow
def test_fold_without_deferral_folds_at_the_soft_watermark(quick: dict) -> None:
    """fold/no-defer (cache_idle_s 0) folds as soon as a chat's pressure passes soft_pct; plain
    fold, never idle in a bench, waits for the 85% escape: more folds, a smaller raw tail."""
    chat = quick["workloads"]["chat200"]["modes"]
    assert chat["fold/no-defer"]["distillations"] > chat["fold"]["distillations"]
    assert chat["fold/no-defer"]["prompt_parts"]["raw"] < chat["fold"]["prompt_parts"]["raw"]
    assert chat["fold/no-defer"]["input_tokens"] < chat["fold"]["input_tokens"]
    assert chat["fold/no-defer"]["answered"] >= 0.9


def test_fold_soft_n_is_no_defer_at_another_watermark() -> None:
    """``fold/soft-N`` (the watermark sweep in docs/benchmarks.md): fold only, N from 10 to 99,
    no deferral, the target no higher than the watermark."""
    from loomrt.bench.core import known_variant

    assert known_variant("fold/soft-50") and known_variant("fold/soft-99")
    assert not any(map(known_variant, ["recap/soft-50", "fold/soft-5", "fold/soft-100", "fold/soft-x"]))
    fold = bench_spec(BenchConfig(), "fold/soft-20", system="s").context.fold
    assert (fold.soft_pct, fold.fold_target_pct, fold.cache_idle_s) == (20, 20, 0)
    assert bench_spec(BenchConfig(), "fold/soft-60", system="s").context.fold.fold_target_pct == 25


@pytest.mark.slow
def test_series_are_cumulative_per_unit(quick: dict) -> None:
    chat = quick["workloads"]["chat200"]
    for mode, series in chat["series"].items():
        assert len(series) == chat["params"]["turns"]
        assert all(b > a for a, b in zip(series, series[1:], strict=False)), mode
        assert series[-1] == chat["modes"][mode]["input_tokens"]
    agentic = quick["workloads"]["agentic"]
    assert len(agentic["series"]["append"]) == agentic["params"]["steps"] + 1  # every step, then the answer


@pytest.mark.slow
def test_token_counts_are_exact_and_repeatable(quick: dict) -> None:
    again = run_bench(["chat200"], BenchConfig(quick=True, embedder="hash", modes=["append", "compaction"]))
    for mode in ("append", "compaction"):
        assert (
            again["workloads"]["chat200"]["modes"][mode]["input_tokens"]
            == (quick["workloads"]["chat200"]["modes"][mode]["input_tokens"])
        )


def test_the_longest_curve_point_can_be_generated() -> None:
    from loomrt.bench.curves import LENGTHS, _facts

    _, script, needles = chat_script(7, turns=max(LENGTHS), facts=_facts(max(LENGTHS)))
    assert len(script) == max(LENGTHS) and len(needles) == 60
    with pytest.raises(ValueError, match="61 facts asked"):
        chat_script(7, turns=400, facts=61)


def test_generated_workloads_have_the_advertised_shape() -> None:
    system, script, needles = chat_script(3, turns=200, facts=40)
    assert len(script) == 200 and len(needles) == 40 == len({n.value for n in needles})
    asked = [i for i, t in enumerate(script) if t.asks]
    stated = [i for i, t in enumerate(script) for n in needles if n.value in t.text]
    assert len(asked) == 40 and min(asked) >= 120 and max(stated) < 60
    _, _, steps, planted = agentic_script(3, steps=150, needles=18, huge=3)
    from loomrt.tokens import count_text

    sizes = sorted(count_text(s.output) for s in steps)
    assert sizes[-3] > 4000 > sizes[-4] and sizes[0] < 200
    assert sum(s.needs is not None for s in steps) == 18 == len(planted)
    assert len({n.key for n in planted}) == 18 == len({n.value for n in planted})


def test_recorder_counts_the_prefix_shared_with_the_previous_call() -> None:
    provider = Recorder(FunctionProvider(lambda r: ModelResponse(text="ok", usage=Usage(1000, 1))))
    a = {"role": "system", "content": "rules " * 50}
    b = {"role": "user", "content": "hello " * 30}
    c = {"role": "assistant", "content": "hi"}

    async def go() -> None:
        await provider.complete(ModelRequest(messages=[a, b]))
        await provider.complete(ModelRequest(messages=[a, b, c]))
        await provider.complete(ModelRequest(messages=[b, c], purpose="summary"))
        await provider.complete(ModelRequest(messages=[a, b, c]))

    asyncio.run(go())
    cached = [c["cached_prefix_tokens"] for c in provider.calls]
    assert cached[0] == 0 and cached[2] == 0 and cached[3] == 0  # a distillation call breaks the cache
    assert cached[1] > 50


def test_a_registered_workload_and_measure_join_the_run() -> None:
    @workload("tiny-test", "one chat turn per mode")
    def tiny(config: BenchConfig, progress) -> WorkloadResult:
        system, script, needles = chat_script(config.seed, turns=10, facts=1)
        result = WorkloadResult("tiny-test", "turn")

        async def drive(runtime, run, model, out) -> None:
            for t in script:
                model.current = t.cue
                await runtime.send(run, t.text)

        for mode in ["append", *config.modes]:
            result.runs[mode] = play_mode(
                config,
                mode,
                spec=bench_spec(config, mode, system=system),
                drive=drive,
                probes=[Probe(needles[0].search, (needles[0].value,))],
                make_model=lambda: ChatModel(),
                unit="turn",
                interactive=True,
                local=True,
            )
        return result

    @mode_measure("calls-test", "model calls, again")
    def calls(run, base, config) -> dict:
        return {"calls_again": len(run.calls)}

    try:
        out = run_bench(["tiny-test"], BenchConfig(modes=["recap"], embedder="hash"))
        modes = out["workloads"]["tiny-test"]["modes"]
        assert modes["recap"]["calls_again"] == modes["recap"]["model_calls"] == 10
        assert modes["append"]["retrievable"] == 1.0
    finally:
        WORKLOADS.pop("tiny-test")
        MEASURES.pop("calls-test")


def test_overhead_is_measured_per_history_length() -> None:
    config = BenchConfig(quick=True, overhead_sizes=[20, 400])
    out = run_bench(["overhead"], config)
    points = out["measures"]["overhead"]["points"]
    assert [p["messages"] for p in points] == [20, 400]
    assert all(0 < p["p50_ms"] <= p["p95_ms"] for p in points)


@pytest.mark.slow
def test_recall_measures() -> None:
    out = run_bench(["recall_latency", "recall_scale"], BenchConfig(quick=True, embedder="hash"))
    r = out["measures"]["recall_latency"]
    assert r["entries"] == 1024 and 0 < r["p50_ms"] <= r["p95_ms"]
    big = out["measures"]["recall_scale"]
    assert big["entries"] == 20_000 and 0 < big["p50_ms"] <= big["p95_ms"]  # the index kept every entry


def test_locomo_workload_replays_the_file_in_every_mode() -> None:
    progress = NullProgress()
    config = BenchConfig(quick=True, embedder="hash", data=LOCOMO_MINI, modes=["compaction", "auto"], budget_tokens=400)
    out = run_bench(["locomo"], config, progress)
    w = out["workloads"]["locomo"]
    assert w["params"]["turns"] > 0 and w["params"]["probes"] > 0
    compaction = w["modes"]["compaction"]
    # 12 short turns over a 400-token budget: boundaries are reached, though a fixed-size
    # summary is not smaller than so short a span (declined, and still paid for)
    assert compaction["distillations"] + compaction["declined"] >= 1 and compaction["ratio"] > 0
    assert compaction["status"] == "done" and 0 <= compaction["retrievable"] <= 1
    for key, replay in (("evidence_recall", "observer"), ("evidence_recall_chat", "chat")):
        ev = w[key]
        assert ev["replay"] == replay
        assert ev["questions"] > 0 and set(ev["recall_at"]) == {"1", "3", "5", "10"}
        assert 0 <= ev["recall_at"]["1"] <= ev["recall_at"]["5"] <= ev["recall_at"]["10"] <= 1
        assert all(ev["recall_all_at"][k] <= ev["recall_at"][k] for k in ev["recall_at"])  # all ⊂ any


def test_locomo_without_data_is_skipped_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("loomrt.bench.runner.DEFAULT_TARGETS", ["locomo", "overhead"])
    out = run_bench(None, BenchConfig(quick=True, overhead_sizes=[10]))
    assert list(out["measures"]) == ["overhead"]
    assert out["skipped"]["locomo"] == "needs --data"
    with pytest.raises(ValueError, match="--data"):
        run_bench(["locomo"], BenchConfig(quick=True))
    with pytest.raises(ValueError, match="unknown workload"):
        run_bench(["nope"], BenchConfig(quick=True))


@pytest.mark.slow
def test_a_summary_that_does_not_know_the_probes_loses_values_from_the_context(
    quick: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench can say no: the scripted summariser is blind to the planted values, so a
    distilling mode keeps fewer of them in its working context than the no-distillation
    control, and what it still produces comes partly through Recall (agentic). On the quick
    chat200 every value stays in the context: the runtime carries the earlier block's
    sentences with exact values forward (``summarize.carry_forward``); with nothing carried,
    the same workload loses them and answers through Recall."""
    modes = quick["workloads"]["agentic"]["modes"]
    for mode in ("recap", "compaction"):
        assert modes[mode]["in_context"] < modes["append"]["in_context"], mode
        assert modes[mode]["via_recall"] > 0, mode
    import loomrt.run.reducers.summarize as summarize

    monkeypatch.setattr(summarize, "CARRY_SHARE", 0.0)
    config = BenchConfig(quick=True, embedder="hash", modes=["append", "recap", "compaction"])
    bare = run_bench(["chat200"], config)["workloads"]["chat200"]["modes"]
    carried = quick["workloads"]["chat200"]["modes"]
    for mode in ("recap", "compaction"):
        assert bare[mode]["in_context"] < carried[mode]["in_context"] <= carried["append"]["in_context"], mode
        assert bare[mode]["via_recall"] > 0, mode


def test_the_scripted_summary_is_extractive_and_never_lists_the_planted_values_first() -> None:
    from loomrt.bench.model import BenchModel
    from loomrt.providers.base import ModelRequest

    class Model(BenchModel):
        def turn(self, request):  # pragma: no cover - not called here
            raise AssertionError

    transcript = "\n".join(
        [
            "[#3] user: We talked about the weather for a while. Then other things.",
            "[#5] assistant: Yes, it rained all week. Later the door code came up: 7319-44.",
        ]
    )
    request = ModelRequest(
        messages=[
            {"role": "system", "content": "Summarise."},
            {"role": "user", "content": f"TRANSCRIPT START\n{transcript}\nTRANSCRIPT END"},
        ],
        purpose="summary",
    )
    text = Model().summarize(request)
    assert text.splitlines() == ["[#3] We talked about the weather for a while.", "[#5] Yes, it rained all week."]
    assert "7319-44" not in text  # the value was not in a leading sentence, so it is lost


@pytest.mark.slow
def test_the_bench_can_say_no_without_recall_and_with_an_uninformed_state(quick: dict) -> None:
    """With Recall off, what a distilling mode answers is what its summaries kept: fewer
    answers than the control. The stateful model notes only what the user asked it to note
    (one fact in three), so without Recall it cannot answer the rest."""
    chat = quick["workloads"]["chat200"]["modes"]
    control = chat["append"]["answered"]
    for mode in ("recap", "compaction", "stateful"):
        assert chat[f"{mode}/no-recall"]["answered"] < control, mode
        assert chat[f"{mode}/no-recall"]["recall_calls"] == 0
        assert chat[mode]["recall_calls"] > 0  # it decided to recall from what it saw
    assert chat["stateful/no-recall"]["answered"] <= 0.5
    assert quick["workloads"]["agentic"]["modes"]["append/backstop"]["ratio_backstop"] == 1.0


@pytest.mark.slow
def test_the_scripted_model_is_told_no_gold_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chat and agentic models are walked (every attribute, field, slot, container and
    closure, however deep) before every call they answer, in append, in a mode that distils
    and recalls, and in stateful: no gold value is found. Only the stateful model's notes
    hold values, and only values it read in its prompt (tests/test_sabotage_gold.py shows
    the walk finds one planted)."""
    from gold_kit import gold_during

    for name in ("chat200", "agentic", "agentic_asked"):
        with monkeypatch.context() as patch:
            walked, found = gold_during(name, ["recap", "stateful"], patch)
        assert walked > 100 and not found, (name, found[:5])


def test_the_workload_grades_the_calls_the_agentic_model_makes() -> None:
    """The model's plan holds what each step needs by name, never the value; the workload
    grades the *i*-th call made against step *i*'s planned call, the gold value in place."""
    import json

    from loomrt.bench.workloads import NEEDED, grade_plan

    _, _, script, needles = agentic_script(3, steps=40, needles=6, huge=1)
    moves = [s.move for s in script]
    assert not [n.value for n in needles for m in moves if n.value in json.dumps(m.arguments)]
    assert sum(NEEDED in json.dumps(m.arguments) for m in moves) == 6
    made = [dict(s.arguments) for s in script]
    first = next(i for i, s in enumerate(script) if s.needs is not None)
    made[first] = {k: v.replace(needles[0].value, "UNKNOWN") for k, v in made[first].items()}
    assert grade_plan(script, made) == [False, True, True, True, True, True]
    assert grade_plan(script, made[: first + 1]) == [False]  # steps never reached are not graded


@pytest.mark.slow
def test_agentic_asked_states_needles_on_ordinary_lines_among_lookalikes() -> None:
    """agentic_asked: every needle on an ordinary (not ERROR) line; the model is told a
    question in other words and searches by it; the needle's line is the reader's best
    answer while it is in view, and a lookalike (a wrong value) once it is not."""
    from loomrt.bench.agentic_asked import asked_script
    from loomrt.bench.reader import best_line, value_after_key

    _, _, script, needles = asked_script(7, steps=150, needles=18, huge=3)
    outputs = [s.output for s in script]
    for n in needles:
        line = next(ln for o in outputs for ln in o.splitlines() if n.value in ln and n.key in ln)
        assert " ERROR " not in line and n.question and n.key not in n.question
        assert value_after_key(best_line(n.question, outputs)[0]) == n.value
        hidden = [o.replace(line, "") for o in outputs]
        wrong, score = best_line(n.question, hidden)
        assert score >= 2 and value_after_key(wrong) != n.value  # a lookalike answers, wrongly
    moves = [s.move for s in script if s.needs is not None]
    assert [(m.needs, m.query) for m in moves] == [(n.question, n.question) for n in needles]


def test_the_reader_answers_from_the_best_line_or_recalls() -> None:
    from loomrt.bench.reader import best_line, content_words, owners, value_after_key

    assert content_words("Remind me: what was the landlord's code to get in?") == {"landlord", "code", "get"}
    assert content_words("adopted greyhounds") == {"adopt", "greyhound"}
    texts = [
        "Please note that my landlord's door code is 4417#23. The garden needs another look.",
        "Remind me: what was the landlord's code to get in?",  # a question is never an answer
        "My landlord's account number is 120-4431-02.",
    ]
    line, score = best_line("what was the landlord's code to get in?", texts)
    assert line == "Please note that my landlord's door code is 4417#23." and score == 2
    assert best_line("Leo's door code", ["Nothing about that here."]) == ("", 0)
    # another owner's door code shares two words, and is still not Leo's: no answer
    assert best_line("what was Leo's code to get in?", texts) == ("", 0)
    assert owners("Remind me: what was the football team's room we meet in?") == {"team"}
    assert value_after_key("ERROR ledger: the ticket tracking the ledger outage: OPS-12345") == "OPS-12345"
    assert value_after_key('"the ticket of ledger": "OPS-1"') == "OPS-1"


def test_a_lossy_summary_makes_the_model_recall_with_the_questions_words() -> None:
    from loomrt.bench.workloads import ChatCue
    from loomrt.providers.base import ToolSchema

    q = "Remind me: what was the landlord's code to get in?"
    model = ChatModel()
    model.current = ChatCue(q, "Fine.")
    recall = ToolSchema("Recall", "search", {"type": "object", "properties": {}})
    summary = {"role": "user", "content": "[Recap] We talked about the landlord and the garden."}
    ask = {"role": "user", "content": f"{q} The garden needs another look."}
    r = model(ModelRequest(messages=[{"role": "system", "content": "Hi."}, summary, ask], tools=(recall,)))
    assert r.tool_calls and r.tool_calls[0].name == "Recall" and r.tool_calls[0].arguments["query"] == q
    result = {
        "role": "tool",
        "name": "Recall",
        "tool_call_id": "c",
        "content": '{"query": "q", "results": [{"role": "user", "text": "Please note that my landlord\'s door code is 4417#23."}]}',
    }
    r = model(ModelRequest(messages=[{"role": "system", "content": "Hi."}, summary, ask, result], tools=(recall,)))
    assert r.text.startswith("You told me: Please note that my landlord's door code is 4417#23.")


def test_reported_usage_is_another_tokenizer_than_the_estimate() -> None:
    import random

    from loomrt.bench.model import reported_tokens
    from loomrt.bench.textgen import prose
    from loomrt.tokens import count_text

    text = prose(2000, random.Random(1))
    assert 1.03 < reported_tokens(text) / count_text(text) < 1.4  # the pressure rule sees the larger


def test_many_runs_at_once_all_finish() -> None:
    out = run_bench(["concurrency"], BenchConfig(quick=True))
    c = out["measures"]["concurrency"]
    assert c["finished"] == c["runs"] == 20
    assert 0 < c["p50_ms"] <= c["p99_ms"] and 0 < c["turns_without_boundary"] < 100


def test_a_target_that_raises_is_reported_and_the_others_still_run() -> None:
    from loomrt.bench.core import standalone_measure

    @standalone_measure("broken-test", "raises")
    def broken(config, progress) -> dict:
        raise RuntimeError("boom")

    try:
        out = run_bench(["broken-test", "overhead"], BenchConfig(quick=True, overhead_sizes=[10]))
        assert out["failed"] == {"broken-test": "RuntimeError: boom"}
        assert "overhead" in out["measures"]
    finally:
        MEASURES.pop("broken-test")
