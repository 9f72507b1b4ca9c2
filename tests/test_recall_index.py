"""The recall index on its own: tokens, chunks, the FIFO cap, fusion, embedders."""

from __future__ import annotations

import numpy as np
import pytest

from loomrt.recall import HashEmbedder, resolve_embedder
from loomrt.recall.embedders import CachedEmbedder
from loomrt.recall.index import Entry, Fusion, RecallIndex, chunk_text, search_together, tokenize


def entry(text: str, seq: int, *, before: str = "", role: str = "user") -> Entry:
    return Entry(id=-1, run_id="r", seq=seq, distillation_seq=100, role=role, text=text, before=before)


def test_tokens_keep_exact_values_whole_and_their_parts() -> None:
    tokens = tokenize("Connect to db-stage.internal:6543 and read /etc/app/config.yaml (ERR-4471)")
    for whole in ("db-stage.internal:6543", "etc/app/config.yaml", "err-4471"):
        assert whole in tokens
    for part in ("db", "stage", "6543", "config", "yaml", "4471"):
        assert part in tokens
    assert "and" not in tokens and "to" not in tokens  # stopwords
    assert tokenize("painted paintings")[0] == tokenize("painting")[0]  # stemmed


def test_chunks_are_verbatim_overlapping_slices() -> None:
    text = " ".join(f"w{i}" for i in range(400))
    chunks = chunk_text(text, words=100, overlap=20)
    assert len(chunks) == 5
    assert all(c in text for c in chunks)
    assert chunks[0].split()[-20:] == chunks[1].split()[:20]
    assert chunks[-1].endswith("w399")
    assert chunk_text("short text") == ["short text"]


def test_a_cached_embedder_embeds_each_text_once_and_returns_the_same_vectors() -> None:
    inner = HashEmbedder(64)
    cached = CachedEmbedder(inner, max_texts=3)
    texts = ["port 6543", "the key is ZEBA-41", "port 6543", "pepper the dog"]
    first = cached.embed(texts)
    assert np.array_equal(first, inner.embed(texts))  # the same vectors, in the caller's order
    assert cached.embedded == 3  # a text repeated in one call is embedded once
    again = cached.embed(["pepper the dog", "the key is ZEBA-41"])
    assert cached.embedded == 3 and np.array_equal(again, first[[3, 1]])
    cached.embed(["a new text"])  # past max_texts the least recently used goes
    cached.embed(["port 6543"])
    assert cached.embedded == 5
    assert cached.embed([]).shape == (0, 64) and cached.name == "hash" and cached.dim == 64


def test_the_bench_shares_one_cache_across_the_modes_it_plays() -> None:
    from loomrt.bench.core import BenchConfig

    config = BenchConfig(embedder="hash")
    assert config.play_embedder() is config.play_embedder()
    assert isinstance(config.play_embedder(), CachedEmbedder)
    assert "_play_embedder" not in config.to_json()
    assert BenchConfig(embedder="none").play_embedder() is False
    assert config.make_embedder() == "hash"  # the timed measures' embedder stays uncached


def test_hash_embedder_is_deterministic_and_normalised() -> None:
    a, b = HashEmbedder(64), HashEmbedder(64)
    va, vb = a.embed(["the staging port is 6543", ""]), b.embed(["the staging port is 6543", ""])
    assert np.array_equal(va, vb) and va.dtype == np.float32 and va.shape == (2, 64)
    assert abs(float(np.linalg.norm(va[0])) - 1) < 1e-5 and float(np.linalg.norm(va[1])) == 0
    sim = a.embed(["staging port"]) @ a.embed(["the staging port is 6543", "lunch at noon"]).T
    assert sim[0, 0] > sim[0, 1]


def test_resolve_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_embedder(False) is None and resolve_embedder("none") is None
    assert isinstance(resolve_embedder("hash"), HashEmbedder)
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "none")
    assert resolve_embedder(None) is None
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "bogus")
    with pytest.raises(TypeError, match="LOOMRT_RECALL_EMBEDDER"):
        resolve_embedder(None)
    with pytest.raises(TypeError, match="not an embedder"):
        resolve_embedder(object())


@pytest.mark.parametrize("embedder", [None, HashEmbedder()], ids=["lexical", "hash"])
def test_fifo_cap_removes_the_oldest_from_every_index(embedder: HashEmbedder | None) -> None:
    index = RecallIndex(embedder, max_entries=16)
    for batch in range(5):
        index.add([entry(f"item {batch * 10 + i} code Z{batch * 10 + i:03d}", batch * 10 + i) for i in range(10)])
    assert len(index) == 16 and index.evicted_total == 34
    assert index.dense_size() == (16 if embedder else 0)
    ids = list(index.entries)
    assert ids == sorted(ids) and ids[0] == 34  # ids only increase; the oldest went first
    assert index.search("Z005", k=3) == [] or all("Z005" not in h.entry.text for h in index.search("Z005", k=3))
    assert index.search("Z047", k=1)[0].entry.text == "item 47 code Z047"


def test_search_is_best_first_and_scored_in_unit_range() -> None:
    index = RecallIndex(HashEmbedder())
    index.add(
        [
            entry("The release tarball lives at /srv/releases/loom-2.4.1.tar.gz", 1),
            entry("We had pasta for lunch", 2),
            entry("The release notes are in docs/releases.md", 3),
        ]
    )
    hits = index.search("where is the release tarball", k=3)
    assert hits[0].entry.seq == 1
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(0 <= h.score <= 1 for h in hits)
    assert index.search("   ") == []


def test_the_window_finds_an_answer_by_its_question() -> None:
    index = RecallIndex(None)
    index.add(
        [
            entry("Which city did you move to last spring?", 1),
            entry("Lisbon, and I love it.", 2, before="Which city did you move to last spring?"),
            entry("My sister moved to Porto.", 3, before="Lisbon, and I love it."),
        ]
    )
    assert [h.entry.seq for h in index.search("what city did they move to last spring", k=2)] == [1, 2]


def test_an_embedder_that_raises_leaves_the_index_unchanged() -> None:
    class Bad:
        name, dim = "bad", 4

        def embed(self, texts: list[str]) -> np.ndarray:
            raise RuntimeError("boom")

    index = RecallIndex(Bad())
    with pytest.raises(RuntimeError):
        index.add([entry("x", 1)])
    assert len(index) == 0
    index.disable_dense()
    index.add([entry("x marks the spot", 1)])
    assert index.search("spot")[0].entry.seq == 1


def test_incremental_bm25_equals_a_fresh_build_after_adds_and_removes() -> None:
    import random

    import numpy as np

    from loomrt.recall.bm25 import IncrementalBM25

    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(40)]
    # "step" is in every document: its postings are one run of consecutive documents
    docs = {i: ["step"] + [rng.choice(vocab) for _ in range(rng.randint(1, 12))] for i in range(300)}
    live = IncrementalBM25()
    for i, tokens in docs.items():
        live.add(i, tokens)
    for i in range(0, 120):  # drop the oldest, replace a few
        live.remove(i, docs.pop(i))
    for i in (200, 250):
        docs[i] = ["w1", "w2", "w2"]
        live.add(i, docs[i])
    fresh = IncrementalBM25()
    for i, tokens in docs.items():
        fresh.add(i, tokens)
    for query in (["w1"], ["w2", "w7"], ["w3", "w3", "w39"], ["nothing"], ["step"], ["step", "w2"]):
        a = live.scores(query, None, 300, first=0)
        b = fresh.scores(query, None, 300, first=0)
        assert np.allclose(a, b)
        assert np.allclose(live.scores(query, None, 180, first=120), b[120:])
    # a term's score follows the formula: idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))
    one = IncrementalBM25()
    one.add(0, ["a", "b"])
    one.add(1, ["b", "b", "c"])
    avgdl = 2.5
    idf = np.log(1 + (2 - 1 + 0.5) / (1 + 0.5))
    assert np.isclose(one.scores(["a"], None, 2)[0], idf * 1 / (1 + 1.5 * (1 - 0.75 + 0.75 * 2 / avgdl)))


def test_dense_scores_follow_entry_order_after_fifo_drops() -> None:
    """The dense side scores every entry with one product over its stored vectors; it must
    agree with the entries' own vectors, also after the oldest entries were dropped."""
    index = RecallIndex(HashEmbedder(), max_entries=40)
    for batch in range(10):
        index.add(
            [
                entry(f"entry {i} about deploy {i % 7} and billing {i % 3}", i)
                for i in range(batch * 10, batch * 10 + 10)
            ]
        )
    embedder = index.embedder
    assert embedder is not None
    q = embedder.embed(["deploy 3 billing"])[0]
    fast = index._dense_scores(q)
    slow = embedder.embed([e.label for e in index.entries.values()]) @ q
    mean, best = float(slow.mean()), float(slow.max())
    assert np.allclose(fast, (slow - mean) / (best - mean), atol=1e-5)


def test_clustered_codes_find_every_vector_by_itself_through_drops_and_retraining() -> None:
    """From ``ivf_min`` vectors on, the scan reads the nearest clusters only: a vector's own
    cluster is the nearest to it, so a live vector asked for by itself must come back first,
    at its position, after FIFO drops, compaction and training again at four times the size;
    a dropped one must never come back."""
    from loomrt.recall.dense import DenseVectors

    rng = np.random.default_rng(7)

    def unit(n: int) -> np.ndarray:
        x = rng.standard_normal((n, 32)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    vectors = DenseVectors(32, ivf_min=400)
    rows = unit(399)
    vectors.add(rows)
    assert not vectors.clustered
    more = unit(300)
    vectors.add(more)
    rows = np.concatenate([rows, more])
    assert vectors.clustered and vectors._trained == 699  # type: ignore[attr-defined]

    def check() -> None:
        assert len(vectors) == len(rows)
        for position in rng.choice(len(rows), 40, replace=False):
            found = vectors.top(rows[position], 5)
            assert found[0] == position and found.max() < len(rows)

    check()
    for _ in range(6):  # drops past a quarter compact the rows; 2,796 vectors train again
        vectors.drop_oldest(250)
        rows = rows[250:]
        more = unit(700)
        vectors.add(more)
        rows = np.concatenate([rows, more])
        check()
    assert vectors._trained >= 4 * 699 and vectors._offset > 0  # type: ignore[attr-defined]
    assert np.array_equal(vectors.live, rows)


@pytest.mark.parametrize("passages", [False, True])
@pytest.mark.parametrize("cap", [None, 300])
def test_a_large_index_finds_the_same_top_k_from_candidates_as_from_every_entry(
    cap: int | None, passages: bool
) -> None:
    """Past ``exact_max`` the dense side scores only candidates (8-bit codes and lexical
    scores pick them, a bound adds any other entry that could reach the top): the hits and
    their scores must equal scoring every entry, with and without FIFO drops, and with
    long entries whose passages have vectors of their own."""
    import random

    from loomrt.recall.dense import passages_of

    rng = random.Random(3)
    words = "deploy billing ledger rollback port cache queue tenant invoice shard replica".split()

    def text(i: int) -> str:
        if passages and i % 3 == 0:  # a long entry: sentences of 8 words, so about 8 passages
            return " ".join(" ".join(rng.choice(words) for _ in range(7)) + f" {i}." for _ in range(24))
        return " ".join(rng.choice(words) for _ in range(6)) + f" {i}"

    index = RecallIndex(HashEmbedder(), max_entries=cap or 10_000)
    for start in range(0, 600, 50):
        index.add([entry(text(i), i) for i in range(start, start + 50)])
    assert (len(index._dense.passages) > 500) == passages  # type: ignore[union-attr]
    assert passages == any(len(passages_of(e.label)) > 4 for e in index.entries.values())
    queries = [
        "deploy ledger",
        "rollback of the replica shard",
        "cache",
        "nothing matches this",
        "invoice 412",
        "tenant 77 queue",
    ]
    index.candidates = 1  # as few as k: most of the top must come from the bound
    for query in queries:
        index.exact_max = 10**9
        exact = [(h.entry.id, h.score) for h in index.search(query, 5)]
        index.exact_max = 10
        pruned = [(h.entry.id, h.score) for h in index.search(query, 5)]
        assert [s for _, s in pruned] == [s for _, s in exact], query
        last = exact[-1][1] if exact else 0.0  # entries tied with the k-th may be any of them
        assert {i for i, s in pruned if s > last} == {i for i, s in exact if s > last}, query


def test_bm25_queried_then_changed_scores_as_a_fresh_index() -> None:
    """After adds, removals (dead slots) and replacements, the scores must equal those of an
    index built from scratch on the same documents."""
    import random

    from loomrt.recall.bm25 import IncrementalBM25

    rng = random.Random(11)
    words = [f"w{i}" for i in range(30)]
    live = IncrementalBM25()
    docs: dict[int, list[str]] = {}
    next_id = 0
    for step in range(400):
        action = rng.random()
        if action < 0.5 or not docs:
            tokens = [rng.choice(words) for _ in range(rng.randint(1, 12))]
            docs[next_id] = tokens
            live.add(next_id, tokens)
            next_id += 1
        elif action < 0.7:
            doc = rng.choice(sorted(docs))
            live.remove(doc, docs.pop(doc))
        elif action < 0.75:
            doc = rng.choice(sorted(docs))  # a removal, then the document again
            live.remove(doc, docs[doc])
            docs[doc] = [rng.choice(words) for _ in range(rng.randint(1, 12))]
            live.add(doc, docs[doc])
        elif action < 0.85:
            doc = rng.choice(sorted(docs))  # a replacement in place, as the neighbourhood index does
            tokens = [rng.choice(words) for _ in range(rng.randint(1, 12))]
            live.add(doc, tokens, old=docs[doc] if rng.random() < 0.7 else None)
            docs[doc] = tokens
        else:
            query = [rng.choice(words) for _ in range(3)]
            fresh = IncrementalBM25()
            for d, tokens in docs.items():
                fresh.add(d, tokens)
            assert np.allclose(live.scores(query, None, next_id), fresh.scores(query, None, next_id), atol=1e-5), step
            for p in live._postings.values():  # every live slot is its document's, in order where it says so
                slots = np.array(p.docs, dtype=np.int64)
                assert all(slots[at] == d for d, at in p.slot.items()), step
                assert not p.ordered or bool(np.all(np.diff(slots) > 0)), step


def test_the_neighbourhood_index_keeps_a_common_term_in_document_order() -> None:
    """Each addition replaces the neighbourhood documents of the entries before it; a term
    they keep keeps its slots, so a term of every entry stays one run of consecutive
    documents (scored as a slice) through additions and FIFO drops."""
    index = RecallIndex(None, max_entries=50)
    for i in range(120):
        index.add([entry(f"step {i} of the plan" + (" retry" if i % 7 == 0 else ""), i)])
    postings = index._lexical_context._postings["step"]
    assert postings.ordered and len(postings.slot) == 50
    docs = np.frombuffer(postings.docs, dtype=np.int64)[np.frombuffer(postings.tf, dtype=np.float32) > 0]
    assert docs.tolist() == list(index.entries)
    # a term of some entries reaches its neighbours' documents after them: put in its place
    retry = index._lexical_context._postings["retri"]
    assert retry.ordered and sorted(retry.slot) == [
        i
        for i in index.entries
        if any(j % 7 == 0 for j in range(i - index.fusion.context_radius, i + index.fusion.context_radius + 1))
    ]


def test_bm25_compacts_dead_slots_and_scores_as_a_fresh_index() -> None:
    """A removed document leaves a dead slot in each of its terms' arrays; once a quarter of
    a term's slots are dead they are dropped, and the scores do not move."""
    from loomrt.recall.bm25 import IncrementalBM25

    live, fresh = IncrementalBM25(), IncrementalBM25()
    for doc in range(400):
        live.add(doc, ["common", f"rare{doc}", "odd" if doc % 2 else "even"])
    for doc in range(150):  # the FIFO cap drops the oldest
        live.remove(doc, ["common", f"rare{doc}", "odd" if doc % 2 else "even"])
    for doc in range(150, 400):
        fresh.add(doc, ["common", f"rare{doc}", "odd" if doc % 2 else "even"])
    postings = live._postings["common"]
    assert len(postings.docs) < 400 and len(postings.slot) == 250  # compacted, none lost
    for query in (["common"], ["odd", "rare399"], ["rare10"], ["even", "even"]):
        assert np.allclose(
            live.scores(query, None, 250, first=150), fresh.scores(query, None, 250, first=150), atol=1e-6
        ), query


def test_indexes_searched_together_share_one_bm25_scale() -> None:
    """Alone, each index weighs terms by its own statistics and scales BM25 by its own best,
    so a weak best match scores 1 and the same words score differently in a small index and
    a large one; searched together, by the statistics and the best of all of them."""
    lexical = Fusion(dense=0.0, lexical=1.0, lexical_window=0.0, lexical_context=0.0)

    def index(*texts: str) -> RecallIndex:
        out = RecallIndex(None, fusion=lexical, passages=False)
        out.add([Entry(id=-1, run_id="r", seq=i, distillation_seq=0, role="user", text=t) for i, t in enumerate(texts)])
        return out

    query = "What are the names of Ana's cats?"
    answer = "Ana named her cats Luna and Oliver."
    weak = index("Ana loved reading.", "The market was busy.")
    strong = index(answer, *(f"The weather was grey on day {i}." for i in range(300)))
    small = index(answer, "The market was busy.")
    assert weak.search(query, 1)[0].score == 1.0  # alone: the best of weak matches
    (w,), (s, *_) = search_together([weak, strong], query, 2)
    assert s.score == 1.0 and w.score < 0.5
    (a,), (b,) = search_together([small, strong], query, 1)
    assert a.entry.text == b.entry.text == answer and a.score == b.score == 1.0  # the same words, the same score
    (alone,) = small.search(query, 1)
    assert alone.bm25 != b.bm25  # (alone, the small index weighs the words otherwise)
    with pytest.raises(ValueError, match="one BM25 signal"):
        search_together([RecallIndex(None), strong], query, 1)  # the default fusion weighs three
