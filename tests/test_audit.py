"""The audit trail: pins, the prompt hash that `runs verify` re-derives, the transcript with
its distillation markers, the working context as of any seq, and the export."""

from __future__ import annotations

import asyncio
import json

import pytest
from spine_kit import runtime
from typer.testing import CliRunner

from loomrt.audit import Marker, context_as_of, prompt_problems, to_jsonl, to_markdown, transcript
from loomrt.cli.app import app
from loomrt.events import Event
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.run.between_turns import between_turns
from loomrt.run.pin_record import pin_in_record, unpin_in_record
from loomrt.run.pins import PinError
from loomrt.run.projection import project
from loomrt.spec import AgentSpec
from loomrt.testing import FunctionProvider, extractive_summary

DECISION = "Decision: the launch date is fixed at 14 March and the budget at 9,400 euros; do not reopen it."


def answer(request: ModelRequest) -> ModelResponse:
    if request.purpose != "turn":  # summaries and recaps copy their span's first sentences
        return ModelResponse(text=extractive_summary(request, max_chars=500, words_per_line=12))
    last = next(m for m in reversed(request.messages) if m["role"] == "user")
    return ModelResponse(text=f"Noted: {str(last['content'])[:60]}")


def chat_spec(mode: str, **context: object) -> AgentSpec:
    ctx = {"mode": mode, "budget_tokens": 400, "keep_last_n": 2, "autocompact_at_pct": 60, **context}
    if mode == "append":
        ctx["backstop"] = True
    return AgentSpec(model="function/inline", system_prompt="You keep the user's plans.", context=ctx)


def chat(tmp_path, spec: AgentSpec, inputs: list[str], *, between=None):
    """Play ``inputs`` in one interactive run; ``between(rt, run, i)`` runs after input ``i``."""
    rt = runtime(tmp_path, FunctionProvider(answer))

    async def play():
        run = await rt.astart(spec, interactive=True, name="planner")
        for i, text in enumerate(inputs):
            await rt.send(run, text)
            if between is not None:
                between(rt, run, i)
        return run

    return rt, asyncio.run(play())


FILLER = [f"Note {i}: the venue team sent another long update about chairs, lights and parking." for i in range(14)]


@pytest.mark.parametrize("mode", ["recap", "compaction", "append"])
def test_an_operator_pin_survives_every_distillation_verbatim(tmp_path, mode):
    inputs = ["Plan the launch with me.", DECISION, *FILLER]
    seen: list[bool] = []

    def between(rt, run, i):
        if i == 1:  # the operator pins the decision from outside the run, as `loomrt runs pin` does
            seq = next(
                e.seq for e in rt.store.events(run.run_id, kinds=["user_input"]) if e.data["content"] == DECISION
            )
            before = rt.store.get_run(run.run_id).status
            pin_in_record(rt.store, run.run_id, seq=seq, note="the user's decision")
            assert rt.store.get_run(run.run_id).status == before  # a pin never changes the status
        if i > 1:
            seen.append(any(DECISION in m.content for m in run.context))

    rt, run = chat(tmp_path, chat_spec(mode), inputs, between=between)
    events = rt.store.events(run.run_id)
    distillations = [e for e in events if e.kind == "distillation"]
    assert len(distillations) >= 2, "the chat must distil more than once"
    assert all(seen), "the pinned decision left the working context"
    for d in distillations:
        assert d.data["context"] and any(DECISION in json.dumps(r) for r in d.data["context"])
    assert project(events).context == run.context  # the rebuild keeps the pin exactly as the live run
    assert [p.by for p in run.view.pins.values()] == ["operator"]


def test_without_the_pin_the_decision_is_distilled_away(tmp_path):
    """The guard above can fail: the same chat without the pin loses the decision's words."""
    rt, run = chat(tmp_path, chat_spec("compaction"), ["Plan the launch with me.", DECISION, *FILLER])
    assert not any(DECISION in m.content for m in run.context)


def test_a_pin_over_the_budget_is_refused_and_unpin_ends_a_pin(tmp_path):
    def between(rt, run, i):
        if i != 1:
            return
        seqs = [e.seq for e in rt.store.events(run.run_id, kinds=["user_input"])]
        with pytest.raises(PinError, match="pins_max_tokens"):
            pin_in_record(rt.store, run.run_id, seq=seqs[1])
        with pytest.raises(PinError, match="no message at #999"):
            pin_in_record(rt.store, run.run_id, seq=999)

    rt, run = chat(
        tmp_path, chat_spec("recap", pins_max_tokens=5), ["Plan the launch with me.", DECISION], between=between
    )
    assert not any(e.kind == "pin" for e in rt.store.events(run.run_id))
    seq = rt.store.events(run.run_id, kinds=["user_input"])[1].seq
    with pytest.raises(PinError, match="no pin"):
        unpin_in_record(rt.store, run.run_id, f"#{seq}")


def test_the_definition_pins_go_into_the_system_prompt(tmp_path):
    spec = chat_spec("compaction", pins=["Always answer in French.", "The client is ACME-7731."])
    rt, run = chat(tmp_path, spec, ["Plan the launch with me.", *FILLER])
    system = run.context[0]
    assert system.role == "system" and "Always answer in French." in system.content and "ACME-7731" in system.content
    assert any(e.kind == "distillation" for e in rt.store.events(run.run_id))


def test_the_model_may_pin_when_the_definition_allows_it(tmp_path):
    calls = {"n": 0}

    def pinning(request: ModelRequest) -> ModelResponse:
        from loomrt.messages import ToolCall

        if request.purpose == "turn" and calls["n"] == 0 and any(t.name == "Pin" for t in request.tools):
            calls["n"] += 1
            return ModelResponse(
                text="",
                tool_calls=[
                    ToolCall(
                        id="p1",
                        name="Pin",
                        arguments={"text": "The user wants everything by 14 March.", "reason": "a decision"},
                    )
                ],
            )
        return answer(request)

    rt = runtime(tmp_path, FunctionProvider(pinning))
    spec = chat_spec("compaction", model_pins=True)

    async def play():
        run = await rt.astart(spec, interactive=True, name="planner")
        for text in ["Plan the launch with me.", *FILLER]:
            await rt.send(run, text)
        return run

    run = asyncio.run(play())
    pins = [e for e in rt.store.events(run.run_id) if e.kind == "pin"]
    assert [p.data["by"] for p in pins] == ["model"] and pins[0].data["pin"] == "text-1"
    assert any("The user wants everything by 14 March." in m.content and m.synthetic == "pin" for m in run.context)


def test_every_turn_prompt_is_the_context_the_record_rebuilds(tmp_path):
    rt, run = chat(tmp_path, chat_spec("recap"), ["Plan the launch with me.", DECISION, *FILLER])
    events = rt.store.events(run.run_id)
    turns = [e for e in events if e.kind == "model_call" and e.data.get("prompt_from") == "context"]
    assert len(turns) == 16 and all(e.data["prompt_hash"] for e in turns)
    assert prompt_problems(events) == []
    # a record whose messages differ from what was sent is caught at the next model call
    tampered = [
        Event(
            run_id=e.run_id,
            seq=e.seq,
            kind=e.kind,
            ts=e.ts,
            hash=e.hash,
            data={**e.data, "content": "something else"} if e.data.get("content") == DECISION else e.data,
        )
        for e in events
    ]
    problems = prompt_problems(tampered)
    assert problems and problems[0].startswith("#") and "not the working context" in problems[0]


def test_the_transcript_marks_each_distillation_and_as_of_rebuilds_the_context(tmp_path):
    rt, run = chat(tmp_path, chat_spec("recap"), ["Plan the launch with me.", DECISION, *FILLER])
    events = rt.store.events(run.run_id)
    items = transcript(events)
    markers = [i for i in items if isinstance(i, Marker)]
    assert len(markers) == sum(1 for e in events if e.kind == "distillation") >= 2
    for marker in markers:
        assert marker.covered and marker.tokens_after < marker.tokens_before and marker.worked_from
        evicted = [i for i in items if not isinstance(i, Marker) and marker.seq in i.evicted_by]
        assert [i.seq for i in evicted] == [
            s for s in marker.covered if any(getattr(j, "seq", None) == s for j in evicted)
        ]
    # as of the event before each distillation, the context is what the model saw then
    first = markers[0]
    before = context_as_of(events, first.seq - 1)
    assert all(any(m.seq == s for m in before) for s in first.covered)
    after = context_as_of(events, first.seq)
    assert not any(m.seq in first.covered and m.synthetic is None and not m.pinned for m in after)
    md = to_markdown(run.run_id, items)
    assert f"**Distillation #{first.seq}** (recap)" in md and DECISION in md
    rows = [json.loads(line) for line in to_jsonl(items).splitlines()]
    assert {r["type"] for r in rows} == {"message", "distillation"} and len(rows) == len(items)


def test_the_cli_pins_shows_exports_and_verifies(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path))
    from loomrt.record import default_store

    store = default_store()
    rt = runtime(tmp_path, FunctionProvider(answer))
    rt.store = store

    async def play():
        run = await rt.astart(chat_spec("recap"), interactive=True, name="planner")
        for text in ["Plan the launch with me.", DECISION, *FILLER[:6]]:
            await rt.send(run, text)
        await between_turns(run, rt.coordination)  # the recap due at the watermark, written while the user types
        return run

    run = asyncio.run(play())
    seq = next(e.seq for e in store.events(run.run_id, kinds=["user_input"]) if e.data["content"] == DECISION)
    cli = CliRunner()
    done = cli.invoke(app, ["runs", "pin", run.run_id, str(seq), "--note", "the decision", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["id"] == f"#{seq}"
    again = cli.invoke(app, ["runs", "pin", run.run_id, str(seq)])
    assert again.exit_code == 2 and "pinned already" in again.output
    shown = cli.invoke(app, ["runs", "show", run.run_id, "--json"])
    assert [p["id"] for p in json.loads(shown.output)["pins"]] == [f"#{seq}"]
    text = cli.invoke(app, ["runs", "show", run.run_id, "--full"]).output
    assert "distillation #" in text and DECISION in text and "transcript" in text
    as_of = json.loads(cli.invoke(app, ["runs", "show", run.run_id, "--as-of", "3", "--json"]).output)
    assert [m["role"] for m in as_of["context"]][:1] == ["system"]
    exported = cli.invoke(app, ["runs", "export", run.run_id, "--format", "md"]).output
    assert exported.startswith(f"# Run {run.run_id}") and "**Distillation #" in exported
    verified = cli.invoke(app, ["runs", "verify", run.run_id])
    assert verified.exit_code == 0 and "prompts re-derived, the record audits clean" in verified.output
    report = json.loads(cli.invoke(app, ["runs", "verify", run.run_id, "--json"]).output)
    assert report["clean"] and report["prompts_checked"] == 8 and report["problems"] == []
    unpinned = cli.invoke(app, ["runs", "unpin", run.run_id, str(seq)])
    assert (
        unpinned.exit_code == 0
        and json.loads(cli.invoke(app, ["runs", "show", run.run_id, "--json"]).output)["pins"] == []
    )


@pytest.mark.parametrize("mode", ["recap", "compaction"])
def test_every_pointer_in_every_summary_resolves_to_a_message_it_covered(tmp_path, mode):
    """Each [#seq] in a summary names a record message inside the span that summary (or an
    earlier one it folded in) covered, and the words after it are that message's own."""
    import re

    from loomrt.events import message_of

    rt, run = chat(tmp_path, chat_spec(mode), ["Plan the launch with me.", DECISION, *FILLER])
    events = rt.store.events(run.run_id)
    by_seq = {e.seq: e for e in events}
    covered: set[int] = set()
    pointers = 0
    for d in (e for e in events if e.kind == "distillation"):
        covered |= set(d.data["span_seqs"])
        for seq, rest in re.findall(r"\[#(\d+)\]\s*(?:\w+:\s*)?([^\n\[]*)", d.data["summary"]):
            seq = int(seq)
            pointers += 1
            assert seq in covered, f"#{seq} is outside what distillation #{d.seq} covered"
            message = message_of(by_seq[seq])
            assert message is not None and message.role != "system"
            words = rest.strip().rstrip("…").split()[:4]
            assert " ".join(words) in message.content, (seq, rest, message.content)
    assert pointers >= 4


def test_a_pin_survives_stateful_boundaries_too(tmp_path):
    """Stateful keeps only system, task, Σ and O at each step; a pinned text stays beside them."""
    from loomrt.messages import ToolCall

    note = "The user said: never restart the primary during business hours."
    steps = iter(
        [
            {
                "reasoning": "pin the constraint",
                "patch": {"step": 1},
                "action": {"tool": "Pin", "arguments": {"text": note, "reason": "a decision"}},
            },
            *(
                {
                    "reasoning": f"step {i}",
                    "patch": {"step": i},
                    "action": {"tool": "calculate", "arguments": {"expression": f"{i} * 2"}},
                }
                for i in range(2, 6)
            ),
            {"reasoning": "done", "patch": {"step": 6}, "done": True, "final": "done"},
        ]
    )
    contexts: list[list[dict]] = []

    def stateful(request: ModelRequest) -> ModelResponse:
        contexts.append(request.messages)
        return ModelResponse(
            text="", tool_calls=(ToolCall(id=f"s{len(contexts)}", name="emit_state", arguments=next(steps)),)
        )

    rt = runtime(tmp_path, FunctionProvider(stateful, local=False))
    spec = AgentSpec(
        model="function/inline",
        tools=["calculate"],
        context={
            "mode": "stateful",
            "model_pins": True,
            "state_schema": {"type": "object", "properties": {"step": {"type": "integer"}}},
        },
    )
    result = asyncio.run(rt.run(spec, "Check the cluster."))
    assert result.status == "done"
    assert [e.data["by"] for e in rt.store.events(result.run_id, kinds=["pin"])] == ["model"]
    later = contexts[2:]
    assert later and all(any(note in str(m.get("content")) for m in c) for c in later)


def test_records_with_whole_prompt_hashes_still_verify() -> None:
    """The first records hashed the whole prompt at once; the chained hash (one step per
    message, kept by the view) replaced it. Both verify; a wrong one of either is caught."""
    from loomrt.audit import CHAINED, _whole_prompt_hash, prompt_problems
    from loomrt.run.projection import project
    from loomrt.testing import ScriptedProvider, scripted_runtime

    rt = scripted_runtime(ScriptedProvider(turns=["one", "two", "three"]))
    run = rt.start(AgentSpec(model="scripted/x"), interactive=True)
    for text in ("a", "b", "c"):
        asyncio.run(rt.send(run, text))
    events = rt.store.events(run.run_id)
    assert all(e.data["prompt_hash"].startswith(CHAINED) for e in events if e.kind == "model_call")
    assert prompt_problems(events) == []
    legacy, view = [], project(events[:1])
    for e in events[1:]:
        if e.kind == "model_call":
            e = e.model_copy(update={"data": {**e.data, "prompt_hash": _whole_prompt_hash(view.wire)}})
        legacy.append(e)
        view.apply(e)
    assert prompt_problems([events[0], *legacy]) == []
    broken = [
        e.model_copy(update={"data": {**e.data, "prompt_hash": "0" * 32}}) if e.kind == "model_call" else e
        for e in legacy
    ]
    assert len(prompt_problems([events[0], *broken])) == 3
