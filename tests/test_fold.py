"""fold mode: cards and catalogs, the coverage invariant, every level smaller, the tools
(and that they reach the model at every site), verified cards, fallbacks, provider
failures, and how a fold sizes its stretch. When a fold runs (the watermarks, cache-idle
deferral, the worker, refold) is tests/test_fold_schedule.py."""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from fold_kit import WORDS, coverage, said, spec

from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.run.between_turns import between_turns
from loomrt.run.cards import CARD_BLOCK, Card
from loomrt.run.projection import project
from loomrt.run.reducers.fold.verify import invented
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.spec_load import load_agents
from loomrt.testing import FunctionProvider, ScriptedProvider, scripted_runtime
from loomrt.tokens import count_dicts, count_tools

FOLD_TOOLS = {"Describe", "Expand", "Grep"}


def history(run: Any) -> list[int]:
    return sorted(s for s, m in run.view.messages.items() if m.role != "system")


def leaves(run: Any, card: Card) -> list[Card]:
    if not card.children:
        return [card]
    return [leaf for c in card.children for leaf in leaves(run, run.view.cards[c])]


def tool(run: Any, name: str) -> Any:
    return run.toolset.tools[name]


@pytest.mark.slow
def test_a_2000_message_run_folds_within_budget_losslessly(record_store: Any) -> None:
    rng = random.Random(3)
    n = 1000
    provider = ScriptedProvider(
        turns=[{"text": said(i, rng)} for i in range(n)], summaries=[{"extractive": 400, "words": 12}]
    )
    rt = scripted_runtime(provider, store=record_store)
    run = rt.start(spec(), interactive=True)
    violations: list[str] = []

    def check(event: Any) -> None:
        if event.kind == "distillation":
            got, want = coverage(run), history(run)
            if sorted(got) != want or len(got) != len(set(got)):
                violations.append(f"seq {event.seq}: the catalog covers {len(got)} seqs, history has {len(want)}")

    run.listeners.append(check)
    inputs = [said(10_000 + i, rng) for i in range(n)]

    async def go() -> None:
        for text in inputs:
            await rt.send(run, text)

    asyncio.run(go())
    assert not violations
    assert len(history(run)) == 2 * n
    # the model-visible context stayed under the budget at every call
    sizes = [count_dicts(c.messages) + count_tools(c.tools) for c in provider.calls if c.purpose == "turn"]
    assert max(sizes) <= run.budget
    cards = run.view.cards
    assert {c.depth for c in cards.values()} >= {0, 1, 2}
    for card in cards.values():  # every level strictly smaller than the one below
        if card.children:
            assert card.tokens < sum(cards[c].tokens for c in card.children), card.id
        else:
            source = sum(len(run.view.messages[s].content) for s in card.seqs)
            assert len(card.text) < source, card.id
    # every original is reachable by Expand, word for word, from the catalog down
    expand = tool(run, "Expand")
    reached: set[int] = set()

    async def walk(card_id: str) -> None:
        card = cards[card_id]
        page, pages = 1, 1
        while page <= pages:
            text = await expand.call({"id": card_id, "page": page})
            pages = int(re.search(r"page \d+ of (\d+)", text).group(1))  # type: ignore[union-attr]
            if not card.children:
                for seq in map(int, re.findall(r"^\[#(\d+)\]", text, re.M)):
                    assert run.view.messages[seq].content in text
                    reached.add(seq)
            page += 1
        for child in card.children:
            await walk(child)

    async def walk_all() -> None:
        for m in run.context:
            if m.synthetic == CARD_BLOCK:
                await walk(m.ref)

    asyncio.run(walk_all())
    folded = {s for m in run.context if m.synthetic == CARD_BLOCK for s in cards[m.ref].seqs}
    assert reached == folded
    # Grep finds an exact string of folded history
    needle = "/srv/app10003.conf"
    (where,) = [e.seq for e in rt.store.events(run.run_id, kinds=["user_input"]) if needle in e.data["content"]]
    assert where in folded
    hits = asyncio.run(tool(run, "Grep").call({"pattern": needle, "mode": "text", "scope": "messages"}))
    assert [h["id"] for h in json.loads(hits)["hits"]] == [f"#{where}"]
    # the record alone rebuilds the same context
    assert [m.to_dict() for m in project(rt.store.events(run.run_id)).context] == [m.to_dict() for m in run.context]


def test_describe_expand_and_grep_answer_from_the_record() -> None:
    rng = random.Random(5)
    provider = ScriptedProvider(turns=[{"text": said(i, rng)} for i in range(60)], summaries=[{"extractive": 300}])
    rt = scripted_runtime(provider)
    run = rt.start(spec(keep_recent=8, leaf_min_messages=4), interactive=True)

    async def go() -> None:
        for i in range(60):
            await rt.send(run, said(500 + i, rng) + " " + "filler words " * 30)

    asyncio.run(go())
    card = next(m.ref for m in run.context if m.synthetic == CARD_BLOCK)
    described = json.loads(asyncio.run(tool(run, "Describe").call({"id": card})))
    assert described["id"] == card and described["seqs"].startswith("#")
    first = run.view.cards[card].seqs[0]
    about = json.loads(asyncio.run(tool(run, "Describe").call({"id": f"#{first}"})))
    assert card in about["in_cards"]
    page = asyncio.run(tool(run, "Expand").call({"id": f"#{first}"}))
    assert run.view.messages[first].content in page
    assert "Error" in asyncio.run(tool(run, "Expand").call({"id": "c000000nope"}))
    assert "Error" in asyncio.run(tool(run, "Grep").call({"pattern": "(unclosed"}))
    since = json.loads(
        asyncio.run(tool(run, "Grep").call({"pattern": "Note", "since": 50, "scope": "messages", "limit": 500}))
    )
    assert since["hits"] and all(h["seq"] >= 50 for h in since["hits"])
    assert since["not_shown"] > 0 and len(since["hits"]) + since["not_shown"] <= 200, "limit is at most 200"


def _sites_agents(folder: Path) -> Path:
    (folder / "fold.yaml").write_text(json.dumps({"turns": [{"text": "ok"}] * 20, "summaries": [{"extractive": 200}]}))
    (folder / "boss.yaml").write_text(
        json.dumps(
            {
                "turns": [
                    {"tool_call": {"name": "spawn", "arguments": {"agent": "folder", "prompt": "child task"}}},
                    {"text": "done"},
                ]
            }
        )
    )
    (folder / "agents.yaml").write_text(
        json.dumps(
            {
                "agents": {
                    "folder": {"model": "scripted/fold.yaml", "context": {"mode": "fold", "recall": True}},
                    "boss": {"model": "scripted/boss.yaml", "tools": ["spawn"], "spawnable": ["folder"]},
                }
            }
        )
    )
    return folder / "agents.yaml"


def _offered(store: Any, run_id: str) -> set[str]:
    return set(store.events(run_id, kinds=["run_started"])[0].data["tools"])


def test_the_fold_tools_reach_the_model_at_every_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """start, continue, resume, fork, spawn and an MCP spawn: Describe, Expand, Grep and
    Recall are in the tool list the model is sent (not only registered)."""
    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path / "home"))
    path = _sites_agents(tmp_path)
    defs = load_agents(path)
    seen: list[set[str]] = []

    def remember(spec: AgentSpec, model: str) -> Any:
        from loomrt.providers import resolve_provider

        inner = resolve_provider(spec, model)
        if getattr(inner, "watched", False):
            return inner
        original = inner.complete

        async def complete(request: ModelRequest) -> ModelResponse:
            if request.purpose == "turn":
                seen.append({t.name for t in request.tools})
            return await original(request)

        inner.complete = complete  # type: ignore[method-assign]
        inner.watched = True  # type: ignore[attr-defined]
        return inner

    rt = Runtime(providers=remember)
    want = FOLD_TOOLS | {"Recall"}
    result = rt.run_sync("folder", "start", agents=defs, agents_file=str(path))  # start
    assert want <= seen[-1] and want <= _offered(rt.store, result.run_id)
    asyncio.run(rt.continue_run(result.run_id, "and again"))  # continue
    assert want <= seen[-1]
    run = asyncio.run(rt.aopen(result.run_id))  # resume after a failed turn
    asyncio.run(run.add("user_input", {"content": "one more"}))
    asyncio.run(rt.resume(result.run_id))
    assert want <= seen[-1]
    fork = asyncio.run(rt.fork(result.run_id))  # fork
    assert want <= _offered(rt.store, fork.run_id)
    asyncio.run(rt.continue_run(fork.run_id, "from the fork"))
    assert want <= seen[-1]
    seen.clear()
    boss = rt.run_sync("boss", "delegate", agents=defs, agents_file=str(path))  # spawn
    assert boss.status == "done", boss.error
    child = rt.store.children(boss.run_id)[0]
    assert want <= _offered(rt.store, child.run_id) and any(want <= s for s in seen)
    from loomrt.mcp.service import RunService  # an MCP spawn goes through the same runtime call

    async def over_mcp() -> str:
        service = RunService(defs, agents_file=str(path), runtime=rt)
        spawned = await service.spawn("folder", "from a client")
        await service.wait(spawned.run_id, 30)
        await service.close()
        return spawned.run_id

    seen.clear()
    mcp_run = asyncio.run(over_mcp())
    assert want <= _offered(rt.store, mcp_run) and want <= seen[-1]
    started = rt.store.events(mcp_run, kinds=["run_started"])[0].data["system"]
    assert "Describe, Expand, Grep or Recall" in started


def test_a_card_that_invents_a_value_is_rejected_then_falls_back() -> None:
    assert invented("the port is 5433 [#4]", "[#4] user: the port is 5432")[1] == ["5433"]
    rng = random.Random(8)
    provider = ScriptedProvider(
        turns=[{"text": "ok"}] * 40, summaries=["The service runs on port 65000 at /nowhere/made-up.conf."]
    )
    rt = scripted_runtime(provider)
    run = rt.start(spec(keep_recent=6, leaf_min_messages=4, rollup=16), interactive=True)

    async def go() -> None:
        for i in range(40):
            await rt.send(run, said(i, rng) + " filler " * 40)

    asyncio.run(go())
    rejected = [e.data for e in rt.store.events(run.run_id, kinds=["card_rejected"])]
    assert rejected and "verbatim" in rejected[0]["reason"] and "65000" in rejected[0]["reason"]
    assert [r["attempt"] for r in rejected[:2]] == [1, 2]
    cards = list(run.view.cards.values())
    assert cards and all(c.fallback and c.kind == "fallback" for c in cards)
    assert 'fallback="truncated, not summarised"' in next(m.content for m in run.context if m.synthetic == CARD_BLOCK)
    figures = rt.store.events(run.run_id, kinds=["distillation"])[0].data["verify"]
    assert figures["invented"] >= 2 and figures["fallbacks"] >= 1 and figures["rejected"] >= 2


def test_a_provider_error_skips_the_fold_and_five_pause_it() -> None:
    def answer(request: ModelRequest) -> ModelResponse | str:
        if request.purpose == "fold":
            raise ConnectionError("summariser down")
        return "ok"

    rt = Runtime(providers=lambda s, m: FunctionProvider(answer))
    spec_ = spec(keep_recent=4, leaf_min_messages=2)
    spec_ = spec_.clone(retries=0, context={"budget_tokens": 1024})
    run = rt.start(spec_, interactive=True)

    async def go() -> None:
        for i in range(30):
            await rt.send(run, f"message {i} " + "words " * 60)

    asyncio.run(go())
    skipped = [e.data for e in rt.store.events(run.run_id, kinds=["fold_skipped"])]
    assert skipped and skipped[0]["failures"] == 1 and "summariser down" in skipped[0]["error"]
    assert [s["failures"] for s in skipped][:5] == [1, 2, 3, 4, 5] and skipped[4]["paused_until"]
    assert len(skipped) == 5, "folding pauses after the fifth failure"
    assert not run.view.cards, "a provider error is never a reason to truncate"


def test_grep_does_not_find_the_models_own_searches_and_takes_sloppy_arguments() -> None:
    grep = {"tool_call": {"name": "Grep", "arguments": {"pattern": "ZETA-99", "mode": "text", "limit": "lots"}}}
    recall = {"tool_call": {"name": "Recall", "arguments": {"query": "the code word ZETA-99"}}}
    provider = ScriptedProvider(
        turns=[
            recall,
            grep,
            grep,
            {"text": "done"},
            {"tool_call": {"name": "Expand", "arguments": {"id": "#2", "page": "one"}}},
            {"text": "ok"},
        ],
        summaries=["s"],
    )
    rt = scripted_runtime(provider)
    run = rt.start(
        AgentSpec(
            model="scripted/fold", max_iterations=6, context={"mode": "fold", "budget_tokens": 4096, "recall": True}
        ),
        interactive=True,
    )
    asyncio.run(rt.send(run, "The code word is ZETA-99."))
    results = [
        json.loads(e.data["content"])
        for e in rt.store.events(run.run_id, kinds=["tool_result"])
        if e.data["name"] == "Grep"
    ]
    assert [[h["seq"] for h in r["hits"]] for r in results] == [[2], [2]], (
        "only the user's message, never the searches (Recall's either)"
    )
    asyncio.run(rt.send(run, "Open it."))
    page = rt.store.events(run.run_id, kinds=["tool_result"])[-1].data
    assert not page["is_error"] and "page 0 does not exist" in page["content"]


@pytest.mark.slow
def test_a_small_budget_never_sticks_the_fold() -> None:
    """Short messages, a budget where the tool schemas take a third: every call still fits
    (leaves reach a size worth a card, and cards of two depths roll up when they must)."""
    provider = ScriptedProvider(turns=[{"text": ""}] * 400, summaries=[{"extractive": 300, "words": 6}])
    rt = scripted_runtime(provider)
    run = rt.start(
        AgentSpec(
            model="scripted/small",
            context={
                "mode": "fold",
                "budget_tokens": 1536,
                "recall": True,
                "keep_first": False,
                "fold": {"keep_recent": 4, "leaf_min_messages": 4, "max_calls_per_10min": 10**6},
            },
        ),
        interactive=True,
    )
    rng = random.Random(13)

    async def go() -> None:
        for i in range(400):
            await rt.send(
                run,
                f"[1:{i:02d} pm] Speaker {i % 2}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40))),
            )

    asyncio.run(go())
    sizes = [count_dicts(c.messages) + count_tools(c.tools) for c in provider.calls if c.purpose == "turn"]
    # a prompt is the working context (within the budget less injection's reserve) and a block
    assert max(sizes) <= run.budget + run.inject_reserve == 1536, max(sizes)
    # at rest, a chat's due fold is written between turns (as the chat does while the user types)
    asyncio.run(between_turns(run, rt.coordination))
    assert run.estimate() <= run.budget


def test_a_fold_goes_on_to_its_target_not_just_under_the_soft_watermark() -> None:
    from loomrt.run.reducers.fold.plan import next_step
    from loomrt.tokens import count_messages

    rng = random.Random(5)
    provider = ScriptedProvider(turns=[{"text": said(i, rng)} for i in range(60)], summaries=[{"extractive": 200}])
    rt = scripted_runtime(provider)
    run = rt.start(spec(soft_pct=70, cache_idle_s=0, leaf_min_messages=2, leaf_source_tokens=400), interactive=True)
    fold = run.spec.context.fold
    assert fold.target_pct is None and fold.fold_target_pct == 25  # the default: min(25, soft_pct)
    after: list[int] = []

    async def go() -> None:
        for i in range(55):
            await rt.send(run, said(100 + i, rng))
            folds = len(rt.store.events(run.run_id, kinds=["distillation"]))
            await between_turns(run, rt.coordination)
            if len(rt.store.events(run.run_id, kinds=["distillation"])) > folds:
                size = count_messages(run.context) + count_tools(run.mode.offered_tools(run))
                left = next_step(run.context, run.view.cards, fold, run.budget, pressing=True, critical=False)
                assert size <= run.budget // 4 or left is None or left.kind == "rollup", (size, left)
                after.append(size)

    asyncio.run(go())
    # several leaves a fold (each leaf is at most 400 tokens): down to about a quarter of the
    # budget (the cards so far are the floor), not to 70% or to half
    assert len(after) >= 2 and max(after) <= run.budget * 40 // 100, after
    with pytest.raises(ValueError, match="target_pct"):
        spec(soft_pct=40, target_pct=45)


def test_a_fold_shares_the_stretch_out_evenly_and_leaves_no_remnant_raw() -> None:
    """A raw stretch a little over the leaf limit becomes two leaves of about half each,
    not one full leaf and a remnant too short to fold (which would stay raw in the context
    until the tail moved past it)."""
    from loomrt.messages import Message
    from loomrt.run.reducers.fold.plan import leaf_source_limit, next_step, tail_start
    from loomrt.spec import FoldSpec
    from loomrt.tokens import count_messages

    rng = random.Random(8)
    fold = FoldSpec(keep_recent=4, leaf_min_messages=8, leaf_source_tokens=1200)
    context = [Message("system", "You are terse."), Message("user", "the task", seq=0, pinned=True)]
    context += [Message("user" if i % 2 else "assistant", said(i, rng), seq=i) for i in range(1, 41)]
    budget, limit = 8192, leaf_source_limit(fold, 8192)
    stop = tail_start(context, fold, budget)
    stretch = count_messages(context[2:stop])
    assert limit < stretch <= 2 * limit  # two leaves are needed, and two are enough
    leaves_made: list[int] = []
    while (step := next_step(context, {}, fold, budget, pressing=True, critical=False)) is not None:
        assert step.kind == "leaf"
        leaves_made.append(count_messages(context[step.start : step.end]))
        card = Message("user", "card", seq=None, synthetic=CARD_BLOCK, ref=f"c{len(leaves_made)}")
        context[step.start : step.end] = [card]
    assert len(leaves_made) == 2 and all(n <= limit for n in leaves_made)
    assert abs(leaves_made[0] - leaves_made[1]) <= stretch // 4, leaves_made  # shared out, not full then remnant
    tail = tail_start(context, fold, budget)
    assert all(m.synthetic == CARD_BLOCK or m.pinned or m.role == "system" for m in context[:tail])


@pytest.mark.slow
@pytest.mark.parametrize("factor", [1.0, 1.3])
def test_a_fold_reads_its_sizes_in_the_providers_tokens(factor: float) -> None:
    """A provider that counts 30% more than the runtime's estimate, and turns whose tool
    results fill the tail: pressure scales the estimate, and the fold's plan reads its steps
    the same way, so a hard fold started by the scaled pressure goes on (here: externalising
    the tail's largest results) until the prompt fits in the provider's tokens too. It used
    to stop where the unscaled estimate fit, and a third of the prompts passed the budget."""
    from loomrt.tools import tool as make_tool

    rng = random.Random(5)

    @make_tool("blob", "Return n words.", {"type": "object", "properties": {"n": {"type": "integer"}}})
    def blob(n: int) -> str:
        return " ".join(rng.choice(WORDS) + str(i) for i in range(n))

    def counted(messages: list[dict[str, Any]]) -> int:
        return int(count_dicts(messages) * factor)

    turns: list[dict[str, Any]] = []
    for _ in range(30):
        turns += [{"tool_call": {"name": "blob", "arguments": {"n": 400}}}] * 4 + [{"text": "checked " + said(0, rng)}]
    provider = ScriptedProvider(turns=turns, summaries=[{"extractive": 300}], count_tokens=counted)
    rt = scripted_runtime(provider, tools=[blob])
    run = rt.start(
        AgentSpec(
            model="scripted/blobs",
            max_iterations=10,
            tools=["blob"],
            context={
                "mode": "fold",
                "budget_tokens": 4096,
                "message_max_tokens": 4096,
                "fold": {"max_calls_per_10min": 10_000, "cache_idle_s": 0},
            },
        ),
        interactive=True,
    )

    async def go() -> None:
        for i in range(30):
            await rt.send(run, said(1000 + i, rng))
            await between_turns(run, rt.coordination)

    asyncio.run(go())
    # the scale says how the provider counts, so it outlives the folds that emptied the context
    record = rt.store.events(run.run_id)
    after_fold = [project(record[: i + 1]).tokenizer_scale for i, e in enumerate(record) if e.kind == "distillation"]
    # (the scripted provider counts the messages, the estimate the tool schemas too: ~1.16 here)
    assert len(after_fold) > 10 and all((scale > 1.1) is (factor > 1) for scale in after_fold), after_fold
    reported = [
        e.data["usage"]["input_tokens"]
        for e in rt.store.events(run.run_id, kinds=["model_call"])
        if e.data["purpose"] == "turn"
    ]
    assert len(reported) == 150 and max(reported) <= run.budget, (max(reported), run.budget)
    assert coverage(run) == history(run)
