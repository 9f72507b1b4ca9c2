"""Distillations that cannot silently lose the span: the prose check, the whole span
summarised in parts, pointers checked, the decline gate reset, tool schemas counted, Σ held
to its share, and one oversized message never able to stick a run."""

from __future__ import annotations

import dataclasses
import json

import pytest
from modes_kit import R1, S1, SCHEMA, agent, calc, distillations, emit, start
from spine_kit import events, send, tool_call

from loomrt import tool
from loomrt.run.reducers.prose_check import MIN_SHARE, check_prose, content_words
from loomrt.testing import ScriptedProvider
from loomrt.tokens import count_messages, count_text, count_tools

SPAN = "\n".join(
    [
        "[#3] user: We deploy the billing service to node-7 on Friday.",
        "[#5] assistant: Noted: billing on node-7, Friday, with the canary first.",
        "[#7] user: The rollback script lives at /opt/billing/rollback.sh.",
        "[#9] assistant: I will keep /opt/billing/rollback.sh ready during the deploy.",
        "[#11] user: Explain MVCC in two sentences.",
        "[#13] assistant: MVCC keeps several versions of each row so readers never block writers; "
        "each transaction sees a snapshot of committed versions.",
    ]
)


@pytest.mark.parametrize(
    "account,reason",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("Sure! What would you like me to do next?", "answers the conversation"),
        ("The weather in Lisbon is mild in spring and autumn, with rain in winter.", "mostly not about the span"),
        ("The task was to provide a recap of the transcript, as the user asked.", "says nothing about the span"),
        ("The user asked me about the weather in Lisbon; I provided a description.", "mostly not about the span"),
        (
            "MVCC keeps several versions of each row so readers never block writers; each transaction sees a "
            "snapshot of committed versions.",
            "covers only one of the span's 6 messages",
        ),
    ],
)
def test_the_prose_check_rejects_what_a_small_model_writes_instead_of_a_summary(account, reason):
    assert reason in (check_prose(account, SPAN) or "accepted")


def test_the_prose_check_accepts_a_summary_of_the_span():
    account = (
        "The user deploys the billing service to node-7 on Friday, canary first [#3] [#5]; the rollback "
        "script is /opt/billing/rollback.sh [#7]. The assistant explained MVCC: row versions, snapshots [#13]."
    )
    assert check_prose(account, SPAN) is None


def test_the_words_a_recap_reports_with_do_not_count_against_it():
    """The embedded model's recaps of an arithmetic span (bench local_speed, two calls) were
    rejected at 18-26% on topic: asked, calculate, performed, using, formula, provided are
    how a recap reports, not what it is about. Counted as off topic, this one scores 28%."""
    span = "\n".join(
        [
            "[#21] user: Our orders table gets 2500000 rows a year. How many a month?",
            '[#22] assistant: {"tool": "calculator", "arguments": {"expression": "2500000 / 12"}}',
            "[#23] tool calculator: 208333.3333333333",
            "[#24] assistant: About 208,333 a month.",
        ]
    )
    account = (
        "Recap: The user asked me to calculate the average number of orders per month for the orders table. "
        "The calculation was performed using the formula 2500000 / 12, which gives 208333.33 [#23]. "
        "I provided the result to the user and explained the calculation step; the user confirmed the answer."
    )
    words, span_words = content_words(account), content_words(span)
    assert len(words & span_words) / len(words) < MIN_SHARE  # what the check used to reject
    assert check_prose(account, span) is None
    off_topic = "Recap: The user asked me to calculate the weather forecast for Lisbon using a formula."
    assert "mostly not about the span" in (check_prose(off_topic, span) or "accepted")


def test_the_prose_check_rejects_a_copy_of_the_worked_example():
    from loomrt.run.reducers.recap import RECAP_EXAMPLE
    from loomrt.run.reducers.summarize import EXAMPLE_SPAN

    own = (
        "The user asked me to deploy the billing service to node-7 on Friday [#3]; the rollback script is "
        "/opt/billing/rollback.sh [#7]. I explained MVCC: row versions and snapshots [#13]."
    )
    # Qwen2.5-Coder-1.5B copied lines of the example's transcript into its recaps
    copied = EXAMPLE_SPAN.splitlines()[0] + "\n" + own
    assert "copies the worked example" in (check_prose(copied, SPAN, example=RECAP_EXAMPLE) or "accepted")
    assert check_prose(copied, SPAN) is None  # the gap the check closes: without the example it passes
    assert check_prose(own, SPAN, example=RECAP_EXAMPLE) is None
    opens_alike = "Recap: The user asked me to deploy the billing service to node-7 on Friday [#3]; " + own
    assert check_prose(opens_alike, SPAN, example=RECAP_EXAMPLE) is None  # its opening words are not a copy


def test_carry_forward_keeps_the_sentences_with_exact_values_first_in_their_order():
    from loomrt.run.reducers.summarize import carry_forward

    earlier = (
        "The user asked me what DNS does, and I explained it at length to them. The ticket is LARK-9 [#5].\n"
        "We talked about TLS and certificates for a while. Priya owns the backup job at 02:30 [#7]."
    )
    kept = carry_forward(earlier, 160)  # half of it: 80 characters
    assert kept == "The ticket is LARK-9 [#5].\nPriya owns the backup job at 02:30 [#7]."
    assert carry_forward(earlier, 1000) == earlier  # room for all of it: nothing is reordered or lost
    assert carry_forward("", 400) == ""


def test_a_rejected_summary_is_retried_once_with_a_stricter_prompt_then_falls_back(tmp_path):
    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 256, "keep_last_n": 2})
    provider = ScriptedProvider(
        [calc(1), calc(2), calc(3, usage=1000), "done"], ["Sure! What would you like me to do next?"]
    )
    rt, run = start(tmp_path, spec, provider)
    assert send(rt, run, "task").status == "done"
    rejected = events(rt, run.run_id, "summary_rejected")
    assert [e.data["attempt"] for e in rejected] == [1, 2]
    assert "answers the conversation" in rejected[0].data["reason"]
    calls = [c for c in provider.calls if c.purpose == "summary"]
    assert len(calls) == 2 and "Your previous attempt was rejected" in calls[1].messages[-1]["content"]
    fell_back = [e.data for e in events(rt, run.run_id, "distillation") if e.data.get("fallback")]
    declined = events(rt, run.run_id, "distillation_declined")
    # the fallback extract replaces the span, unless even it is not smaller (this span is tiny)
    assert (fell_back and "answers the conversation" in fell_back[0]["fallback_reason"]) or (
        declined and declined[0].data["reason"] == "result not smaller"
    )
    assert distillations(rt, run.run_id) == [] and not any(m.synthetic for m in run.context)  # the span stayed
    assert run.view.rejections == 2


class Prefilling(ScriptedProvider):
    """A summariser that begins its reply with the request's ``reply_prefix``, as the
    embedded model does (its scripted words are what the model writes on with)."""

    async def complete(self, request):
        response = await super().complete(request)
        if request.purpose == "turn":
            return response
        return dataclasses.replace(response, text=request.reply_prefix + response.text)


@pytest.mark.parametrize(
    "written,reason",
    [(" Sure! What would you like me to do next?", "answers the conversation"), ("", "empty")],
)
def test_the_prefilled_start_of_a_recap_is_no_part_of_what_the_check_reads(tmp_path, written, reason):
    """ "Recap of [#2] to [#7]:" names the span's seqs, which would count as on-topic words and
    hide an answer's opening: the check reads what the model wrote after it."""
    spec = agent(tmp_path, {"mode": "recap", "budget_tokens": 256, "keep_last_n": 2})
    provider = Prefilling([calc(1), calc(2), calc(3, usage=1000), "done"], [written, written])
    rt, run = start(tmp_path, spec, provider)
    send(rt, run, "task")
    call = next(c for c in provider.calls if c.purpose == "recap")
    assert call.reply_prefix.startswith("Recap of [#") and call.reply_prefix.endswith("]:")
    rejected = events(rt, run.run_id, "summary_rejected")
    assert rejected and reason in rejected[0].data["reason"], [e.data for e in rejected]


def test_a_recap_is_kept_without_its_prefilled_start(tmp_path):
    spec = agent(tmp_path, {"mode": "recap", "budget_tokens": 256, "keep_last_n": 2})
    provider = Prefilling([calc(1), calc(2), calc(3, usage=1000), "done"], [" " + R1])
    rt, run = start(tmp_path, spec, provider)
    send(rt, run, "task")
    (d,) = distillations(rt, run.run_id)
    assert d["summary"].endswith(R1) and "Recap of [#" not in d["summary"]


def test_the_instruction_is_restated_after_the_transcript(tmp_path):
    spec = agent(tmp_path, {"mode": "recap", "budget_tokens": 256, "keep_last_n": 2})
    provider = ScriptedProvider(
        [calc(1), calc(2), calc(3, usage=1000), "done"], ["I used calculate on each expression."]
    )
    rt, run = start(tmp_path, spec, provider)
    send(rt, run, "task")
    prompt = next(c for c in provider.calls if c.purpose == "recap").messages[-1]["content"]
    assert prompt.index("TRANSCRIPT END") < prompt.index("Now write the recap of the whole transcript above")
    assert "do not reply to its last message" in prompt


def test_every_part_of_a_large_span_reaches_the_summariser(tmp_path):
    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 8192, "keep_last_n": 2, "message_max_tokens": 4000})

    @tool("note", "Return a long note.", {"type": "object", "properties": {"i": {"type": "integer"}}})
    def note(i: int) -> str:
        return f"note {i} begins. " + " ".join(f"fact{i}_{j}" for j in range(300))

    turns = [tool_call("note", i=i) for i in range(8)] + [
        {**tool_call("note", i=8), "usage": {"input_tokens": 8000}},
        "done",
    ]
    # the summariser's window holds about two notes: the span must be split into parts
    provider = ScriptedProvider(turns, [{"extractive": 300}], context_window=8192)
    small = ScriptedProvider([], [{"extractive": 300}], context_window=1800)
    rt, run = start(tmp_path, spec.model_copy(update={"tools": ["note"]}), provider, tools=[note])
    run.summarizer = small
    assert send(rt, run, "task").status == "done"
    d = distillations(rt, run.run_id)[0]
    assert d["parts"] >= 3
    first = small.calls[: d["parts"] + 1]  # one account per part, then the merge
    assert first[-1].messages[-1]["content"].count("Part ") >= d["parts"]
    prompts = "\n".join(c.messages[-1]["content"] for c in first)
    for seq in d["span_seqs"]:  # the start of the span as well as its end
        assert f"[#{seq}]" in prompts


def test_pointers_outside_the_span_are_dropped(tmp_path):
    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 256, "keep_last_n": 2})
    provider = ScriptedProvider(
        [calc(1), calc(2), calc(3, usage=1000), "done"],
        ["The assistant used calculate on each expression [#4] [#6] [#999]."],
    )
    rt, run = start(tmp_path, spec, provider)
    send(rt, run, "task")
    (d,) = distillations(rt, run.run_id)
    assert "[#4]" in d["summary"] and "[#999]" not in d["summary"] and d["pointers_dropped"] == 1


def test_reported_pressure_counts_again_after_a_distillation_that_followed_a_decline(tmp_path):
    huge = "the assistant used calculate on each expression " * 40
    spec = agent(tmp_path, {"mode": "compaction", "budget_tokens": 1000, "keep_last_n": 2})
    turns = [
        calc(1),
        calc(2),
        calc(3, usage=900),
        calc(4),
        calc(5),
        calc(6),
        calc(7),
        calc(8),
        calc(9),
        calc(10, usage=950),
        "done",
    ]
    provider = ScriptedProvider(turns, [huge, S1, S1])
    rt, run = start(tmp_path, spec, provider)
    assert send(rt, run, "task").status == "done"
    kinds = [e.kind for e in rt.store.events(run.run_id) if e.kind.startswith("distillation")]
    assert kinds[0] == "distillation_declined"
    pressures = [d["pressure"] for d in distillations(rt, run.run_id)]
    assert 950 in pressures  # the report of 95% was not ignored after the earlier decline


def test_the_estimate_counts_the_tool_schemas_sent_with_every_call(tmp_path):
    spec = agent(tmp_path, {"mode": "compaction", "recall": True})
    rt, run = start(tmp_path, spec, ScriptedProvider(["ok"]))
    tools = run.mode.offered_tools(run)
    assert {t.name for t in tools} == {"calculate", "Recall"}
    assert run.estimate() == count_messages(run.context) + count_tools(tools) > count_messages(run.context) + 100


def test_stateful_refuses_a_patch_that_would_push_sigma_past_its_share(tmp_path):
    ctx = {"mode": "stateful", "state_schema": SCHEMA, "budget_tokens": 1000, "stateful": {"state_max_tokens": 200}}
    big = {"step": 1, "notes": {f"k{i}": "a fairly long note about what the user said" for i in range(40)}}
    provider = ScriptedProvider([emit(big), emit({"step": 1, "notes": {"k": "short"}}, done=True, final="ok")])
    rt, run = start(tmp_path, agent(tmp_path, ctx), provider)
    result = send(rt, run, "task")
    assert result.status == "done" and result.state == {"step": 1, "notes": {"k": "short"}, "found": []}
    (rejected,) = events(rt, run.run_id, "patch_rejected")
    assert "over its share of the budget (200 tokens" in rejected.data["error"]
    feedback = next(e for e in events(rt, run.run_id, "tool_result") if e.data["is_error"])
    assert "state_max_tokens" in feedback.data["content"]  # the model saw why


def test_sigma_defaults_to_half_the_budget(tmp_path):
    ctx = {"mode": "stateful", "state_schema": SCHEMA, "budget_tokens": 600}
    big = {"step": 1, "notes": {f"k{i}": "a fairly long note about what the user said" for i in range(40)}}
    provider = ScriptedProvider([emit(big), emit({"step": 2}, done=True)])
    rt, run = start(tmp_path, agent(tmp_path, ctx), provider)
    send(rt, run, "task")
    (rejected,) = events(rt, run.run_id, "patch_rejected")
    assert "(300 tokens" in rejected.data["error"]


@tool("read_big", "Return a very large file.", {"type": "object", "properties": {}})
def read_big() -> str:
    return "HEADER line one\n" + "\n".join(f"row {i}: value-{i:05d}" for i in range(2500)) + "\nTAIL-MARKER-77"


@pytest.mark.parametrize("mode", ["append", "recap", "compaction"])
def test_an_oversized_message_is_cut_in_the_context_and_kept_whole_on_the_record(tmp_path, mode):
    ctx = {"mode": mode, "budget_tokens": 4096, "keep_last_n": 6, "recall": mode != "append"}
    provider = ScriptedProvider(
        [tool_call("read_big"), "I read it."] + ["fine"] * 10,
        ["I read a large file with read_big; it has a header, rows and a tail."],
    )
    spec = agent(tmp_path, ctx, tools=["read_big"])
    rt, run = start(tmp_path, spec, provider, tools=[read_big])
    assert send(rt, run, "read the file").status == "done"
    (result,) = events(rt, run.run_id, "tool_result")
    assert result.data["content"].endswith("TAIL-MARKER-77")  # the record holds it whole
    in_context = next(m for m in run.context if m.seq == result.seq)
    assert count_text(in_context.content) <= 1024
    assert "context.message_max_tokens" in in_context.content
    assert f"on the record as message #{result.seq}" in in_context.content
    assert run.run_id not in in_context.content  # a random id would move the budget's turn from run to run
    sent = provider.calls[1].messages[-1]["content"]
    assert "TAIL-MARKER-77" not in sent and "HEADER line one" in sent
    rebuilt = rt.open(run.run_id)
    assert [m.to_dict() for m in rebuilt.context] == [m.to_dict() for m in run.context]


def test_recall_indexes_the_full_text_of_a_cut_message(tmp_path):
    from loomrt.testing import HashEmbedder

    ctx = {"mode": "compaction", "budget_tokens": 4096, "keep_last_n": 2, "recall": True}
    turns = [tool_call("read_big"), "I read it."] + ["ok"] * 6
    provider = ScriptedProvider(turns, [{"extractive": 400}])
    spec = agent(tmp_path, ctx, tools=["read_big"])
    rt, run = start(tmp_path, spec, provider, tools=[read_big], embedder=HashEmbedder())
    run.interactive = True
    send(rt, run, "read the file")
    for i in range(6):
        send(rt, run, f"next question {i} " + "padding words " * 200)
    assert distillations(rt, run.run_id)
    hits = run.toolset.recall.search("TAIL-MARKER-77", top_k=5)
    assert any("TAIL-MARKER-77" in h.text for h in hits)


def test_runs_show_seq_prints_the_full_text(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from loomrt.cli import app

    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path))
    spec = agent(tmp_path, {"budget_tokens": 4096}, tools=["read_big"])
    from loomrt import Runtime

    rt = Runtime(providers=lambda s, m: ScriptedProvider([tool_call("read_big"), "done"]), tools=[read_big])
    run = rt.start(spec)
    send(rt, run, "go")
    (result,) = events(rt, run.run_id, "tool_result")
    shown = CliRunner().invoke(app, ["runs", "show", run.run_id, "--seq", str(result.seq)])
    assert shown.exit_code == 0 and "TAIL-MARKER-77" in shown.stdout
    as_json = json.loads(
        CliRunner().invoke(app, ["runs", "show", run.run_id, "--seq", str(result.seq), "--json"]).stdout
    )
    assert as_json["data"]["content"].endswith("TAIL-MARKER-77") and as_json["distilled_by"] == []
    missing = CliRunner().invoke(app, ["runs", "show", run.run_id, "--seq", "999"])
    assert missing.exit_code == 2 and "has no event #999" in missing.output


def test_scripted_output_tokens_count_tool_call_arguments():
    import asyncio

    from loomrt.providers.base import ModelRequest

    provider = ScriptedProvider([emit({"step": 1, "notes": {"a": "x" * 400}})])
    response = asyncio.run(provider.complete(ModelRequest(messages=[{"role": "user", "content": "go"}])))
    assert response.usage.output_tokens >= 100


def test_a_summariser_that_keeps_failing_falls_back_to_an_extract_and_the_budget_holds(tmp_path):
    """Every recap the model writes is rejected: after the retries the block is an extract of
    the span (marked fallback), the budget holds, and after two fallbacks in a row the
    summariser is paid again only now and then (the spend guard)."""
    spec = agent(tmp_path, {"mode": "recap", "budget_tokens": 400, "keep_last_n": 2})
    provider = ScriptedProvider(["ok"] * 40, ["Sure! What would you like me to do next?"] * 200)
    rt, run = start(tmp_path, spec, provider)
    filler = "We talked about the billing deploy on node-7 and the rollback script again, at length. " * 4
    for i in range(24):
        assert send(rt, run, f"turn {i}: {filler}").status in ("done", "parked")
    made = [e.data for e in events(rt, run.run_id, "distillation")]
    assert len(made) >= 4 and all(d.get("fallback") for d in made)
    assert all(d["tokens_after"] < d["tokens_before"] for d in made)
    assert "[#" in made[0]["summary"], "the extract keeps each message's pointer"
    paid = [c for c in provider.calls if c.purpose == "recap"]
    assert len(paid) < 2 * len(made), "the spend guard stopped paying for every distillation"
    from loomrt.tokens import count_dicts

    assert max(count_dicts(c.messages) for c in provider.calls if c.purpose == "turn") <= 400
