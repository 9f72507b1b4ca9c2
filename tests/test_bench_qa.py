"""``loomrt bench qa``: the grading on known answer pairs, and the harness end to end with the
scripted reader on tests/data (the CI configuration: no real model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loomrt.bench.qa import QAConfig, abstained, contains, f1, f1_multi, grade, normalize_answer, run_qa
from loomrt.bench.qa.runner import select_questions
from loomrt.cli.app import app

MINI = Path(__file__).parent / "data" / "locomo-mini.json"


# ---------------------------------------------------------------------- grading


def test_normalisation_drops_case_punctuation_and_articles() -> None:
    assert normalize_answer("The Shelter, on Maple Street!") == "shelter on maple street"
    assert normalize_answer("a cat and an owl") == "cat owl"


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("7 May 2023", "7 May 2023", 1.0),
        ("on 7 May", "7 May 2023", 2 / 3),  # precision 2/3 (on, 7, may), recall 2/3 (7, may, 2023)
        ("7 May", "7 May 2023", 0.8),  # precision 1, recall 2/3: 2·1·(2/3)/(1+2/3)
        ("Paris", "London", 0.0),
        ("running", "runs", 1.0),  # Porter stemming: run = run
        ("", "Pepper", 0.0),
    ],
)
def test_token_f1_on_known_pairs(prediction: str, gold: str, expected: float) -> None:
    assert f1(prediction, gold) == pytest.approx(expected, abs=1e-4)


def test_multi_hop_f1_takes_each_gold_part_at_its_best() -> None:
    assert f1_multi("cello, Mira", "cello, Mira") == 1.0
    assert f1_multi("Mira", "cello, Mira") == 0.5
    assert f1_multi("the cello and Mira", "cello, Mira") == pytest.approx((2 / 3 + 2 / 3) / 2)


def test_contains_is_on_word_boundaries() -> None:
    assert contains("She adopted it at the shelter on Maple Street.", "the shelter on Maple Street")
    assert not contains("Mapleton", "Maple")
    assert not contains("anything", "")


def test_category_rules() -> None:
    assert grade(5, "No information available.", "ignored") == {"f1": 1.0, "contains": True}
    assert grade(5, "Tosca", "ignored") == {"f1": 0.0, "contains": False}
    assert abstained("That is not mentioned in the conversation.")
    assert grade(3, "likely yes", "Likely yes; because she said so")["f1"] == 1.0  # the part before ';'
    assert grade(1, "cello, Mira", "cello, Mira")["f1"] == 1.0
    assert grade(2, "April 2024", "April 2024") == {"f1": 1.0, "contains": True}


def test_questions_are_spread_over_the_list() -> None:
    sample = json.loads(MINI.read_text())[0]
    picked = select_questions(sample, 3)
    assert [i for i, _ in picked] == [0, 2, 4]
    assert len(select_questions(sample, None)) == len(select_questions(sample, 0)) == len(sample["qa"])


# ---------------------------------------------------------------------- the harness


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("qa")
    config = QAConfig(data=MINI, model="scripted", embedder="hash", budget_tokens=400, questions=None, out=out)
    return run_qa(config), out


@pytest.mark.slow
def test_every_configuration_answers_every_question(tiny: tuple[dict, Path]) -> None:
    results, _ = tiny
    summary = results["summary"]
    assert list(summary) == ["full", "recall", "recap", "recap/no-recall", "compaction", "compaction/no-recall"]
    for name, s in summary.items():
        assert s["questions"] == 7 and s["failed"] == 0, name
        assert 0 <= s["f1"] <= 1 and 0 <= s["contains"] <= 1
        assert set(s["by_category"]) == {"1", "2", "3", "4", "5"}
        assert s["input_tokens_per_question"] > 0 and s["folded_size"] > 0
        assert sum(s["misses"].values()) == sum(
            1 for r in results["answers"] if r["config"] == name and r["category"] != 5 and not r["contains"]
        )
    assert summary["recall"]["recall_calls_per_question"] == 1.0
    assert summary["recap/no-recall"]["recall_calls_per_question"] == 0.0
    assert summary["recap"]["recall_calls_per_question"] > 0  # the reader recalled where its context fell short


def test_answers_are_graded_against_the_gold(tiny: tuple[dict, Path]) -> None:
    results, _ = tiny
    rows = {(r["config"], r["question"]): r for r in results["answers"]}
    shelter = rows[("full", "Where did Ana adopt the greyhound?")]
    assert "Maple Street" in shelter["answer"] and shelter["contains"]  # the line that shares the most words
    opera = rows[("full", "What is Ana's favourite opera?")]
    assert opera["gold"] == "No information available" and opera["f1"] == 1.0  # abstained on category 5


def test_the_replays_distil_through_the_real_code_paths(tiny: tuple[dict, Path]) -> None:
    results, _ = tiny
    setup = results["setups"]["mini-1:recap"]
    assert setup["distillations"] >= 1 and setup["distil_calls"] >= setup["distillations"]
    assert setup["distil_input_tokens"] > 0
    assert results["setups"]["mini-1:recap/no-recall"]["run_id"] == setup["run_id"]  # one replay, two ways to ask


def test_an_interrupted_benchmark_continues_from_its_cache(tiny: tuple[dict, Path]) -> None:
    results, out = tiny
    lines = (out / "answers.jsonl").read_text().splitlines()
    assert len(lines) == 6 * 7
    (out / "answers.jsonl").write_text("\n".join(lines[:-5]) + '\n{"cut off', encoding="utf-8")
    again = run_qa(QAConfig(data=MINI, model="scripted", embedder="hash", budget_tokens=400, questions=None, out=out))

    def untimed(summary: dict) -> dict:  # the re-asked answers took their own time
        return {k: {f: v for f, v in s.items() if f != "seconds_per_question"} for k, s in summary.items()}

    assert untimed(again["summary"]) == untimed(results["summary"])
    assert again["setups"]["mini-1:recap"]["run_id"] == results["setups"]["mini-1:recap"]["run_id"]  # not replayed
    assert {"answers.jsonl", "runs.db", "replays.json"} <= {p.name for p in out.iterdir()}


@pytest.mark.slow
def test_the_cli_writes_the_report_and_the_docs_block(tmp_path: Path) -> None:
    from loomrt.bench.qa.report import QA_BEGIN, QA_END

    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\n{QA_BEGIN}\n{QA_END}\n")
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "qa",
            "--data",
            str(MINI),
            "--model",
            "scripted",
            "--embedder",
            "hash",
            "--budget",
            "400",
            "--questions",
            "3",
            "--configs",
            "full,recall",
            "--out",
            str(tmp_path / "out"),
            "--docs",
            str(doc),
        ],
    )
    assert result.exit_code == 0, result.output
    assert {"report.md", "results.json", "qa.png"} <= {p.name for p in (tmp_path / "out").iterdir()}
    text = doc.read_text()
    assert "| full | 3 |" in text and "| recall | 3 |" in text


def test_bad_input_is_one_clear_error(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["bench", "qa", "--data", str(tmp_path / "nope.json"), "--model", "scripted"])
    assert r.exit_code == 2 and "no LoCoMo file" in r.output
    r = runner.invoke(app, ["bench", "qa", "--data", str(MINI), "--model", "scripted", "--configs", "fold/bogus"])
    assert r.exit_code == 2 and "unknown configuration fold/bogus" in r.output
    r = runner.invoke(app, ["bench", "qa", "--data", str(MINI), "--model", "scripted", "--conversations", "x"])
    assert r.exit_code == 2 and "no conversation x" in r.output


def test_the_inject_rows_report_what_was_injected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import loomrt.run.reducers.summarize as summarize

    # each recap keeps only its own span's leading sentences, nothing carried from the earlier
    # one: on this small conversation the recaps would otherwise keep every evidence line
    # verbatim, and injection rightly sends nothing the working context holds already
    monkeypatch.setattr(summarize, "CARRY_SHARE", 0.0)
    configs = ["recap/no-recall", "recap/inject-only", "recap/inject", "full/inject"]
    out = run_qa(
        QAConfig(
            data=MINI,
            model="scripted",
            embedder="hash",
            budget_tokens=400,
            questions=None,
            configs=configs,
            inject_tokens=200,
        )
    )
    summary = out["summary"]
    for name in ("recap/inject-only", "recap/inject", "full/inject"):
        assert summary[name]["questions"] == 7 and summary[name]["failed"] == 0, name
        assert 0 <= summary[name]["injected_none"] <= 1
    assert summary["recap/inject-only"]["evidence_injected"] > 0, "some evidence turn came back without asking"
    assert summary["recap/inject-only"]["recall_calls_per_question"] == 0.0, "the tool is not offered"
    assert summary["recap/inject-only"]["contains"] >= summary["recap/no-recall"]["contains"]


def test_an_interrupted_replay_continues_from_its_last_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import loomrt.bench.qa.replay as replay

    real = replay.turns_of
    monkeypatch.setattr(replay, "turns_of", lambda sample: real(sample)[:5])  # the first process stops after 5 turns
    config = QAConfig(data=MINI, model="scripted", embedder="hash", budget_tokens=400, configs=["recap"], out=tmp_path)
    run_qa(config)
    (tmp_path / "replays.json").unlink()  # as if it had been killed before the replay was finished
    monkeypatch.setattr(replay, "turns_of", real)
    again = run_qa(config)
    from loomrt.record.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "runs.db")
    runs = store.list_runs(limit=10)
    sample = json.loads(MINI.read_text())[0]
    assert len(runs) == 1, "the replay went on in the same run"
    assert len(store.events(runs[0].run_id, kinds=["user_input"])) == len(real(sample))
    assert again["setups"]["mini-1:recap"]["run_id"] == runs[0].run_id


@pytest.mark.slow
def test_the_memory_rows_answer_from_durable_memory_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new run of the same user, in a record of its own, gets the words back from the
    memory the replay banked and the consolidator wrote; with memory emptied (the sabotage)
    the same rows find nothing and answer nothing."""
    from loomrt.bench.qa import memory as qa_memory

    def measure() -> dict:
        config = QAConfig(
            data=MINI,
            model="scripted",
            embedder="default",  # the relevance rule reads MiniLM's raw cosines
            budget_tokens=400,
            questions=None,
            configs=["memory", "memory/passages-only"],
            inject_tokens=200,
        )
        return run_qa(config)

    out = measure()
    setup = out["setups"]["mini-1:memory"]
    assert setup["spans"] >= 1 and setup["passages"]["new"] >= 5 and setup["facts"]["new"] >= 1
    assert setup["turns_never_banked"] == 0  # the final working context too: the tail is banked
    for name in ("memory", "memory/passages-only"):
        s = out["summary"][name]
        assert s["questions"] == 7 and s["failed"] == 0 and s["recall_calls_per_question"] == 0.0, name
        assert s["evidence_injected"] > 0 and s["contains"] > 0, name
    monkeypatch.setattr(qa_memory.TierMemory, "search", lambda self, query, top_k, scopes=None: [])
    broken = measure()["summary"]["memory"]
    assert broken["evidence_injected"] == 0 and broken["injected_none"] == 1.0
    answerable = [c for c in ("1", "2", "3", "4") if c in broken["by_category"]]
    assert all(broken["by_category"][c]["contains"] == 0 for c in answerable)  # only the abstentions score
    assert broken["contains"] < out["summary"]["memory"]["contains"]


def test_the_distillation_a_replay_ends_with_is_written_once_not_in_every_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loomrt.bench.qa.replay import queued_distillation
    from loomrt.record.sqlite import SQLiteStore

    # on this budget the conversation's last turn meets the watermark (checked below)
    config = QAConfig(data=MINI, model="scripted", embedder="hash", budget_tokens=1072, configs=["recap"], out=tmp_path)
    import loomrt.bench.qa.replay as replay

    real = replay.between_turns

    async def skipped(run: object, coordination: object) -> bool:
        return False

    monkeypatch.setattr(replay, "between_turns", skipped)  # a replay finished before the replay settled
    config.questions = 1
    first = run_qa(config)
    run_id = first["setups"]["mini-1:recap"]["run_id"]
    store = SQLiteStore(tmp_path / "runs.db")
    assert queued_distillation(store, run_id), "the replay's last turn queues a recap"
    monkeypatch.setattr(replay, "between_turns", real)
    config.questions, config.configs = None, ["recap/no-recall"]
    again = run_qa(config)
    assert not queued_distillation(SQLiteStore(tmp_path / "runs.db"), run_id)
    assert (
        again["setups"]["mini-1:recap/no-recall"]["distillations"]
        == first["setups"]["mini-1:recap"]["distillations"] + 1
    )
    rows = [r for r in again["answers"] if r["config"] == "recap/no-recall"]
    assert rows and all(r["calls"] == 1 for r in rows), "a question's fork wrote the recap again"


def test_a_replay_asked_only_in_variants_still_has_its_row(tiny: tuple[dict, Path]) -> None:
    from loomrt.bench.qa.report import markdown

    results, _ = tiny
    variants = {k: v for k, v in results["setups"].items() if "/" in k}  # recap/no-recall, compaction/no-recall
    text = markdown({**results, "setups": variants})
    assert "The replays" in text
    assert text.count("| mini-1:recap |") == 1 and text.count("| mini-1:compaction |") == 1


def test_a_full_context_row_with_a_block_counts_a_gold_no_text_holds_as_not_verbatim() -> None:
    """``full/inject`` sees the whole conversation, as ``full`` does: a gold answer the
    conversation does not hold word for word is "not verbatim anywhere", never "not in
    context, Recall not called" (which only a distilling mode can say)."""
    from loomrt.bench.qa.summary import _misses

    row = {"category": 2, "contains": False, "gold_in_context": False, "recall_calls": 0}
    for config in ("full", "full/inject", "recall"):
        assert _misses([{**row, "config": config}])["not verbatim anywhere"] == 1
    assert _misses([{**row, "config": "recap/inject-only"}])["not in context, Recall not called"] == 1


def test_one_call_turns_reaches_the_asked_agents_model_and_only_the_embedded_one(tmp_path: Path) -> None:
    """The embedded model decides and answers in one generation unless ``--two-call-turns``
    asks for two calls; another model is never given the grammar, whatever is asked."""
    from loomrt.bench.core import NullProgress
    from loomrt.bench.qa.runner import QAConfig, _Session

    qwen, hosted = "local/qwen2.5-coder-1.5b", "openai/gpt-4o-mini"
    for model, asked, wanted in (
        (qwen, None, True),
        (qwen, True, True),
        (qwen, False, False),
        (hosted, True, False),
        (hosted, None, False),
    ):
        config = QAConfig(data=tmp_path / "x.json", model=model, one_call_turns=asked)
        session = _Session(config, NullProgress())
        try:
            assert bool(session.spec("recap").capabilities.one_call_turns) is wanted, (model, asked)
            assert session.answers.one_call_turns is wanted and config.to_json()["one_call_turns"] is wanted
        finally:
            session.close()


def test_an_answer_asked_the_other_way_is_asked_again(tmp_path: Path) -> None:
    from loomrt.bench.qa.runner import _Answers

    two_calls = _Answers(tmp_path)
    two_calls.add({"conversation": "c", "config": "recap/inject", "qid": 1, "answer": "a sentence."})
    assert _Answers(tmp_path).has("c", "recap/inject", 1)
    assert not _Answers(tmp_path, one_call_turns=True).has("c", "recap/inject", 1)  # --one-call-turns asks again
    one_call = _Answers(tmp_path, one_call_turns=True)
    one_call.add({"conversation": "c", "config": "recap/inject", "qid": 1, "answer": "a phrase"})
    assert _Answers(tmp_path, one_call_turns=True).rows[("c", "recap/inject", 1)]["answer"] == "a phrase"
    assert _Answers(tmp_path).rows[("c", "recap/inject", 1)]["answer"] == "a sentence."


def test_a_memory_replay_recorded_before_it_counted_declines_still_has_its_row(tiny: tuple[dict, Path]) -> None:
    """`bench qa --configs memory` once ended in a KeyError after its last answer: the memory
    setup's record had no ``declined`` or ``rejected_summaries``, and the report read them."""
    from loomrt.bench.qa.report import markdown

    results, _ = tiny
    setup = {"run_id": "r-mem", "seconds": 1.0, "distillations": 3, "distil_calls": 4, "distil_input_tokens": 10}
    text = markdown({**results, "setups": {**results["setups"], "mini-1:memory:400:scripted": setup}})
    assert "| mini-1:memory | 3 | – | – | 4 | 10 | 1.0 |" in text
