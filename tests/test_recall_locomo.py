"""The LoCoMo evidence benchmark on a small made-up file, and the recall CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loomrt.bench.locomo_recall import evaluate_locomo, evidence_ids, render_turn, replay, turns_of
from loomrt.errors import SpecError
from loomrt.recall import HashEmbedder

MINI = Path(__file__).parent / "data" / "locomo-mini.json"


def test_evidence_is_parsed_leniently() -> None:
    assert evidence_ids(["D8:6; D9:17"]) == {"D8:6", "D9:17"}
    assert evidence_ids("D1:3") == {"D1:3"}
    assert evidence_ids([["D2:1"], "D3:4 "]) == {"D2:1", "D3:4"}
    assert evidence_ids(None) == set() and evidence_ids(["nothing"]) == set()


def test_turns_carry_date_speaker_and_photo_captions() -> None:
    sample = json.loads(MINI.read_text())[0]
    turns = turns_of(sample)
    assert [t.dia_id for t in turns][:2] == ["D1:1", "D1:2"] and len(turns) == 12  # session 3 has no turns
    assert render_turn(turns[0]).startswith("[9:00 am on 3 March, 2024] Ana: Hi Bo!")
    assert render_turn(turns[10]).endswith("[shares a photo: a photo of a broken clay bowl on a wooden floor]")


def test_replay_goes_through_the_spine_and_evicts_every_turn() -> None:
    sample = json.loads(MINI.read_text())[0]
    rt, run, seq_to_dia = asyncio.run(replay(sample, embedder=HashEmbedder(), budget_tokens=256))
    assert sorted(seq_to_dia.values()) == sorted(t.dia_id for t in turns_of(sample))
    distilled = [e for e in rt.store.events(run.run_id, kinds=["distillation"])]
    assert len(distilled) >= 2
    evicted = {s for e in distilled for s in e.data["span_seqs"]}
    assert set(seq_to_dia) <= evicted  # every turn reached the index through an evicted span
    entries = run.toolset.recall.index.entries.values()
    assert {e.seq for e in entries} == set(seq_to_dia)
    assert all(e.distillation_seq in {d.seq for d in distilled} for e in entries)


def test_evaluate_locomo_on_a_small_file() -> None:
    seen: list[tuple[int, int]] = []
    result = evaluate_locomo(MINI, embedder=False, progress=lambda done, total, what: seen.append((done, total)))
    assert result["questions"] == 9  # the category-5 question is not asked
    assert set(result["recall_at"]) == {"1", "3", "5", "10"}
    r = result["recall_at"]
    assert 0 < r["1"] <= r["3"] <= r["5"] <= r["10"] <= 1
    assert r["10"] == 1.0  # twelve turns and six: every evidence turn is within the top 10
    assert r["1"] >= 0.5  # exact lexical questions: most are first
    assert set(result["by_category"]) == {"1", "2", "3", "4"}
    assert result["by_category"]["4"]["questions"] == 6
    assert seen[-1][0] == seen[-1][1] == 12 + 6 + 6 + 3


def test_evaluate_locomo_picks_conversations_and_rejects_unknown_ones(tmp_path: Path) -> None:
    result = evaluate_locomo(MINI, conversations=["mini-2"], embedder=HashEmbedder(), ks=(1, 2))
    assert result["questions"] == 3 and list(result["recall_at"]) == ["1", "2"]
    assert list(result["conversations"]) == ["mini-2"]
    with pytest.raises(SpecError, match="no conversation nope"):
        evaluate_locomo(MINI, conversations=["nope"], embedder=False)
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    with pytest.raises(SpecError, match="non-empty JSON array"):
        evaluate_locomo(bad, embedder=False)
    with pytest.raises(SpecError, match="no LoCoMo file"):
        evaluate_locomo(tmp_path / "missing.json", embedder=False)


# --------------------------------------------------------------------------- CLI


def _app() -> Any:
    from loomrt.cli.app import app

    return app


def test_cli_bench_recall_json_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "hash")
    runner = CliRunner()
    res = runner.invoke(_app(), ["bench", "recall", "--data", str(MINI), "--conversations", "mini-1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["questions"] == 6 and set(out["recall_at"]) == {"1", "3", "5", "10"} and out["seconds"] >= 0
    res = runner.invoke(_app(), ["bench", "recall", "--data", str(MINI)])
    assert res.exit_code == 0 and "R@5" in res.stdout and "single-hop" in res.stdout


def test_cli_bench_recall_errors_are_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(_app(), ["bench", "recall", "--data", str(tmp_path / "none.json")])
    assert res.exit_code == 1 and "no LoCoMo file" in res.output and "Traceback" not in res.output
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    res = runner.invoke(_app(), ["bench", "recall", "--data", str(bad)])
    assert res.exit_code == 1 and "not valid JSON" in res.output


def test_cli_recall_rebuilds_a_run_from_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    from loomrt.record.sqlite import default_store
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentSpec
    from loomrt.testing import ScriptedProvider

    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "hash")
    recap = "I was given a task; the release tarball was mentioned; then filler talk about nothing in particular."
    provider = ScriptedProvider(turns=["ok"] * 20, summaries=[recap])
    rt = Runtime(default_store(), providers=lambda s, m: provider)
    spec = AgentSpec(
        model="scripted/x", context={"mode": "recap", "budget_tokens": 300, "keep_last_n": 2, "recall": True}
    )
    run = rt.start(spec, interactive=True)

    async def go() -> None:
        await rt.send(run, "task")
        await rt.send(run, "The release tarball lives at /srv/releases/loom-2.4.1.tar.gz")
        for i in range(10):
            await rt.send(run, f"filler {i}: " + "talk about nothing in particular " * 8)

    asyncio.run(go())
    runner = CliRunner()
    res = runner.invoke(_app(), ["recall", run.run_id, "release tarball", "--k", "3", "--json"])
    assert res.exit_code == 0, res.output
    hits = json.loads(res.stdout)
    assert len(hits) == 3 and set(hits[0]) == {"text", "score", "source", "seq", "ts"}
    assert (
        hits[0]["text"] == "The release tarball lives at /srv/releases/loom-2.4.1.tar.gz" and hits[0]["source"] == "run"
    )
    res = runner.invoke(_app(), ["recall", run.run_id, "/srv/releases/loom-2.4.1.tar.gz"])
    assert res.exit_code == 0 and "loom-2.4.1.tar.gz" in res.stdout and f"#{hits[0]['seq']}" in res.stdout
    res = runner.invoke(_app(), ["recall", "no-such-run", "x"])
    assert res.exit_code == 1 and "no run 'no-such-run'" in res.output


def test_a_chat_replay_indexes_the_replies_between_the_turns() -> None:
    """With a reply after each turn, the acknowledgements are indexed too; a question still
    counts only the turns themselves as evidence, and "all evidence" is never above "any"."""
    observer = evaluate_locomo(MINI, embedder=False)
    chat = evaluate_locomo(MINI, embedder=False, replies=True)
    assert (observer["replay"], chat["replay"]) == ("observer", "chat")
    assert chat["questions"] == observer["questions"]
    for result in (observer, chat):
        assert all(result["recall_all_at"][k] <= result["recall_at"][k] for k in result["recall_at"])
    entries = sum(c["entries"] for c in chat["conversations"].values())
    assert entries > sum(c["entries"] for c in observer["conversations"].values())  # the replies are indexed


def test_a_fold_replay_measures_recall_grep_and_both_on_the_same_run() -> None:
    from loomrt.bench.locomo_recall import fused, with_grep

    assert fused([1, 2, 3], [3, 4])[:2] == [3, 1], "a seq both lists rank comes first"
    assert with_grep([1, 2, 3], [3, 4], every_word=True)[:2] == [3, 1]
    assert with_grep([1, 2, 3], [3, 4], every_word=False) == [1, 2, 3], "hits on any one word do not rerank Recall"
    out = evaluate_locomo(MINI, embedder=HashEmbedder(), mode="fold")
    assert out["mode"] == "fold" and out["questions"] > 0
    for key in ("recall_at", "grep_at", "recall_and_grep_at"):
        assert set(out[key]) == {"1", "3", "5", "10"} and all(0 <= v <= 1 for v in out[key].values())
    assert out["grep_at"]["10"] > 0, "Grep finds evidence turns by their words"
    assert out["conversations"]["mini-1"]["distillations"] > 0, "the conversation was folded"
    assert "grep_at" not in evaluate_locomo(MINI, embedder=HashEmbedder())


# --------------------------------------------------------------------------- answers stated


def test_states_answer_needs_most_of_the_answers_content_words() -> None:
    from loomrt.bench.qa.grade import answer_words, states_answer

    assert states_answer("Ana adopted a greyhound from the shelter on Maple Street.", "the shelter on Maple Street")
    assert not states_answer("Ana adopted a greyhound from a shelter.", "the shelter on Maple Street")  # 1 of 3 words
    assert states_answer("Dee ran it in 4 hours and 12 minutes", "4 hours 12 minutes")
    assert not states_answer("Ana signed up in May 2024", "April 2024")  # the year alone is half the answer
    assert states_answer("Bo learns the cello from Mira", "cello, Mira", 1)
    assert answer_words("the one on it", 4) == set() and not states_answer("anything at all", "the one on it")
    assert answer_words("Likely yes; she says so", 3) == {"like", "ye"}  # only before the ';', stemmed


def test_the_raw_tier_reports_whether_its_turns_state_the_answer() -> None:
    result = evaluate_locomo(MINI, embedder=False)
    states = result["states"]
    assert states["questions"] == 9  # every answer here has content words
    assert 0 < states["at"]["1"] <= states["at"]["10"] <= 1
    assert sum(v["questions"] for v in states["by_category"].values()) == 9


def _vague(request: Any) -> Any:
    """An extractor that keeps one vague fact per batch, citing its first lines."""
    from loomrt.harvest.scripted import conversation_lines
    from loomrt.providers.base import ModelResponse, Usage

    lines = conversation_lines(request)
    fact = {
        "statement": "Ana and Bo talked about their week and their plans.",
        "class": "fact",
        "subject": "Ana",
        "source_seqs": [n for n, _, _ in lines][:6],
    }
    return ModelResponse(text=json.dumps({"facts": [fact]}), usage=Usage(1, 1))


@pytest.mark.parametrize("extractor", ["echo", "vague"])
def test_the_memory_tier_counts_a_hit_only_where_a_fact_states_the_answer(tmp_path: Path, extractor: str) -> None:
    """Verbatim facts state the answers; one vague fact a batch cites the lines but states none,
    and the measure says so (the old one, any merged source, counted it found)."""
    from loomrt.bench.harvest_bench import locomo_tiers
    from loomrt.harvest.scripted import echo_extractor
    from loomrt.testing import FunctionProvider

    provider = echo_extractor() if extractor == "echo" else FunctionProvider(_vague, name="scripted/vague")
    kept: list[dict[str, Any]] = []
    out = asyncio.run(
        locomo_tiers(
            tmp_path,
            MINI,
            provider=provider,
            embedder="hash",
            raw=False,
            checkpoint=lambda lo: kept.append(json.loads(json.dumps(lo))),
        )
    )
    assert [k["conversations"] for k in kept] == [["mini-1"], ["mini-1", "mini-2"]]  # figures after each conversation
    assert out["memory"]["states"]["questions"] == out["memory"]["cites"]["questions"] == 9
    states, cites = out["memory"]["states"]["recall_at"], out["memory"]["cites"]["recall_at"]
    if extractor == "echo":
        assert states["10"] >= 0.5 and cites["10"] >= 0.5  # (the echo drops lines that open with a pronoun)
    else:
        assert states["10"] == 0.0  # it states nothing ...
        assert cites["10"] > 0  # ... though its lines hold some evidence


def test_a_resumed_memory_tier_measures_only_the_conversations_not_yet_done(tmp_path: Path) -> None:
    """``bench harvest --resume``: a record kept from an earlier run is taken as it is (its
    conversation is not extracted again), and the figures over all conversations come out as
    one run's would."""
    from loomrt.bench.harvest_bench import locomo_tiers
    from loomrt.harvest.scripted import echo_extractor

    def tiers(name: str, provider: Any, **kw: Any) -> dict[str, Any]:
        return asyncio.run(locomo_tiers(tmp_path / name, MINI, provider=provider, embedder="hash", raw=False, **kw))

    whole_p, resumed_p, second_p = echo_extractor(), echo_extractor(), echo_extractor()
    whole = tiers("whole", whole_p)
    resumed = tiers("resumed", resumed_p, done={"mini-1": whole["per_conversation"]["mini-1"]})
    tiers("second", second_p, conversations=["mini-2"])
    assert 0 < len(resumed_p.calls) == len(second_p.calls) < len(whole_p.calls)  # only mini-2 was extracted
    assert resumed["conversations"] == ["mini-1", "mini-2"]
    assert resumed["per_conversation"]["mini-1"] == whole["per_conversation"]["mini-1"]
    for name in ("turns", "spans", "facts", "memory"):
        assert resumed[name] == whole[name], name
