"""Recall wired into runs: the auto-grant at every site, rebuild on resume, degradation,
failure isolation, scope isolation, durable-memory merge (deterministic HashEmbedder)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np

from loomrt.recall import RECALL_PROMPT, HashEmbedder, MemoryHit, RunRecall
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.testing import ScriptedProvider, scripted_runtime

NEEDLE = "The staging database listens on db-stage.internal:6543 (user svc_loom)"
FILLER = "Unrelated chatter about lunch, the weather and the weekend plans, nothing to remember. " * 3


def spec(**context: Any) -> AgentSpec:
    ctx = {"mode": "compaction", "budget_tokens": 300, "keep_last_n": 2, "recall": True, **context}
    return AgentSpec(model="scripted/test", context=ctx, max_iterations=5)


def recall_call(query: str) -> dict[str, Any]:
    return {"tool_call": {"name": "Recall", "arguments": {"query": query}}}


def recall_results(rt: Runtime, run_id: str) -> list[list[dict[str, Any]]]:
    """The results of every Recall tool call the run made, in order."""
    return [
        json.loads(e.data["content"])["results"]
        for e in rt.store.events(run_id, kinds=["tool_result"])
        if e.data["name"] == "Recall"
    ]


def kinds(rt: Runtime, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in rt.store.events(run_id, kinds=[kind])]


async def chat(rt: Runtime, run: Any, n: int = 12) -> None:
    """A task, the needle, then filler turns until the needle is evicted."""
    await rt.send(run, "Help me set up the deployment.")
    await rt.send(run, NEEDLE)
    for i in range(n):
        await rt.send(run, f"turn {i}: {FILLER}")


def test_interactive_send_grants_recall_and_finds_an_evicted_needle() -> None:
    provider = ScriptedProvider(
        turns=["ok"] * 14 + [recall_call("staging database port"), "6543"],
        summaries=[
            "Summary: the user asked to set up the deployment; unrelated chatter about lunch and the weather followed."
        ],
    )
    rt = scripted_runtime(provider, embedder=HashEmbedder())
    run = rt.start(spec(), interactive=True)

    async def go() -> None:
        await chat(rt, run)
        await rt.send(run, "What is the staging database port?")

    asyncio.run(go())
    started = kinds(rt, run.run_id, "run_started")[0]
    assert "Recall" in started["tools"]
    assert RECALL_PROMPT in started["system"]
    assert "Recall" in {t.name for t in provider.calls[-1].tools}
    assert all(m.content != NEEDLE for m in run.context), "the needle must have been evicted"
    results = recall_results(rt, run.run_id)[0]
    assert results[0]["text"] == NEEDLE
    assert results[0]["source"] == "run" and results[0]["seq"] > 0 and results[0]["ts"].endswith("Z")


def test_one_shot_run_grants_recall_even_with_an_empty_allowlist() -> None:
    provider = ScriptedProvider(turns=[recall_call("anything"), "done"])
    rt = scripted_runtime(provider, embedder=HashEmbedder())
    result = rt.run_sync(spec(), "task")
    assert result.status == "done"
    assert kinds(rt, result.run_id, "run_started")[0]["tools"] == ["Recall"]
    answer = json.loads(kinds(rt, result.run_id, "tool_result")[0]["content"])
    assert answer["results"] == [] and "nothing has been evicted" in answer["note"]


def test_without_recall_there_is_no_recall_tool() -> None:
    provider = ScriptedProvider(turns=[recall_call("x"), "done"])
    rt = scripted_runtime(provider, embedder=HashEmbedder())
    result = rt.run_sync(spec(recall=False), "task")
    assert kinds(rt, result.run_id, "run_started")[0]["tools"] == []
    assert kinds(rt, result.run_id, "tool_result")[0]["is_error"]


def test_continue_rebuilds_the_index_and_grants_recall(tmp_path: Any) -> None:
    store = tmp_path / "record.sqlite"
    rt = scripted_runtime(
        ScriptedProvider(
            turns=["ok"] * 14,
            summaries=[
                "Summary: the user asked to set up the deployment; unrelated chatter about lunch and the weather followed."
            ],
        ),
        store_path=store,
        embedder=HashEmbedder(),
    )
    run = rt.start(spec(), interactive=True)
    asyncio.run(chat(rt, run))
    assert run.distillations >= 1
    # a new process: a fresh runtime over the same record
    rt2 = scripted_runtime(
        ScriptedProvider(
            turns=["ok"] * 14 + [recall_call("staging database"), "6543"],
            summaries=[
                "Summary: the user asked to set up the deployment; unrelated chatter about lunch and the weather followed."
            ],
        ),
        store_path=store,
        embedder=HashEmbedder(),
    )
    result = asyncio.run(rt2.continue_run(run.run_id, "What was the staging database address?"))
    assert result.status == "parked"
    assert recall_results(rt2, run.run_id)[-1][0]["text"] == NEEDLE


def test_resume_recalls_what_was_evicted_before_the_restart(tmp_path: Any) -> None:
    store = tmp_path / "record.sqlite"
    short = ScriptedProvider(
        turns=["ok"] * 14,
        summaries=[
            "Summary: the user asked to set up the deployment; unrelated chatter about lunch and the weather followed."
        ],
    )
    rt = scripted_runtime(short, store_path=store, embedder=HashEmbedder())
    run = rt.start(spec(), interactive=True)

    async def first() -> Any:
        await chat(rt, run)
        return await rt.send(run, "What was the staging database address?")  # the script runs out: fails

    assert asyncio.run(first()).status == "failed"
    full = ScriptedProvider(
        turns=["ok"] * 14 + [recall_call("staging database"), "db-stage.internal:6543"],
        summaries=[
            "Summary: the user asked to set up the deployment; unrelated chatter about lunch and the weather followed."
        ],
    )
    rt2 = scripted_runtime(full, store_path=store, embedder=HashEmbedder())
    reopened = rt2.open(run.run_id)
    assert reopened.toolset.recall.size() >= 1  # rebuilt from the distillation events
    result = asyncio.run(rt2.resume(run.run_id))
    assert result.output == "db-stage.internal:6543"
    assert recall_results(rt2, run.run_id)[-1][0]["text"] == NEEDLE


def test_no_embedder_is_lexical_only_and_says_so_once() -> None:
    provider = ScriptedProvider(
        turns=["ok"] * 14 + [recall_call("staging database"), "ok", recall_call("db-stage.internal:6543"), "ok"],
        summaries=[
            "Summary: the user asked to set up the deployment; unrelated chatter about lunch and the weather followed."
        ],
    )
    rt = scripted_runtime(provider, embedder=False)
    run = rt.start(spec(), interactive=True)

    async def go() -> None:
        await chat(rt, run)
        await rt.send(run, "q1")
        await rt.send(run, "q2")

    asyncio.run(go())
    assert not run.toolset.recall.index.dense
    notices = [n for n in kinds(rt, run.run_id, "notice") if n["source"] == "recall"]
    assert len(notices) == 1 and "lexical-only" in notices[0]["message"]
    first, second = recall_results(rt, run.run_id)
    assert first[0]["text"] == NEEDLE and second[0]["text"] == NEEDLE


class BrokenEmbedder:
    name = "broken"
    dim = 8

    def embed(self, texts: list[str]) -> np.ndarray:
        raise RuntimeError("model weights are corrupt")


def test_an_embedder_that_raises_never_fails_the_run() -> None:
    provider = ScriptedProvider(
        turns=["ok"] * 14 + [recall_call("staging database"), "fine"],
        summaries=[
            "Summary: the user asked to set up the deployment; unrelated chatter about lunch and the weather followed."
        ],
    )
    rt = scripted_runtime(provider, embedder=BrokenEmbedder())
    run = rt.start(spec(), interactive=True)

    async def go() -> Any:
        await chat(rt, run)
        return await rt.send(run, "What was it?")

    result = asyncio.run(go())
    assert result.status == "parked" and result.output == "fine"
    notices = [n["message"] for n in kinds(rt, run.run_id, "notice")]
    assert sum("degraded to lexical-only" in m and "corrupt" in m for m in notices) == 1
    assert recall_results(rt, run.run_id)[0][0]["text"] == NEEDLE  # lexical recall still works


def test_an_indexing_error_is_recorded_not_raised() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    recall = RunRecall(run_id="r1", emit=lambda k, d: events.append((k, d)), embedder=HashEmbedder())

    class Span:  # not an EvictedSpan: its messages are not messages
        run_id = "r1"
        distillation_seq = 9
        messages = (object(),)

    recall.on_evicted(Span())  # type: ignore[arg-type]
    assert [k for k, _ in events] == ["callback_error"]
    assert events[0][1]["distillation_seq"] == 9


def test_a_run_never_sees_another_runs_spans() -> None:
    other_needle = "The production vault token path is /secret/prod/tokens/alpha"

    def provider_for(query: str) -> ScriptedProvider:
        return ScriptedProvider(
            turns=["ok"] * 14 + [recall_call(query), "done"],
            summaries=[
                "Summary: the user asked to set up the deployment; unrelated chatter about lunch and the weather followed."
            ],
        )

    rt_a = scripted_runtime(provider_for("vault token path"), embedder=HashEmbedder())
    run_a = rt_a.start(spec(), interactive=True)
    provider_b = provider_for("vault token path")
    rt_b = Runtime(rt_a.store, providers=lambda s, m: provider_b, embedder=HashEmbedder())
    run_b = rt_b.start(spec(), interactive=True)

    async def go() -> None:
        await rt_a.send(run_a, "task A")
        await rt_a.send(run_a, other_needle)
        for i in range(12):
            await rt_a.send(run_a, f"a{i}: {FILLER}")
        await chat(rt_b, run_b)
        await rt_a.send(run_a, "?")
        await rt_b.send(run_b, "?")

    asyncio.run(go())
    assert recall_results(rt_a, run_a.run_id)[0][0]["text"] == other_needle
    texts_b = [r["text"] for r in recall_results(rt_b, run_b.run_id)[0]]
    assert texts_b and other_needle not in texts_b
    assert all(e.run_id == run_b.run_id for e in run_b.toolset.recall.index.entries.values())
    # a span addressed to another run is ignored by the callback
    from loomrt.messages import EvictedSpan, Message

    before = run_b.toolset.recall.size()
    run_b.toolset.recall.on_evicted(
        EvictedSpan(run_a.run_id, "agent", "compaction", 1, (Message(role="user", content=other_needle, seq=1),))
    )
    assert run_b.toolset.recall.size() == before


def test_the_fifo_cap_drops_the_oldest_entries_through_a_run() -> None:
    provider = ScriptedProvider(
        turns=["ok"] * 60,
        summaries=[
            "Summary: the user asked to set up the deployment; unrelated chatter about lunch and the weather followed."
        ],
    )
    rt = scripted_runtime(provider, embedder=HashEmbedder())
    run = rt.start(spec(recall_max_entries=16), interactive=True)

    async def go() -> None:
        for i in range(60):
            await rt.send(run, f"fact {i}: the code for item {i} is K{i:04d}. {FILLER}")

    asyncio.run(go())
    index = run.toolset.recall.index
    assert len(index) == 16 and index.dense_size() == 16 and index.evicted_total > 0
    assert [e.id for e in index.entries.values()] == sorted(e.id for e in index.entries.values())
    assert all("K0001" not in h.text for h in run.toolset.recall.search("K0001", top_k=20))  # the oldest are gone
    newest = max(index.entries.values(), key=lambda e: e.id)
    code = newest.text.split(" is ")[1].split(".")[0]
    assert code in run.toolset.recall.search(code)[0].text


class Memory:
    """A durable-memory source (the protocol harvest will implement)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, Any]] = []

    def search(self, query: str, top_k: int, scopes: Any = None) -> list[Any]:
        self.asked.append((query, top_k, scopes))
        return [
            MemoryHit(text="The user prefers port 7000 for local dev", score=0.99, ts=0.0, scope="user"),
            {"text": "low score fact", "score": 0.0001},
        ]


def test_memory_hits_merge_by_score() -> None:
    memory = Memory()
    recall = RunRecall(run_id="r1", embedder=HashEmbedder(), memory=memory, scopes=["user"])
    from loomrt.messages import EvictedSpan, Message

    recall.on_evicted(EvictedSpan("r1", "a", "compaction", 5, (Message(role="user", content=NEEDLE, seq=3, ts=1.0),)))
    hits = recall.search("staging database port", top_k=3)
    assert {h.source for h in hits} == {"run", "memory"}
    assert hits == sorted(hits, key=lambda h: -h.score)
    assert memory.asked == [("staging database port", 3, ["user"])]
    out = recall.tool.fn(query="port", top_k=5)
    assert any(r["source"] == "memory" and r["scope"] == "user" for r in out["results"])


def test_the_token_cap_bounds_every_answer() -> None:
    from loomrt.messages import EvictedSpan, Message
    from loomrt.tokens import count_text

    recall = RunRecall(run_id="r1", embedder=HashEmbedder(), context=spec(recall_max_tokens=200).context)
    big = " ".join(f"line {i}: error E{i} in /var/log/app-{i}.log" for i in range(400))
    msgs = tuple(Message(role="tool", name="read_file", content=f"{big} part {j}", seq=10 + j) for j in range(3))
    recall.on_evicted(EvictedSpan("r1", "a", "compaction", 20, msgs))
    out = recall.tool.fn(query="error E17 /var/log/app-17.log", top_k=10)
    assert count_text(json.dumps(out)) <= 200 + 120  # the cap plus the JSON keys around the texts
    assert out["results"][0]["text"] and len(out["results"]) >= 1
    assert out["results"][0].get("chunk")  # long tool results are chunked
    small = RunRecall(run_id="r2", embedder=HashEmbedder(), context=spec(recall_max_tokens=64).context)
    small.on_evicted(EvictedSpan("r2", "a", "compaction", 2, (Message(role="user", content=big[:3000], seq=1),)))
    first = small.tool.fn(query="error E3", top_k=5)["results"][0]
    assert first["truncated"] and "record seq 1" in first["text"]


def test_rebuild_from_the_record_matches_the_live_index() -> None:
    provider = ScriptedProvider(
        turns=["ok"] * 14,
        summaries=[
            "Summary: the user asked to set up the deployment; unrelated chatter about lunch and the weather followed."
        ],
    )
    rt = scripted_runtime(provider, embedder=HashEmbedder())
    run = rt.start(spec(), interactive=True)
    asyncio.run(chat(rt, run))
    live = [(e.seq, e.distillation_seq, e.role, e.text, e.before) for e in run.toolset.recall.index.entries.values()]
    embedder = HashEmbedder()
    rebuilt = RunRecall(run_id=run.run_id, context=run.spec.context, embedder=embedder)
    queued = rebuilt.rebuild(rt.store.events(run.run_id))
    assert embedder.calls == 0  # opening a run embeds nothing until recall is needed
    assert rebuilt.size() == queued == len(live) and embedder.calls == 1
    again = [(e.seq, e.distillation_seq, e.role, e.text, e.before) for e in rebuilt.index.entries.values()]
    assert live and again == live
    query = "staging database db-stage.internal"
    assert [h.seq for h in rebuilt.search(query)] == [h.seq for h in run.toolset.recall.search(query)]


def test_recall_by_seq_gives_back_one_evicted_message_whole() -> None:
    """A [#seq] pointer leads back to the exact words: Recall(seq=N) returns the message at N
    whole, a long one rebuilt exactly from its overlapping chunks."""
    import random

    from loomrt.messages import EvictedSpan, Message
    from loomrt.recall import RunRecall

    rng = random.Random(5)
    long = "  ".join(
        " ".join(rng.choice(["alpha", "beta", "gamma", "10.0.0.7:5432", "ERR-4471"]) for _ in range(9))
        for _ in range(60)
    )  # about 540 words, odd spacing: four chunks
    recall = RunRecall(run_id="r1", embedder=False)
    recall.on_evicted(
        EvictedSpan(
            "r1",
            "a",
            "compaction",
            9,
            (
                Message(role="user", content="short one", seq=3, ts=1.0),
                Message(role="tool", name="shell", content=long, seq=4, ts=2.0),
            ),
        )
    )
    assert len([e for e in recall.index.entries.values() if e.seq == 4]) >= 3
    out = recall.tool.fn(seq=4)
    assert out["results"][0]["text"] == long or out["results"][0].get("truncated")
    (hit,) = recall.at_seq(4)
    assert hit.text == long and hit.seq == 4
    assert recall.tool.fn(seq=3)["results"][0]["text"] == "short one"
    assert "nothing evicted at #77" in recall.tool.fn(seq=77)["note"]


def test_searches_of_the_history_are_not_indexed() -> None:
    """A Recall or Grep call is a query, and its result a copy of older messages: an evicted
    span indexes what was said around them (and a non-search call), never the search itself."""
    from loomrt.messages import EvictedSpan, Message, ToolCall

    question = "Remind me: what was the landlord's door code?"
    recall = RunRecall(run_id="r1", embedder=False)
    recall.on_evicted(
        EvictedSpan(
            "r1",
            "a",
            "compaction",
            9,
            (
                Message(role="user", content="It turns out my landlord's door code is 5619#10.", seq=2, ts=1.0),
                Message(
                    role="assistant",
                    content="",
                    seq=3,
                    ts=2.0,
                    tool_calls=(
                        ToolCall("c1", "Recall", {"query": question}),
                        ToolCall("c2", "Grep", {"pattern": "door code"}),
                    ),
                ),
                Message(
                    role="tool",
                    name="Grep",
                    content='{"hits": [{"snippet": "my landlord\'s door code is 5619#10"}]}',
                    seq=4,
                    ts=3.0,
                ),
                Message(
                    role="assistant",
                    content="Let me look.",
                    seq=5,
                    ts=4.0,
                    tool_calls=(
                        ToolCall("c3", "Recall", {"query": question}),
                        ToolCall("c4", "shell", {"cmd": "cat door.txt"}),
                    ),
                ),
            ),
        )
    )
    texts = {e.seq: e.text for e in recall.index.entries.values()}
    assert set(texts) == {2, 5}
    assert "Recall" not in texts[5] and question not in texts[5] and "cat door.txt" in texts[5]
    assert [h.seq for h in recall.search(question, top_k=5)] == [2, 5]


class SlowEmbedder(HashEmbedder):
    """A hash embedder that takes its time off the GIL, as MiniLM does, and counts what it embeds."""

    releases_gil = True

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.texts = seconds, 0

    def embed(self, texts: list[str]) -> np.ndarray:
        import time

        self.texts += len(texts)
        time.sleep(self.seconds)
        return super().embed(texts)


def test_a_query_while_the_background_embeds_a_span_waits_for_it_instead_of_embedding_it_again() -> None:
    from loomrt.messages import EvictedSpan, Message

    embedder = SlowEmbedder(0.3)
    recall = RunRecall(run_id="r", embedder=embedder)
    span = tuple(Message(role="user", content=f"line {i}: the {w} job failed", seq=i) for i, w in enumerate("abcdefgh"))

    async def go() -> list[str]:
        recall.on_evicted(EvictedSpan("r", "agent", "compaction", 9, span))
        await asyncio.sleep(0.05)  # the next model call: the thread is still embedding the span
        hits = recall.search("which job failed, the c job?", top_k=3)
        await asyncio.sleep(0.05)  # the drain hears that the query took its slice
        return [h.text for h in hits]

    texts = asyncio.run(go())
    assert recall.backlog == 0 and recall.size() == 8
    assert embedder.texts == 8 + 1  # the span once (not twice) and the query
    assert any("the c job" in t for t in texts)


def test_a_query_before_the_thread_reaches_the_span_embeds_it_itself_once() -> None:
    from loomrt.messages import EvictedSpan, Message

    embedder = SlowEmbedder(0.0)
    recall = RunRecall(run_id="r", embedder=embedder)
    span = tuple(Message(role="user", content=f"entry {i} about the {w} host", seq=i) for i, w in enumerate("abcd"))

    async def go() -> None:
        recall.on_evicted(EvictedSpan("r", "agent", "compaction", 5, span))
        recall.search("the b host", top_k=2)  # before the loop has run the drain at all
        await asyncio.sleep(0.05)

    asyncio.run(go())
    assert recall.backlog == 0 and recall.size() == 4
    assert embedder.texts == 4 + 1


def test_a_query_cancels_a_slice_still_queued_behind_another_runs_and_a_cancelled_drain_stops() -> None:
    """The embedding thread is one for every run of the process. A query whose slice still
    waits behind another run's takes it back and embeds it itself, once; and a drain that is
    cancelled (its loop closing) stops, its backlog left to the next query."""
    import threading

    from loomrt.messages import EvictedSpan, Message
    from loomrt.recall.run_recall import _embedding_thread

    def span(seq: int) -> tuple[Message, ...]:
        return tuple(
            Message(role="user", content=f"entry {seq + i} about the {w} host", seq=seq + i)
            for i, w in enumerate("abcd")
        )

    async def go(recall: RunRecall, query: bool) -> asyncio.Task[None] | None:
        gate = threading.Event()
        _embedding_thread().submit(gate.wait, 5)  # another run's slice, holding the thread
        recall.on_evicted(EvictedSpan("r", "agent", "compaction", 5, span(1)))
        await asyncio.sleep(0.02)  # the drain has submitted its slice, queued behind it
        drain = recall._draining
        if query:
            recall.search("the b host", top_k=2)
        else:
            assert drain is not None
            drain.cancel()
        await asyncio.sleep(0.02)
        gate.set()
        if drain is not None:
            await asyncio.gather(drain, return_exceptions=True)
        return drain

    embedder = SlowEmbedder(0.0)
    taken = RunRecall(run_id="r", embedder=embedder)
    drain = asyncio.run(go(taken, query=True))
    assert drain is not None and drain.done() and not drain.cancelled() and drain.exception() is None
    assert taken.backlog == 0 and taken.size() == 4 and embedder.texts == 4 + 1

    embedder = SlowEmbedder(0.0)
    stopped = RunRecall(run_id="r", embedder=embedder)
    drain = asyncio.run(go(stopped, query=False))
    assert drain is not None and drain.cancelled()
    assert stopped.backlog == 4 and embedder.texts == 0  # nothing embedded after the cancel
