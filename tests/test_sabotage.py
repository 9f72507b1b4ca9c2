"""Sabotage tests: each breaks the product the way a published figure exists to catch, runs
the measure at test size, and asserts that the figure comes out bad (DESIGN, principle 8).

A figure without one here is not published. docs/benchmarks.md names, next to each figure,
the sabotage it is known to catch.

| figure | sabotage | test |
|---|---|---|
| chat200 ``MODE/inject-only`` answered | injection made a no-op | ``test_inject_only_falls_to_no_recall_without_injection`` |
| ``runs verify`` on injected prompts | a recorded block's passage changed | ``test_recall_inject.py::test_verify_sees_a_prompt_whose_block_was_changed`` |
| ``bench chaos`` violations: nothing paid twice | a summary's model call committed apart from its distillation | ``test_chaos_sees_a_distillation_paid_twice`` |
| ``bench chaos`` violations: nothing lost from Recall | a resumed run drops the recall index it rebuilt | ``test_chaos_sees_a_resumed_run_lose_its_recall_index`` |
| ``bench chaos`` violations: the context is the record's | a resumed run ends holding a message its record does not | ``test_chaos_sees_a_resumed_context_the_record_does_not_hold`` |
| harvest load "0 lost, 0 doubled" | the per-scope lease and the claim check both broken | ``test_harvest_load_counts_a_batch_two_workers_extracted`` |
| harvest paraphrase rows, facts kept apart | placement merges into the nearest fact, whatever it says | ``test_harvest_paraphrase_reports_facts_merged_together`` |
| fold "0 invented values" in cards (``fold/sloppy``, invented values in cards) | the verified-card check disabled | ``test_fold_sloppy_sees_invented_values_reach_cards_without_the_check`` |
| Recall latency, the first query after an eviction (entries it indexed itself) | the background index never drains | ``test_recall_latency_sees_the_first_query_after_an_eviction_index_its_span_itself`` |
| Recall latency, the first query after an eviction (entries it embedded itself, entries it waited for) | the query embeds again what the background thread is embedding | ``test_recall_latency_sees_the_first_query_embed_again_what_the_background_is_embedding`` |
| fanout "Σ rows do not grow with H" (the ledger child) | no Σ budget (``state_max_tokens`` never enforced) | ``test_fanout_sees_ledger_rows_grow_without_the_sigma_budget`` |
| chat200_lead ``MODE/no-recall`` answered (what the summaries keep) | the reducer writes the block without its summary | ``test_chat200_lead_no_recall_falls_when_summaries_keep_nothing`` |
| ``fold/cards-only`` answered (what the cards alone keep) | cards lose their values | ``test_fold_cards_only_falls_when_cards_lose_their_values`` |
| agentic_asked answered with Recall (recap, compaction, stateful, fold) | Recall's ``on_evicted`` made a no-op | ``test_agentic_asked_recall_rows_fall_when_nothing_is_indexed`` |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chaos_kit import everywhere, lose_recall_on_reopen, pay_distillation_apart, stray_context_on_resume

from loomrt.bench.core import BenchConfig
from loomrt.bench.runner import run_bench

INJECTED_MODES = ["recap/no-recall", "recap/inject-only"]


def _chat200(modes: list[str], workload: str = "chat200") -> dict[str, Any]:
    result = run_bench([workload], BenchConfig(quick=True, embedder="hash", modes=modes))
    return dict(result["workloads"][workload]["modes"])


@pytest.mark.slow
def test_inject_only_falls_to_no_recall_without_injection(monkeypatch: pytest.MonkeyPatch) -> None:
    honest = _chat200(INJECTED_MODES)
    assert honest["recap/inject-only"]["answered"] > honest["recap/no-recall"]["answered"] + 0.5

    async def nothing(run: Any) -> None:
        return None

    monkeypatch.setattr("loomrt.run.loop.inject_recall", nothing)
    broken = _chat200(INJECTED_MODES)
    assert broken["recap/inject-only"]["answered"] <= broken["recap/no-recall"]["answered"]


# ---------------------------------------------------------------- the harvest queue: "0 lost, 0 doubled"

_NO_EXCLUSION = '''
"""Sabotage for the harvest queue's figure: the per-scope lease and the claim check broken."""
import hashlib, json, time

from loomrt.harvest.queue import Queue
from loomrt.record.sqlite import SQLiteStore


def _take_lease(self, name, holder, ttl_s):
    return True


def _claim(self, scope, spans):
    ids = [s["id"] for s in spans]
    batch_id = hashlib.sha256(f"{scope}|{','.join(map(str, ids))}".encode()).hexdigest()[:16]
    with self.db.write() as conn:
        conn.execute(
            "INSERT INTO harvest_batches (batch_id, scope, span_ids, state, claimed_at) VALUES (?, ?, ?, 'claimed', ?) "
            "ON CONFLICT(batch_id) DO NOTHING",
            (batch_id, scope, json.dumps(ids), time.time()),
        )
        marks = ",".join("?" * len(ids))
        conn.execute(f"UPDATE harvest_spans SET state = 'claimed', batch_id = ? WHERE id IN ({marks})", [batch_id, *ids])
    return batch_id


SQLiteStore.take_lease = _take_lease
Queue.claim = _claim
'''


def _drained(tmp_path: Path, spans: int) -> dict[str, Any]:
    """The load measure at test size: ``spans`` spans (one a batch) drained by 2 worker processes."""
    from loomrt.bench.harvest_load import bank_load, drain, verify
    from loomrt.record.sqlite import SQLiteStore

    tmp_path.mkdir()
    db = tmp_path / "load.sqlite"
    SQLiteStore(db).close()
    texts = bank_load(db, spans)
    ran = drain(db, workers=2, batch_tokens=1)
    assert all(code == 0 for code in ran["exit_codes"]), ran["exit_codes"]
    return verify(db, texts, ran)


@pytest.mark.slow
def test_harvest_load_counts_a_batch_two_workers_extracted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    honest = _drained(tmp_path / "honest", 24)
    assert honest["lost"] == 0 and honest["doubled"] == 0 and honest["lines_extracted"] == 24

    # the workers (other processes) import this at start-up: drain passes them the test's sys.path
    sabotage = tmp_path / "sabotage"
    sabotage.mkdir()
    (sabotage / "sitecustomize.py").write_text(_NO_EXCLUSION)
    monkeypatch.syspath_prepend(str(sabotage))
    broken = _drained(tmp_path / "broken", 24)
    assert broken["lost"] == 0 and broken["stored_twice"] == 0  # idempotent fact keys hide it from memory
    assert broken["doubled"] > 0 and broken["batches_doubled"] > 0, broken


# ---------------------------------------------------------------- harvest paraphrase: 5 rows, each fact apart


def test_harvest_paraphrase_reports_facts_merged_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loomrt.bench.harvest_bench import paraphrase
    from loomrt.harvest.placement import Placement

    (tmp_path / "honest").mkdir()
    honest = paraphrase(tmp_path / "honest", "hash")
    assert honest["kept_apart"] == 5 and honest["rows_mixing_facts"] == 0  # the hash embedder merges few: rows > 5

    def collapse(cls: str, subject: str, statement: str, candidates: list[Any], **_: Any) -> Placement:
        """Placement that merges a new fact into the nearest stored one, whatever it says."""
        return (
            Placement("merge", candidates[0].fact_id, candidates[0].cosine, "sabotage")
            if candidates
            else Placement("new")
        )

    monkeypatch.setattr("loomrt.harvest.memory.place", collapse)
    (tmp_path / "broken").mkdir()
    broken = paraphrase(tmp_path / "broken", "hash")
    assert broken["rows"] <= 6  # the old figure's goal (≤ 6) was met
    assert broken["kept_apart"] < 5 and broken["rows_mixing_facts"] > 0 and broken["verdict"] == "facts merged together"


def _chaos(scenario: str, point: str, per_point: int = 2) -> dict[str, Any]:
    from loomrt.bench.chaos import SCENARIOS, run_chaos

    return run_chaos(per_point, scenarios=[s for s in SCENARIOS if s.agent == scenario], points=[point])


@pytest.mark.slow
def test_chaos_sees_a_distillation_paid_twice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Killed between a summary's call and its distillation, the resumed run pays for the
    summary again; the harness compares the record's model calls with the uninterrupted run's."""
    everywhere(monkeypatch, tmp_path, pay_distillation_apart)
    result = _chaos("chat-compaction", "in_distillation")
    assert result["landed"] == result["kills"] == 2
    paid = [v for f in result["failures"] for v in f["violations"] if "model calls" in v]
    assert len(paid) == 2, result["failures"]
    assert all("summary" in v for v in paid), paid


@pytest.mark.slow
def test_chaos_sees_a_resumed_run_lose_its_recall_index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A reopened run (a resume, or the next input in a new process: a chat killed while it
    distilled between turns is parked) that drops the recall index it rebuilt: the harness
    inspects the index of the run that recovered, not one it rebuilds afterwards."""
    everywhere(monkeypatch, tmp_path, lose_recall_on_reopen)
    result = _chaos("chat-compaction", "after_distillation")
    assert result["landed"] == result["kills"] == 2
    lost = [v for f in result["failures"] for v in f["violations"] if "recall index" in v and "missing" in v]
    assert len(lost) == 2, [f["violations"] for f in result["failures"]]


@pytest.mark.slow
def test_chaos_sees_a_resumed_context_the_record_does_not_hold(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A one-shot run killed mid-turn has nothing left to send once resumed: the harness
    compares the run that recovered with its record, not the record with itself."""
    everywhere(monkeypatch, tmp_path, stray_context_on_resume)
    result = _chaos("tools-compaction", "in_tool")
    assert result["landed"] == result["kills"] == 2
    stray = [v for f in result["failures"] for v in f["violations"] if "differs from the live one" in v]
    assert len(stray) == 2 and all("A note the record does not hold" in v for v in stray), result["failures"]


# ---------------------------------------------------------------- fanout: "Σ rows do not grow with H"


@pytest.mark.slow
def test_fanout_sees_ledger_rows_grow_without_the_sigma_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from loomrt.bench.fanout import LEDGER_SIGMA_TOKENS, fanout_figures

    honest = fanout_figures((1,), (20, 60))["ledger"]
    assert honest["within_budget"] and honest["growth"] <= 1.1, honest

    monkeypatch.setattr("loomrt.run.reducers.stateful.state_share", lambda run: 10**9)  # no Σ budget
    broken = fanout_figures((1,), (20, 60))
    rows = {r["horizon"]: r for r in broken["rows"]}
    assert rows[60]["state_row_tokens"] == rows[20]["state_row_tokens"]  # the overwriting Σ cannot show it
    assert not broken["ledger"]["within_budget"] and broken["ledger"]["growth"] >= 2, broken["ledger"]
    assert rows[60]["ledger_row_tokens"] > 2 * LEDGER_SIGMA_TOKENS


# ---------------------------------------------------------------- fold: "0 fallbacks, 0 invented values"


@pytest.mark.slow
def test_fold_sloppy_sees_invented_values_reach_cards_without_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fold/sloppy``'s summariser invents a port in some leaf cards and fails some calls:
    the verified-card check rejects the inventions, two rejections in a row write a
    fallback, and none of the invented values reaches a card. With the check disabled, they
    reach cards, and the bench's own count of them (not the check's figure) says so."""
    from loomrt.run.reducers.fold.verify import values

    honest = _chat200(["fold/sloppy"])["fold/sloppy"]
    assert honest["values_invented"] > 0 and honest["cards_rejected"] > 0, honest
    assert honest["fallback_cards"] > 0 and honest["invented_in_cards"] == 0, honest

    monkeypatch.setattr("loomrt.run.reducers.fold.writer.invented", lambda card, source: (len(values(card)), []))
    broken = _chat200(["fold/sloppy"])["fold/sloppy"]
    assert broken["values_invented"] == 0  # the check's own figure is blind to its absence
    assert broken["invented_in_cards"] > 0, broken


# ---------------------------------------------------------------- Recall: "the first query after an eviction"


def test_recall_latency_sees_the_first_query_after_an_eviction_index_its_span_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured as a run meets it (in the running event loop, a model call after the
    boundary), the first query after an eviction finds the span indexed in the background.
    With the background index broken, every such query indexes the whole span inside its
    timed call; the figure counts the entries it indexed (work, not seconds)."""
    from loomrt.bench.recall_targets import recall_latency

    honest = recall_latency(256, 12, embedder="hash")
    assert honest["after_eviction_inline_entries"] == 0 and honest["after_eviction_inline_share"] == 0, honest

    async def never(self: Any) -> None:
        return None

    monkeypatch.setattr("loomrt.recall.run_recall.RunRecall._drain", never)
    broken = recall_latency(256, 12, embedder="hash")
    assert broken["after_eviction_inline_entries"] == 8 and broken["after_eviction_inline_share"] == 1, broken


def test_recall_latency_sees_the_first_query_embed_again_what_the_background_is_embedding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A query that arrives while the background thread embeds the evicted span waits for its
    vectors (the span embedded once). With that wait taken out (the query embeds the whole
    backlog itself, beside the thread), the figure counts the span's entries embedded on the
    query's thread (work, not seconds)."""
    from test_recall_run import SlowEmbedder

    from loomrt.bench.recall_targets import recall_latency
    from loomrt.recall.run_recall import RunRecall

    # the thread takes 0.6 s a slice; the query comes 0.2 s after the boundary, mid-slice
    honest = recall_latency(64, 8, embedder=SlowEmbedder(0.6), gap_ms=200)
    assert honest["after_eviction_inline_entries"] == 0 and honest["after_eviction_waited_entries"] == 8, honest

    def embed_it_all_again(self: RunRecall) -> None:
        drafts, self._backlog = self._backlog, []
        if drafts:
            self._index_now(drafts)

    monkeypatch.setattr(RunRecall, "_catch_up", embed_it_all_again)
    broken = recall_latency(64, 8, embedder=SlowEmbedder(0.6), gap_ms=200)
    assert broken["after_eviction_inline_entries"] == 8 and broken["after_eviction_waited_entries"] == 0, broken


# ---------------------------------------------------------------- chat200_lead: what the summaries and the cards keep

SUMMARISED = ["recap/no-recall", "compaction/no-recall"]


@pytest.mark.slow
def test_chat200_lead_no_recall_falls_when_summaries_keep_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """chat200's "no-recall" rows are 0 whatever the summaries keep (every fact sits after
    ~60 tokens of prose); chat200_lead states every other fact in its message's leading
    sentence, so they measure what a summary keeps. With the reducer writing its block
    without the summary, they fall to 0."""
    honest = _chat200(SUMMARISED, "chat200_lead")
    assert all(honest[m]["answered"] >= 0.2 and honest[m]["recall_calls"] == 0 for m in SUMMARISED), honest

    monkeypatch.setattr("loomrt.run.reducers.summarize.keep_pointers", lambda text, allowed: ("", 0))
    broken = _chat200(SUMMARISED, "chat200_lead")
    assert all(broken[m]["answered"] == 0 and broken[m]["distillations"] > 0 for m in SUMMARISED), broken


@pytest.mark.slow
def test_fold_cards_only_falls_when_cards_lose_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fold/cards-only`` offers neither fold's tools nor Recall (``fold/no-recall`` still
    Greps the raw record and answers 1.000): what it answers is what the cards keep. With
    cards that lose their values (each value the summariser wrote cut out of the card), it
    falls to 0 while ``fold/no-recall`` hardly notices."""
    from loomrt.run.reducers.fold.verify import values
    from loomrt.run.reducers.fold.writer import CardWriter

    modes = ["fold/cards-only", "fold/no-recall"]
    honest = _chat200(modes, "chat200_lead")
    assert honest["fold/cards-only"]["answered"] > 0 and honest["fold/cards-only"]["recall_calls"] == 0, honest

    card = CardWriter._card

    def valueless(self: CardWriter, depth: int, text: str, *args: Any, **kw: Any) -> Any:
        for v in values(text):
            text = text.replace(v, "…")
        return card(self, depth, text, *args, **kw)

    monkeypatch.setattr(CardWriter, "_card", valueless)
    broken = _chat200(modes, "chat200_lead")
    assert broken["fold/cards-only"]["answered"] == 0 and broken["fold/cards-only"]["cards"] > 0, broken
    assert broken["fold/no-recall"]["answered"] >= 0.75  # Grep over the raw record hides most of it


# ---------------------------------------------------------------- agentic_asked: Recall by the question as asked

RECALLING = ["recap", "compaction", "stateful", "fold"]


@pytest.mark.slow
def test_agentic_asked_recall_rows_fall_when_nothing_is_indexed(monkeypatch: pytest.MonkeyPatch) -> None:
    """In agentic_asked the needles sit on ordinary lines among lookalikes, the model is told
    a paraphrased question and recalls by it: what the recall rows answer past their
    no-recall rows is Recall's. With Recall's ``on_evicted`` a no-op (nothing evicted is
    indexed), every recall row falls to its no-recall level (within one question: a recall
    row's tool traffic moves its distillations, so a value the recap carries forward may
    differ) and far below its honest level, stateful's included, which in ``agentic``
    (every needle on an ERROR line it notes) cannot fall."""

    def modes(workload: str, played: list[str]) -> dict[str, Any]:
        result = run_bench([workload], BenchConfig(quick=True, embedder="hash", modes=played))
        return dict(result["workloads"][workload]["modes"])

    played = [*RECALLING, *(f"{m}/no-recall" for m in RECALLING)]
    honest = modes("agentic_asked", played)
    for m in RECALLING:
        assert honest[m]["answered"] >= honest[f"{m}/no-recall"]["answered"] + 0.5, (m, honest[m], honest)
        assert honest[m]["recall_calls"] > 0, m

    monkeypatch.setattr("loomrt.recall.run_recall.RunRecall.on_evicted", lambda self, span: None)
    broken = modes("agentic_asked", played)
    for m in RECALLING:
        assert broken[m]["recall_calls"] > 0 and broken[m]["via_recall"] == 0, (m, broken[m])
        assert broken[m]["answered"] <= honest[f"{m}/no-recall"]["answered"] + 0.17, (m, broken[m]["answered"])
        assert broken[m]["answered"] <= honest[m]["answered"] - 0.5, (m, broken[m]["answered"])
    easy = modes("agentic", ["stateful"])["stateful"]
    assert easy["answered"] == 1.0  # the easy workload's stateful row is blind to the sabotage
