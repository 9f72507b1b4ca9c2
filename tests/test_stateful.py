"""stateful mode: emit_state, merge-patch, validation, retry and fail, propose_schema, and
what survives each boundary (system, the task, Σ and the last observation)."""

from __future__ import annotations

import json

import pytest
from modes_kit import SCHEMA, agent, distillations, emit, request_contents, start
from spine_kit import events, kinds, runtime, send

from loomrt.run.reducers.stateful import merge_patch
from loomrt.testing import ScriptedProvider

# ---------------------------------------------------------------- stateful


def stateful_run(tmp_path, turns, prompt="triage", **ctx):
    context = {"mode": "stateful", "state_schema": SCHEMA, **ctx}
    provider = ScriptedProvider(turns)
    rt, run = start(tmp_path, agent(tmp_path, context), provider)
    return rt, run, provider, send(rt, run, prompt)


def test_stateful_offers_only_emit_state_and_states_the_schema(tmp_path):
    rt, run, provider, result = stateful_run(tmp_path, [emit({"step": 1}, done=True, final="ok")])
    assert result.output == "ok"
    request = provider.calls[0]
    assert [t.name for t in request.tools] == ["emit_state"] and request.tool_choice == "required"
    params = request.tools[0].parameters
    assert params["properties"]["action"]["properties"]["tool"]["enum"] == ["calculate"]
    assert params["required"] == ["reasoning", "patch"]
    system = request.messages[0]["content"]
    assert json.dumps(SCHEMA) in system and 'The state starts as: {"found": []}' in system


def test_stateful_boundary_keeps_system_task_sigma_and_the_last_observation_only(tmp_path):
    turns = [
        emit({"step": 1, "found": ["a"]}, action={"tool": "calculate", "arguments": {"expression": "20+22"}}),
        emit({"step": 2}),
        emit({"step": 3}, done=True, final="finished"),
    ]
    rt, run, provider, result = stateful_run(tmp_path, turns)
    assert (result.status, result.output) == ("done", "finished")
    assert result.state == {"step": 3, "found": ["a"]}
    second, third = provider.calls[1], provider.calls[2]
    assert request_contents(second) == [
        ("system", provider.calls[0].messages[0]["content"]),
        ("user", "triage"),
        ("user", 'Your state Σ:\n{"found": ["a"], "step": 1}'),
        ("user", "Last observation (calculate):\n42"),
    ]
    assert request_contents(third)[2:] == [
        ("user", 'Your state Σ:\n{"found": ["a"], "step": 2}'),
        ("user", "Last observation (emit_state):\nState accepted."),
    ]
    ds = distillations(rt, run.run_id)
    assert [d["state"] for d in ds] == [{"found": ["a"], "step": 1}, {"found": ["a"], "step": 2}]
    assert all(d["mode"] == "stateful" for d in ds)


def test_interactive_stateful_keeps_the_turn_in_progress_input_until_the_turn_ends(tmp_path):
    context = {"mode": "stateful", "state_schema": SCHEMA}
    provider = ScriptedProvider(
        [
            emit({"step": 1}, done=True, final="first done"),
            emit({"step": 2}, action={"tool": "calculate", "arguments": {"expression": "1+1"}}),
            emit({"step": 3}, done=True, final="second done"),
        ]
    )
    rt = runtime(tmp_path, provider)
    run = rt.start(agent(tmp_path, context), name="a", interactive=True)
    send(rt, run, "first task")
    assert send(rt, run, "now the second question").output == "second done"
    third = request_contents(provider.calls[2])
    assert ("user", "first task") in third  # the pinned task
    assert third[-2:] == [("user", "now the second question"), ("user", "Last observation (calculate):\n2")]


def test_merge_patch_through_a_run_deletes_with_null_and_merges_nested_objects(tmp_path):
    turns = [
        emit({"step": 1, "notes": {"db": {"host": "h", "port": 5432}, "owner": "ann"}}),
        emit({"notes": {"db": {"port": 6543, "host": None}, "owner": None, "tag": "x"}}),
        emit({"found": ["k"]}, done=True),
    ]
    rt, run, provider, result = stateful_run(tmp_path, turns)
    assert result.state == {"step": 1, "notes": {"db": {"port": 6543}, "tag": "x"}, "found": ["k"]}
    assert json.loads(result.output) == result.state  # no final: the state is the answer
    updates = [e.data for e in events(rt, run.run_id, "state_update")]
    assert updates[1]["patch"] == {"notes": {"db": {"port": 6543, "host": None}, "owner": None, "tag": "x"}}


def test_an_invalid_patch_is_shown_back_with_the_error_then_the_run_goes_on(tmp_path):
    turns = [emit({"step": "one"}), emit({"step": 1}, done=True, final="ok")]
    rt, run, provider, result = stateful_run(tmp_path, turns)
    assert (result.status, result.output) == ("done", "ok")
    (rejected,) = events(rt, run.run_id, "patch_rejected")
    assert rejected.data["attempt"] == 1 and rejected.data["patch"] == {"step": "one"}
    assert "at step: 'one' is not of type 'integer'" in rejected.data["error"]
    shown = provider.calls[1].messages[-1]["content"]
    assert "Rejected: the patched state is invalid: at step: 'one' is not of type 'integer'" in shown
    assert "Call emit_state again" in shown
    assert result.state == {"step": 1, "found": []}


def test_required_is_part_of_validation(tmp_path):
    turns = [emit({"notes": {"a": 1}}), emit({"step": 1, "notes": {"a": 1}}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns)
    (rejected,) = events(rt, run.run_id, "patch_rejected")
    assert "'step' is a required property" in rejected.data["error"]
    assert result.status == "done" and result.state["step"] == 1


def test_on_invalid_patch_fail_fails_at_once(tmp_path):
    turns = [emit({"step": "one"}), emit({"step": 1}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns, on_invalid_patch="fail")
    assert result.status == "failed" and len(provider.calls) == 1
    assert "stateful mode: the patched state is invalid: at step: 'one' is not of type 'integer'" in result.error
    assert "on_invalid_patch=fail" in result.error
    error = events(rt, run.run_id, "error")[0].data
    assert error["type"] == "StateError" and error["message"] == result.error
    assert kinds(rt, run.run_id)[-2:] == ["patch_rejected", "error"]


def test_retries_exhausted_fail_the_run_cleanly(tmp_path):
    turns = [emit({"step": "a"}), emit({"step": "b"}), emit({"step": "c"}), emit({"step": 1}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns, max_patch_retries=2)
    assert result.status == "failed" and len(provider.calls) == 3
    assert "after 3 attempt(s); on_invalid_patch=retry, max_patch_retries=2" in result.error
    assert "raise max_patch_retries" in result.error
    assert [e.data["attempt"] for e in events(rt, run.run_id, "patch_rejected")] == [1, 2, 3]
    assert rt.store.get_run(run.run_id).status == "failed"


def test_a_valid_patch_resets_the_retry_count(tmp_path):
    turns = [emit({"step": "a"}), emit({"step": 1}), emit({"step": "b"}), emit({"step": 2}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns, max_patch_retries=1)
    assert result.status == "done" and result.state["step"] == 2


def test_a_reply_without_emit_state_is_asked_again(tmp_path):
    rt, run, provider, result = stateful_run(tmp_path, ["I think it is done.", emit({"step": 1}, done=True)])
    assert result.status == "done"
    (rejected,) = events(rt, run.run_id, "patch_rejected")
    assert "you must act by calling emit_state" in rejected.data["error"]
    assert "you must act by calling emit_state" in provider.calls[1].messages[-1]["content"]


def test_a_patch_that_is_not_an_object_is_rejected(tmp_path):
    rt, run, provider, result = stateful_run(tmp_path, [emit([1, 2]), emit({"step": 1}, done=True)])
    assert "patch must be a JSON object, got list" in events(rt, run.run_id, "patch_rejected")[0].data["error"]
    assert result.status == "done"


def test_propose_schema_is_recorded_and_never_applied(tmp_path):
    proposal = {"type": "object", "properties": {"step": {"type": "string"}}}
    turns = [emit({"step": 1}, propose_schema=proposal), emit({"step": "two"}), emit({"step": 2}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns, propose_schema=True)
    (proposed,) = events(rt, run.run_id, "schema_proposed")
    assert "propose_schema" in provider.calls[0].tools[0].parameters["properties"]
    assert proposed.data["schema"] == proposal
    # the original schema still rules: a string step is rejected
    assert "'two' is not of type 'integer'" in events(rt, run.run_id, "patch_rejected")[0].data["error"]
    assert run.spec.context.state_schema == SCHEMA
    assert json.dumps(SCHEMA) in provider.calls[-1].messages[0]["content"]
    assert result.status == "done"


def test_propose_schema_is_not_offered_unless_the_definition_opts_in(tmp_path):
    proposal = {"type": "object"}
    rt, run, provider, result = stateful_run(tmp_path, [emit({"step": 1}, propose_schema=proposal, done=True)])
    assert "propose_schema" not in provider.calls[0].tools[0].parameters["properties"]
    assert events(rt, run.run_id, "schema_proposed") == [] and result.status == "done"


def test_an_action_on_a_tool_outside_the_allowlist_is_an_error_observation(tmp_path):
    turns = [emit({"step": 1}, action={"tool": "read_file", "arguments": {"path": "/etc/passwd"}}), emit({}, done=True)]
    rt, run, provider, result = stateful_run(tmp_path, turns)
    assert result.status == "done"
    assert (
        "Last observation (read_file):\nError: no tool named 'read_file'. Available: calculate."
        in (provider.calls[1].messages[-1]["content"])
    )


@pytest.mark.parametrize(
    "target,patch,expected",
    [  # RFC 7386, appendix A
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_follows_rfc_7386(target, patch, expected):
    before = json.dumps(target)
    assert merge_patch(target, patch) == expected
    assert json.dumps(target) == before  # the target is untouched


def test_before_any_valid_patch_sigma_is_the_initial_state_from_the_schema_defaults(tmp_path):
    rt, run, provider, result = stateful_run(tmp_path, [emit({"step": "bad"}), emit({"step": 1}, done=True)])
    assert result.status == "done"
    sigma = provider.calls[1].messages[2]["content"]
    assert sigma == 'Your state Σ:\n{"found": []}'
    (d,) = distillations(rt, run.run_id)
    assert d["state"] == {"found": []}
