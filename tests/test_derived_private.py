"""Derived private (issue 39, item 3): a message the model writes that repeats a private
source is private like its source, marked by the runtime in the message's own transaction;
an operator can declassify it; and on a 200-turn chat the rule taints few messages."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from spine_kit import runtime
from typer.testing import CliRunner

from loomrt.events import Event
from loomrt.messages import Message, ToolCall
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.spec import AgentSpec
from loomrt.testing import FunctionProvider
from loomrt.tools import Tool
from loomrt.visibility import RUN_WORDS, Taint

CASE = "Case GLX-4471 for client Marta Quillon: balance 3,214.50 EUR, account ending 8812."


def vault(text: str = CASE) -> Tool:
    return Tool("vault", "The client's case file.", {"type": "object", "properties": {}}, lambda: text, private=True)


class Repeater:
    """A model that fetches the case file on the first turn, then answers each input with the
    reply the test set for it; the summariser copies its whole input."""

    def __init__(self, replies: dict[str, ModelResponse]):
        self.replies = replies
        self.prompts: list[str] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        if request.purpose != "turn":
            self.prompts.append(json.dumps(request.messages))
            return ModelResponse(text="The span: " + json.dumps(request.messages)[:1500])
        last = next(m for m in reversed(request.messages) if m.get("role") in ("user", "tool"))
        if last.get("role") == "user" and "case file" in str(last.get("content")):
            return ModelResponse(text="", tool_calls=[ToolCall(id="v1", name="vault", arguments={})])
        if last.get("role") == "tool":
            return ModelResponse(text="I have the case file.")
        return self.replies.get(str(last.get("content")), ModelResponse(text="Noted."))


def chat(tmp_path: Path, replies: dict[str, ModelResponse], inputs: list[str], **context: Any) -> Any:
    model = Repeater(replies)
    search = Tool(
        "search", "Search the CRM.", {"type": "object", "properties": {"q": {"type": "string"}}}, lambda q: ""
    )
    rt = runtime(tmp_path, FunctionProvider(model), tools=[vault(), search])
    ctx = {"mode": "recap", "budget_tokens": 600, "keep_last_n": 2, "autocompact_at_pct": 60, **context}
    spec = AgentSpec(model="function/inline", tools=["vault", "search"], context=ctx)

    async def go() -> Any:
        run = await rt.astart(spec, interactive=True)
        for text in ["Fetch the case file, please.", *inputs]:
            await rt.send(run, text)
        return run

    return rt, asyncio.run(go()), model


def marks(rt: Any, run_id: str) -> dict[int, Event]:
    return {int(e.data["seq"]): e for e in rt.store.events(run_id, kinds=["mark_private"])}


def test_a_reply_or_a_tool_argument_that_repeats_a_private_result_is_derived_private(tmp_path, monkeypatch):
    filler = [f"Note {i}: the venue team sent another long update about chairs, lights and parking." for i in range(10)]
    replies = {
        "What is my case number?": ModelResponse(text="Your case is GLX-4471."),
        "Look it up in the CRM.": ModelResponse(
            text="", tool_calls=[ToolCall(id="q1", name="search", arguments={"q": "quillon"})]
        ),
        "How is the weather?": ModelResponse(text="Sunny, for the launch."),
    }
    inputs = ["What is my case number?", "Look it up in the CRM.", "How is the weather?", *filler]
    rt, run, model = chat(tmp_path, replies, inputs)
    events = rt.store.events(run.run_id)
    (result,) = [e for e in events if e.kind == "tool_result" and e.data.get("private")]
    said = {
        e.seq: e
        for e in events
        if e.kind == "assistant_message" and e.data["message"].get("content") in ("Your case is GLX-4471.", "")
    }
    quoted = [e for e in said.values() if e.data["message"]["content"]]
    searched = [
        e for e in said.values() if any(c["name"] == "search" for c in e.data["message"].get("tool_calls") or ())
    ]
    found = marks(rt, run.run_id)
    for message in (*quoted, *searched):
        mark = found[message.seq]
        assert (mark.data["by"], mark.data["derived_from"]) == ("runtime", result.seq)
        assert mark.seq == message.seq + 1, "written with the message, in its transaction"
    sunny = next(e for e in events if e.kind == "assistant_message" and "Sunny" in e.data["message"]["content"])
    assert sunny.seq not in found, "a reply that repeats nothing private is not private"
    assert run.view.private >= {result.seq, quoted[0].seq, searched[0].seq}
    assert run.view.messages[quoted[0].seq].content == "Your case is GLX-4471.", "its own run still works with it"
    assert model.prompts and not any("GLX-4471" in p or "quillon" in p.lower() for p in model.prompts)

    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path))
    from loomrt.cli.app import app

    rt.store.close()
    cli = CliRunner()
    exported = cli.invoke(app, ["runs", "export", run.run_id, "--format", "jsonl"]).output
    assert "GLX-4471" not in exported and "Quillon".lower() not in exported.lower()
    done = cli.invoke(app, ["runs", "declassify", run.run_id, str(quoted[0].seq)])
    assert done.exit_code == 0, done.output
    assert "Your case is GLX-4471." in cli.invoke(app, ["runs", "export", run.run_id, "--format", "jsonl"]).output
    refused = cli.invoke(app, ["runs", "declassify", run.run_id, str(result.seq)])
    assert refused.exit_code != 0 and "no derived private message" in refused.output
    again = cli.invoke(app, ["runs", "declassify", run.run_id, str(quoted[0].seq)])
    assert again.exit_code != 0 and "no derived private message" in again.output


def test_the_operators_mark_is_a_source_and_cannot_be_declassified(tmp_path, monkeypatch):
    from loomrt.cli.app import app
    from loomrt.record import default_store

    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path))
    replies = {"Repeat my code.": ModelResponse(text="Your code is ZX-PLUM-88.")}
    rt, run, _ = chat(tmp_path, replies, ["My door code is ZX-PLUM-88."])
    (said,) = [e for e in rt.store.events(run.run_id, kinds=["user_input"]) if "ZX-PLUM-88" in e.data["content"]]
    rt.store.close()
    cli = CliRunner()
    assert cli.invoke(app, ["runs", "private", run.run_id, str(said.seq)]).exit_code == 0
    refused = cli.invoke(app, ["runs", "declassify", run.run_id, str(said.seq)])
    assert refused.exit_code != 0 and "marked private by an operator" in refused.output

    async def more() -> Any:
        again = await rt.aopen(run.run_id)
        await rt.send(again, "Repeat my code.")
        return again

    rt.store = default_store()
    again = asyncio.run(more())
    quoted = [e for e in rt.store.events(run.run_id, kinds=["assistant_message"]) if "ZX-PLUM" in json.dumps(e.data)]
    assert quoted and marks(rt, run.run_id)[quoted[-1].seq].data["derived_from"] == said.seq
    assert quoted[-1].seq in again.view.private


def rule() -> Taint:
    taint = Taint()
    taint.saw(Message(role="user", content="Please deploy the service to the cluster.", seq=1))
    taint.source(Message(role="tool", content=CASE + " Deploy it to the cluster after the audit closes.", seq=3))
    return taint


@pytest.mark.parametrize(
    ("reply", "source"),
    [
        ("Your case is GLX-4471.", 3),
        ("Shall I deploy the service to the cluster?", None),  # said before the source: not distinctive
        ("I wrote to marta about it.", 3),  # case does not matter
        ("The balance is fine.", 3),  # a distinctive word of 4 letters or more, however plain
        ("It is for EUR 3,214.50 in all.", 3),
        ("Call me at 8812 or so.", 3),
        ("ok, the GLX team?", None),  # a part of a token is not the token
        ("Yes: deploy it to the cluster after the audit closes.", 3),  # words all seen or short, a run of 8
    ],
)
def test_the_rule_distinctive_tokens_of_four_characters_and_runs_of_eight_words(reply, source):
    assert rule().derived_from(Message(role="assistant", content=reply)) == source


def test_a_tool_calls_arguments_count_and_eight_words_are_the_run():
    taint = Taint()
    taint.saw(Message(role="user", content="one two three four five six seven eight nine", seq=1))
    taint.source(Message(role="tool", content="one two three four five six seven eight nine", seq=2))
    seven = " ".join("one two three four five six seven".split()[: RUN_WORDS - 1])
    assert taint.derived_from(Message(role="assistant", content=seven)) is None
    eight = "one two three four five six seven eight"
    call = ToolCall(id="c", name="note", arguments={"text": eight})
    assert taint.derived_from(Message(role="assistant", content="", tool_calls=(call,))) == 2


def test_on_a_200_turn_chat_with_one_private_tool_few_replies_are_tainted(tmp_path):
    """The bound: at most 5% of assistant messages tainted in a chat200-sized chat (the bench's
    chat200 script: its inputs and its replies) with one private tool whose result is a case
    file in the chat's own prose, where the model quotes the case number three times. The
    three quotes are tainted; the figure is the share of all assistant messages."""
    from loomrt.bench.textgen import prose
    from loomrt.bench.workloads import chat_script

    system, script, _ = chat_script(7)
    case = f"Case GLX-4471 for client Marta Quillon. {prose(80, random.Random(70))} Balance 3,214.50 EUR."
    quotes = {150: "About case GLX-4471: it is still open.", 170: "GLX-4471 is the one.", 190: "Yes, GLX-4471."}
    replies = {t.text: ModelResponse(text=quotes.get(i, t.reply)) for i, t in enumerate(script)}
    model = Repeater(replies)
    rt = runtime(tmp_path, FunctionProvider(model), tools=[vault(case)])
    spec = AgentSpec(
        model="function/inline",
        system_prompt=system,
        tools=["vault"],
        context={"mode": "append", "budget_tokens": 1_000_000, "backstop": False},
    )

    async def go() -> Any:
        run = await rt.astart(spec, interactive=True)
        for i, t in enumerate(script):
            await rt.send(run, t.text)
            if i == 3:
                await rt.send(run, "Fetch the case file, please.")
        return run

    run = asyncio.run(go())
    events = rt.store.events(run.run_id)
    assistant = [e for e in events if e.kind == "assistant_message"]
    tainted = set(marks(rt, run.run_id))
    quoted = {e.seq for e in assistant if "GLX-4471" in e.data["message"]["content"]}
    assert len(quoted) == 3 and quoted <= tainted
    share = len(tainted) / len(assistant)
    print(f"derived private: {len(tainted)} of {len(assistant)} assistant messages ({share:.1%})")
    assert share <= 0.05


def test_a_childs_answer_that_repeats_a_private_result_reaches_its_parent_as_a_placeholder(tmp_path):
    from spine_kit import agents_from

    seen: list[str] = []

    def model(request: ModelRequest) -> ModelResponse:
        child = any("Fetch the case file." in str(m.get("content")) for m in request.messages)
        if not child:
            seen.append(json.dumps(request.messages))
            if any(m.get("role") == "tool" for m in request.messages):
                return ModelResponse(text="Done.")
            call = ToolCall(id="p1", name="spawn", arguments={"agent": "fetcher", "prompt": "Fetch the case file."})
            return ModelResponse(text="", tool_calls=[call])
        if any(m.get("role") == "tool" for m in request.messages):
            return ModelResponse(text="The case is GLX-4471.")
        return ModelResponse(text="", tool_calls=[ToolCall(id="c1", name="vault", arguments={})])

    agents = agents_from(
        tmp_path,
        json.dumps(
            {
                "agents": {
                    "lead": {"model": "function/inline", "tools": ["spawn"], "spawnable": ["fetcher"]},
                    "fetcher": {"model": "function/inline", "tools": ["vault"]},
                }
            }
        ),
    )
    rt = runtime(tmp_path, FunctionProvider(model), tools=[vault()])
    result = asyncio.run(rt.run("lead", "Get the case file from a fetcher.", agents=agents))
    assert result.status == "done"
    (row,) = [e.data for e in rt.store.events(result.run_id, kinds=["spawn_child_result"])]
    child = rt.store.events(row["run_id"], kinds=["assistant_message"])[-1]
    assert marks(rt, row["run_id"])[child.seq].data["by"] == "runtime", "the child's answer is derived private"
    assert "GLX-4471" not in row["output"] and "withheld" in row["output"]
    assert seen and not any("GLX-4471" in s for s in seen), "the parent's model never saw it"
