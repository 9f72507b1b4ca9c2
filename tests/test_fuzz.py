"""Bad input never crashes: property-based tests of every input edge. Each input either loads
or raises the project's own error (a :class:`~loomrt.errors.LoomError`) whose message names
what is wrong and where; never another exception, never a hang."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomrt.errors import LoomError, SpecError

FAST = settings(
    max_examples=int(os.environ.get("LOOMRT_FUZZ_EXAMPLES", "150")),
    deadline=None,
    derandomize="LOOMRT_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
"""Deterministic in CI (the same 150 examples each run); set LOOMRT_FUZZ_EXAMPLES=N to explore N random ones."""

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
keys = st.sampled_from(
    [
        "agents",
        "defaults",
        "model",
        "system_prompt",
        "tools",
        "context",
        "mode",
        "budget_tokens",
        "state_schema",
        "max_iterations",
        "keep_last_n",
        "recall",
        "x",
    ]
)
yaml_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 10**6)
    | st.text(max_size=12)
    | st.sampled_from(["append", "recap", "stateful", "compaction", "auto", "scripted/x.yaml", "${NOPE}", "local/x"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(keys, children, max_size=5),
    max_leaves=25,
)


def _assert_own_error(exc: Exception, where: str) -> None:
    assert isinstance(exc, LoomError), f"{type(exc).__name__}: {exc}"
    assert str(exc).strip(), "an error says what is wrong"
    if isinstance(exc, SpecError):
        assert where in str(exc) or where in (exc.where or ""), f"the error names {where}: {exc}"


@pytest.mark.slow
@FAST
@given(st.text(max_size=400))
def test_any_text_as_an_agents_file_loads_or_says_why(text: str) -> None:
    from loomrt.spec_load import load_agents_text

    try:
        load_agents_text(text, filename="fuzz.yaml", base_dir=Path("/tmp"))
    except Exception as exc:  # noqa: BLE001 - the property is about which exceptions
        _assert_own_error(exc, "fuzz.yaml")


@FAST
@given(
    st.dictionaries(keys, yaml_like, max_size=4)
    | st.fixed_dictionaries(
        {
            "agents": st.dictionaries(
                st.text(min_size=1, max_size=6), st.dictionaries(keys, yaml_like, max_size=6), max_size=3
            )
        }
    )
)
@pytest.mark.slow
def test_any_structure_as_an_agents_file_loads_or_says_why(doc: dict[str, Any]) -> None:
    from loomrt.spec_load import load_agents_text

    try:
        load_agents_text(yaml.safe_dump(doc), filename="fuzz.yaml", base_dir=Path("/tmp"))
    except Exception as exc:  # noqa: BLE001
        _assert_own_error(exc, "fuzz.yaml")


@FAST
@given(st.binary(max_size=300))
def test_any_bytes_as_an_agents_file_load_or_say_why(tmp_path_factory: Any, data: bytes) -> None:
    from loomrt.spec_load import load_agents

    path = tmp_path_factory.mktemp("fuzz") / "agents.yaml"
    path.write_bytes(data)
    try:
        load_agents(path)
    except Exception as exc:  # noqa: BLE001
        _assert_own_error(exc, str(path))


@pytest.mark.slow
def test_a_deeply_nested_or_huge_agents_file_says_why(tmp_path: Path) -> None:
    from loomrt.spec_load import load_agents

    deep = tmp_path / "deep.yaml"
    deep.write_text("agents:\n  a:\n    context: " + "[" * 5000 + "]" * 5000 + "\n")
    huge = tmp_path / "huge.yaml"
    huge.write_text("agents:\n  a:\n    model: scripted/x.yaml\n    system_prompt: '" + "x" * 3_000_000 + "'\n")
    for path in (deep, huge):
        try:
            load_agents(path)
        except Exception as exc:  # noqa: BLE001
            _assert_own_error(exc, str(path))
    with pytest.raises(SpecError, match="over the 2,097,152-byte limit"):
        load_agents(huge)


@pytest.mark.slow
@FAST
@given(json_values, json_values)
def test_merge_patch_and_validation_never_raise(target: Any, patch: Any) -> None:
    from loomrt.run.reducers.stateful import merge_patch, validate_state

    merged = merge_patch(target, patch)
    schema = {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]}
    assert validate_state(merged, schema) is None or isinstance(validate_state(merged, schema), str)
    json.dumps(merged)  # still JSON


@FAST
@given(
    st.dictionaries(st.sampled_from(["turns", "summaries", "local", "context_window", "other"]), yaml_like, max_size=4)
    | yaml_like
)
@pytest.mark.slow
def test_any_scripted_model_file_loads_or_says_why(tmp_path_factory: Any, doc: Any) -> None:
    from loomrt.providers.scripted import load_script

    path = tmp_path_factory.mktemp("script") / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        provider = load_script(path)
    except Exception as exc:  # noqa: BLE001
        _assert_own_error(exc, str(path))
        return
    from loomrt.providers.base import ModelRequest

    try:  # replaying the items it holds either answers or says what is wrong with the item
        for _ in range(3):
            asyncio.run(provider.complete(ModelRequest(messages=[{"role": "user", "content": "hi"}])))
    except Exception as exc:  # noqa: BLE001
        assert isinstance(exc, LoomError), f"{type(exc).__name__}: {exc}"


@FAST
@given(json_values)
def test_any_json_as_a_locomo_file_loads_or_says_why(tmp_path_factory: Any, doc: Any) -> None:
    from loomrt.bench.locomo_recall import evidence_ids, load_locomo, render_turn, turns_of

    path = tmp_path_factory.mktemp("locomo") / "l.json"
    path.write_text(json.dumps(doc))
    try:
        samples = load_locomo(path)
    except Exception as exc:  # noqa: BLE001
        _assert_own_error(exc, str(path))
        return
    for sample in samples:
        for turn in turns_of(sample):
            render_turn(turn)
        for q in sample["qa"]:
            evidence_ids(q.get("evidence") if isinstance(q, dict) else q)


@FAST
@given(
    st.sampled_from(["read_file", "list_dir", "search_text", "calculate", "now", "nope"]),
    st.dictionaries(st.text(max_size=10), json_values, max_size=4),
)
@pytest.mark.slow
def test_any_tool_call_arguments_become_a_result_not_a_crash(name: str, arguments: dict[str, Any]) -> None:
    from loomrt.messages import ToolCall
    from loomrt.run.loop import execute_tool
    from loomrt.spec import AgentSpec
    from loomrt.testing import ScriptedProvider, scripted_runtime

    rt = scripted_runtime(ScriptedProvider(["ok"]))
    spec = AgentSpec(model="scripted/x", tools=["read_file", "list_dir", "search_text", "calculate", "now"])

    async def go() -> Any:
        run = await rt.astart(spec)
        await execute_tool(run, ToolCall(id="c1", name=name, arguments=arguments))
        return rt.store.events(run.run_id, kinds=["tool_result"])

    (result,) = asyncio.run(go())
    assert isinstance(result.data["content"], str)


MCP_TOOLS = [
    "list_agents",
    "spawn_run",
    "spawn_runs",
    "get_run",
    "list_runs",
    "get_events",
    "continue_run",
    "cancel_run",
    "compact_run",
    "recall",
    "no_such_tool",
]
mcp_keys = st.sampled_from(
    [
        "agent",
        "prompt",
        "context",
        "wait",
        "timeout_s",
        "spawns",
        "run_id",
        "after_seq",
        "limit",
        "status",
        "query",
        "top_k",
        "mode",
        "budget_tokens",
        "recall",
        "x",
    ]
)
mcp_args = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=12)
    | st.sampled_from(["quick", "compaction", "append", "000000000000"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(mcp_keys, children, max_size=4),
    max_leaves=15,
)


@pytest.mark.slow
@FAST
@given(st.sampled_from(MCP_TOOLS), st.dictionaries(mcp_keys, mcp_args, max_size=5))
def test_any_mcp_tool_arguments_are_a_result_or_a_tool_error(
    tmp_path_factory: Any, name: str, arguments: dict[str, Any]
) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    from loomrt.mcp.server import build_server
    from loomrt.mcp.service import RunService
    from loomrt.spec_load import load_agents

    folder = tmp_path_factory.mktemp("mcp-fuzz")
    (folder / "quick.yaml").write_text("turns:\n  - text: ok\n")
    (folder / "agents.yaml").write_text(
        "agents:\n  quick:\n    model: scripted/quick.yaml\n    context: {mode: compaction, budget_tokens: 4096}\n"
    )
    service = RunService(load_agents(folder / "agents.yaml"))
    server = build_server(service)

    async def call() -> None:
        try:
            await asyncio.wait_for(server.call_tool(name, arguments), 10)
        except ToolError as exc:
            assert str(exc).strip() and "Traceback" not in str(exc)
            assert not str(exc).startswith("Error executing tool"), f"an unexpected error in {name}: {exc.__cause__!r}"
        finally:
            await service.close()

    asyncio.run(call())


@pytest.mark.slow
@FAST
@given(st.integers(2, 12), st.integers(2, 12), st.booleans())
def test_alias_heavy_yaml_loads_or_is_refused_within_a_bounded_count_of_nodes(
    width: int, depth: int, tail: bool
) -> None:
    """Aliases that refer to aliases (width^depth nodes once expanded): the file loads when it
    is small and is refused, naming an alias, when it is not; the loader counts each distinct
    node once, so the work is bounded by the file's own nodes, never by the expansion."""
    from loomrt.spec_load import YAML_MAX_NODES, _expanded_size, load_agents_text

    rows = ['a0: &a0 ["x"]']
    for i in range(1, depth):
        rows.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    text = "\n".join(rows) + f"\nagents:\n  x:\n    model: local/smollm2-135m\n    tools: {'*a1' if tail else '[]'}\n"
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    expanded = _expanded_size(node, YAML_MAX_NODES)
    try:
        load_agents_text(text, filename="bomb.yaml", base_dir=Path("/tmp"))
        assert expanded <= YAML_MAX_NODES
    except SpecError as exc:
        if expanded > YAML_MAX_NODES:
            assert "aliases expand to more than" in str(exc) and "*a" in str(exc)
        else:
            _assert_own_error(exc, "bomb.yaml")


@pytest.mark.slow
@FAST
@given(st.integers(1, 6000), st.sampled_from(["dict", "list", "str", "int", "none-name"]))
def test_a_custom_providers_malformed_or_deep_arguments_are_a_retried_error_never_recorded(
    depth: int, shape: str
) -> None:
    """Whatever a custom provider puts in a tool call, the run ends done (after a retry) or
    with one clear error, and the record stays readable: it can be projected and verified."""
    from loomrt.audit import prompt_problems
    from loomrt.messages import ToolCall
    from loomrt.providers.base import ARGUMENTS_MAX_DEPTH, ModelResponse
    from loomrt.run.projection import project
    from loomrt.spec import AgentSpec
    from loomrt.testing import FunctionProvider, scripted_runtime

    value: Any = {}
    for _ in range(depth):
        value = {"a": value}
    arguments: Any = {"dict": value, "list": [1, 2], "str": "2 + 2", "int": 4, "none-name": {}}[shape]
    name = "" if shape == "none-name" else "calculate"
    replies = [ModelResponse(tool_calls=(ToolCall(id="c", name=name, arguments=arguments),))]

    def reply(request: Any) -> ModelResponse:
        return replies.pop() if replies else ModelResponse(text="done")

    rt = scripted_runtime(FunctionProvider(reply))
    result = rt.run_sync(AgentSpec(model="scripted/x", tools=["calculate"]), "compute")
    events = rt.store.events(result.run_id)
    project(events)
    assert prompt_problems(events) == []
    good = shape == "dict" and depth <= ARGUMENTS_MAX_DEPTH
    assert result.status == "done", result.error
    assert any(e.kind == "retry" for e in events) != good
