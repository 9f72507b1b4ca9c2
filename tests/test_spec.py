"""Agent definitions: YAML files on disk, their defaults, paths and interpolation, and every
bad input giving its clear error (file:line:col, key path, what to do)."""

from __future__ import annotations

import jsonschema
import pydantic
import pytest
import yaml
from spine_kit import agents_from, runtime, write

from loomrt import AgentSpec, SpecError, agents_json_schema, load_agents, load_agents_text
from loomrt.spec import definition_hash

SCRIPT = "turns: [{text: ok}]\n"


def load_error(tmp_path, monkeypatch, text: str) -> str:
    """Load ``text`` as ./agents.yaml (so errors name 'agents.yaml') and return the error."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "agents.yaml", text)
    with pytest.raises(SpecError) as info:
        load_agents("agents.yaml", eager=True)
    return str(info.value)


# ---------------------------------------------------------------- valid files


def test_a_minimal_agent_gets_every_default(tmp_path):
    agents = agents_from(
        tmp_path,
        """
        agents:
          plain: {model: openai/gpt-4o, system_prompt: Be brief.}
    """,
    )
    spec = agents.agents["plain"]
    assert spec.context.mode == "append"
    assert spec.context.keep_first is True
    assert spec.context.autorecap_at_pct == 80 and spec.context.autocompact_at_pct == 80
    assert spec.context.max_patch_retries == 2 and spec.context.on_invalid_patch == "retry"
    assert spec.tools == []  # default-deny
    assert spec.system_text() == "Be brief."


def test_defaults_apply_to_every_agent_and_context_keys_merge_one_by_one(tmp_path):
    agents = agents_from(
        tmp_path,
        """
        defaults:
          model: openai/gpt-4o-mini
          max_iterations: 7
          context: {mode: recap, budget_tokens: 1000, keep_last_n: 3}
        agents:
          inherits: {system_prompt: a}
          overrides:
            model: ollama/llama3
            context: {budget_tokens: 2000}
    """,
    )
    inherits, overrides = agents.agents["inherits"], agents.agents["overrides"]
    assert inherits.model == "openai/gpt-4o-mini"
    assert inherits.max_iterations == 7
    assert (inherits.context.mode, inherits.context.budget_tokens, inherits.context.keep_last_n) == ("recap", 1000, 3)
    assert overrides.model == "ollama/llama3"
    assert (overrides.context.mode, overrides.context.budget_tokens, overrides.context.keep_last_n) == (
        "recap",
        2000,
        3,
    )
    assert overrides.max_iterations == 7


def test_an_agents_state_schema_replaces_the_default_one_whole(tmp_path):
    agents = agents_from(
        tmp_path,
        """
        defaults:
          context:
            state_schema: {type: object, properties: {a: {type: integer}}, required: [a]}
        agents:
          x:
            model: m
            context:
              mode: stateful
              state_schema: {type: object, properties: {b: {type: string}}}
    """,
    )
    assert agents.agents["x"].context.state_schema == {"type": "object", "properties": {"b": {"type": "string"}}}


def test_relative_paths_resolve_against_the_files_folder_not_the_cwd(tmp_path, monkeypatch):
    project = tmp_path / "project"
    write(project, "prompts/sys.md", "You triage bugs.")
    write(project, "scripts/main.yaml", "turns: [{text: from the main script}]\nsummaries: [main summary]\n")
    write(project, "scripts/cheap.yaml", "turns: []\nsummaries: [cheap summary]\n")
    write(
        project,
        "agents.yaml",
        """
        agents:
          a:
            model: scripted/scripts/main.yaml
            system_prompt_file: prompts/sys.md
            context: {summarizer_model: scripted/scripts/cheap.yaml}
    """,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = load_agents("../project/agents.yaml").agents["a"]
    assert spec.system_text() == "You triage bugs."
    assert spec.model == f"scripted/{project / 'scripts/main.yaml'}"
    assert spec.context.summarizer_model == f"scripted/{project / 'scripts/cheap.yaml'}"
    # and the run really reads those files from there
    result = runtime(tmp_path).run_sync(spec, "go")
    assert result.status == "done" and result.output == "from the main script"


def test_env_interpolation_with_and_without_default(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMRT_TEST_MODEL", "ollama/qwen")
    monkeypatch.setenv("LOOMRT_TEST_BUDGET", "3000")
    monkeypatch.delenv("LOOMRT_TEST_UNSET", raising=False)
    agents = agents_from(
        tmp_path,
        """
        agents:
          a:
            model: ${LOOMRT_TEST_MODEL}
            system_prompt: "key in ${LOOMRT_TEST_UNSET:-nowhere}, empty [${LOOMRT_TEST_UNSET:-}]"
            context: {budget_tokens: "${LOOMRT_TEST_BUDGET}"}
    """,
    )
    spec = agents.agents["a"]
    assert spec.model == "ollama/qwen"
    assert spec.system_prompt == "key in nowhere, empty []"
    assert spec.context.budget_tokens == 3000


def test_a_set_variable_wins_over_its_default(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMRT_TEST_MODEL", "openai/gpt-4o")
    agents = agents_from(tmp_path, "agents:\n  a: {model: '${LOOMRT_TEST_MODEL:-ollama/llama3}'}\n")
    assert agents.agents["a"].model == "openai/gpt-4o"


def test_definition_hash_follows_the_prompt_files_content(tmp_path):
    write(tmp_path, "p.md", "one")
    text = "agents:\n  a: {model: m, system_prompt_file: p.md}\n"
    first = definition_hash(agents_from(tmp_path, text).agents["a"])
    assert definition_hash(agents_from(tmp_path, text).agents["a"]) == first
    write(tmp_path, "p.md", "two")
    assert definition_hash(agents_from(tmp_path, text).agents["a"]) != first


def test_a_loaded_definition_is_immutable(tmp_path):
    spec = agents_from(tmp_path, "agents:\n  a: {model: m}\n").agents["a"]
    with pytest.raises(pydantic.ValidationError):
        spec.model = "other"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        spec.context.mode = "recap"  # type: ignore[misc]


def test_the_json_schema_accepts_a_valid_file_and_rejects_a_bad_enum():
    schema = agents_json_schema()
    assert schema["$id"].endswith("agents.schema.json")
    good = yaml.safe_load("agents:\n  a: {model: m, context: {mode: recap, autorecap_at_pct: 60}}\n")
    jsonschema.validate(good, schema)
    for bad in (
        "agents:\n  a: {model: m, context: {mode: stateful2}}\n",
        "agents:\n  a: {model: m, modle: x}\n",
        "agents:\n  a: {model: m, context: {autorecap_at_pct: 99}}\n",
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(yaml.safe_load(bad), schema)


def test_every_field_of_the_definition_is_documented():
    schema = agents_json_schema()
    for model in ("AgentSpec", "ContextSpec", "Capabilities"):
        props = schema["$defs"][model]["properties"]
        undocumented = [k for k, v in props.items() if not v.get("description")]
        assert not undocumented, f"{model}: {undocumented}"


# ---------------------------------------------------------------- bad input


def test_yaml_syntax_error_names_file_line_and_column(tmp_path, monkeypatch):
    msg = load_error(
        tmp_path,
        monkeypatch,
        """
        agents:
          a:
            model: m
            tools: [calculate
    """,
    )
    assert msg.startswith("agents.yaml:5:1: not valid YAML"), msg


def test_unknown_key_names_its_position_and_suggests_the_closest(tmp_path, monkeypatch):
    msg = load_error(
        tmp_path,
        monkeypatch,
        """
        agents:
          helper:
            model: m
            system_promt: hi
    """,
    )
    assert (
        msg == "agents.yaml:4:5: agents.helper.system_promt: unknown key 'system_promt'. Did you mean 'system_prompt'?"
    )


def test_unknown_context_key_suggests_a_context_key(tmp_path, monkeypatch):
    msg = load_error(
        tmp_path,
        monkeypatch,
        """
        agents:
          helper:
            model: m
            context:
              budget_tokenz: 4000
    """,
    )
    assert (
        msg
        == "agents.yaml:5:7: agents.helper.context.budget_tokenz: unknown key 'budget_tokenz'. Did you mean 'budget_tokens'?"
    )


def test_unknown_key_without_a_close_match_lists_the_known_keys(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "agents:\n  a: {model: m, context: {zzzzzz: 1}}\n")
    assert "unknown key 'zzzzzz'. Known keys: mode, budget_tokens" in msg


def test_unknown_key_of_an_agent_whose_name_is_also_a_field_name(tmp_path, monkeypatch):
    # the agent's name sits where a field name could: suggestions still come from the agent's keys
    msg = load_error(
        tmp_path,
        monkeypatch,
        """
        agents:
          context:
            model: m
            modle: x
    """,
    )
    assert msg == "agents.yaml:4:5: agents.context.modle: unknown key 'modle'. Did you mean 'model'?"


def test_unknown_top_level_key_suggests_defaults(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "defualts: {}\nagents:\n  a: {model: m}\n")
    assert msg == "agents.yaml:1:1: defualts: unknown key 'defualts'. Did you mean 'defaults'?"


def test_wrong_enum_has_the_exact_documented_format(tmp_path, monkeypatch):
    msg = load_error(
        tmp_path,
        monkeypatch,
        """
        # yaml-language-server: $schema=https://loomrt.dev/schema/agents.schema.json
        # line 2
        agents:
          assistant:
            model: ollama/llama3
            system_prompt: Help.

          triage:
            # what it shows: a stateful triage
            model: openai/gpt-4o
            system_prompt: Triage bugs.
            tools: [read_file]
            context:
              mode: stateful2
    """,
    )
    assert msg == (
        "agents.yaml:14:13: agents.triage.context.mode: "
        "'stateful2' is not one of append, recap, stateful, compaction, fold, auto"
    )


def test_wrong_on_invalid_patch_lists_its_choices(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "agents:\n  a: {model: m, context: {on_invalid_patch: skip}}\n")
    assert msg.endswith("agents.a.context.on_invalid_patch: 'skip' is not one of retry, fail")


def test_missing_required_key(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "agents:\n  a:\n    system_prompt: hi\n")
    assert msg == "agents.yaml:3:5: agents.a.model: this key is required"


def test_wrong_type_shows_the_value(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "agents:\n  a:\n    model: m\n    max_iterations: lots\n")
    assert msg.startswith("agents.yaml:4:21: agents.a.max_iterations: Input should be a valid integer")
    assert msg.endswith("(got 'lots')")


@pytest.mark.parametrize("key", ["autorecap_at_pct", "autocompact_at_pct"])
@pytest.mark.parametrize("value,ok", [(49, False), (50, True), (95, True), (96, False)])
def test_pct_must_be_between_50_and_95(tmp_path, monkeypatch, key, value, ok):
    text = f"agents:\n  a:\n    model: m\n    context:\n      {key}: {value}\n"
    if ok:
        assert getattr(agents_from(tmp_path, text).agents["a"].context, key) == value
        return
    msg = load_error(tmp_path, monkeypatch, text)
    bound = "greater than or equal to 50" if value < 50 else "less than or equal to 95"
    assert msg == f"agents.yaml:5:{len(key) + 9}: agents.a.context.{key}: Input should be {bound} (got {value})"


@pytest.mark.parametrize(
    "schema,expected",
    [
        ("{type: object, properties: {n: {type: 12}}}", "not a valid JSON Schema"),
        ("{type: object, required: yes}", "not a valid JSON Schema"),
        ("{type: array, items: {type: string}}", "the root of state_schema must be {type: object}"),
    ],
)
def test_invalid_state_schema(tmp_path, monkeypatch, schema, expected):
    msg = load_error(
        tmp_path,
        monkeypatch,
        f"agents:\n  a:\n    model: m\n    context:\n      mode: stateful\n      state_schema: {schema}\n",
    )
    assert msg.startswith("agents.yaml:6:21: agents.a.context.state_schema: " + expected), msg


def test_stateful_without_a_schema(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "agents:\n  a:\n    model: m\n    context:\n      mode: stateful\n")
    assert msg == (
        "agents.yaml:5:7: agents.a.context: mode stateful needs a state_schema (a JSON Schema whose root is an object)"
    )


def test_unset_env_var_names_the_variable_and_where_it_is_used(tmp_path, monkeypatch):
    monkeypatch.delenv("LOOMRT_TEST_UNSET", raising=False)
    msg = load_error(tmp_path, monkeypatch, "agents:\n  a:\n    model: m\n    api_key_env: ${LOOMRT_TEST_UNSET}\n")
    assert msg == (
        "agents.yaml:4:18: agents.a.api_key_env: environment variable LOOMRT_TEST_UNSET is not set. "
        "Set it, or write ${LOOMRT_TEST_UNSET:-default}"
    )


def test_missing_system_prompt_file(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "agents:\n  a:\n    model: m\n    system_prompt_file: prompts/nope.md\n")
    assert msg.startswith(
        "agents.yaml:4:25: agents.a.system_prompt_file: system prompt file 'prompts/nope.md' does not exist"
    )
    assert str(tmp_path / "prompts") in msg


def test_system_prompt_and_system_prompt_file_together(tmp_path, monkeypatch):
    write(tmp_path, "p.md", "x")
    msg = load_error(
        tmp_path, monkeypatch, "agents:\n  a:\n    model: m\n    system_prompt: hi\n    system_prompt_file: p.md\n"
    )
    assert msg == "agents.yaml:3:5: agents.a: give system_prompt or system_prompt_file, not both"


def test_missing_agents_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match=r"^nope.yaml: no such agents file. Pass --agents FILE"):
        load_agents("nope.yaml")


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "agent:\n  a: {model: m}\n"])
def test_the_top_level_must_have_agents(text):
    with pytest.raises(SpecError, match="the top level must be a mapping with an 'agents:' key"):
        load_agents_text(text, filename="f.yaml")


@pytest.mark.parametrize("text", ["agents: {}\n", "agents: [a, b]\n"])
def test_agents_must_map_names_to_definitions(text):
    with pytest.raises(SpecError, match=r"^f.yaml:1:9: agents: 'agents:' must map agent names to definitions"):
        load_agents_text(text, filename="f.yaml")


def test_an_agent_that_is_not_a_mapping(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "agents:\n  a: openai/gpt-4o\n")
    assert msg == "agents.yaml:2:6: agents.a: an agent definition must be a mapping"


def test_defaults_that_are_not_a_mapping(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "defaults: [model]\nagents:\n  a: {model: m}\n")
    assert msg == "agents.yaml:1:11: defaults: 'defaults:' must be a mapping of keys every agent gets"


def test_a_bad_key_in_defaults_is_reported_where_it_is_written(tmp_path, monkeypatch):
    msg = load_error(
        tmp_path,
        monkeypatch,
        """
        defaults:
          context: {mdoe: recap}
        agents:
          a: {model: m}
    """,
    )
    assert (
        msg
        == "agents.yaml:2:13: defaults.context.mdoe: unknown key 'mdoe'. Did you mean 'mode'? (applies to agent 'a')"
    )


def test_a_bad_value_in_defaults_is_reported_where_it_is_written(tmp_path, monkeypatch):
    msg = load_error(
        tmp_path,
        monkeypatch,
        """
        defaults:
          context:
            autocompact_at_pct: 20
        agents:
          a: {model: m}
    """,
    )
    assert msg.startswith(
        "agents.yaml:3:25: defaults.context.autocompact_at_pct: Input should be greater than or equal to 50"
    )


def test_unknown_tool_in_the_allowlist_fails_the_start_before_any_run_is_recorded(tmp_path):
    write(tmp_path, "s.yaml", SCRIPT)
    agents = agents_from(tmp_path, "agents:\n  a: {model: scripted/s.yaml, tools: [calculate, shell]}\n")
    rt = runtime(tmp_path)
    with pytest.raises(SpecError) as info:
        rt.start("a", agents=agents)
    msg = str(info.value)
    assert msg.startswith("agents.a.tools[1]: unknown tool 'shell'. Known tools: calculate, list_dir, now")
    assert rt.store.list_runs() == []


def test_an_unknown_agent_name_lists_the_known_ones(tmp_path):
    from loomrt import NotFoundError

    write(tmp_path, "s.yaml", SCRIPT)
    agents = agents_from(tmp_path, "agents:\n  beta: {model: scripted/s.yaml}\n  alpha: {model: scripted/s.yaml}\n")
    with pytest.raises(NotFoundError, match=r"no agent named 'gamma'. Known agents: alpha, beta"):
        runtime(tmp_path).start("gamma", agents=agents)


def test_a_missing_script_is_a_clear_error(tmp_path):
    agents = agents_from(tmp_path, "agents:\n  a: {model: scripted/nope.yaml}\n")
    with pytest.raises(SpecError, match=r"the scripted model's script does not exist: .*nope.yaml"):
        runtime(tmp_path).start("a", agents=agents)


def test_a_bad_script_turn_is_a_clear_error(tmp_path):
    write(tmp_path, "s.yaml", "turns: [{txet: hi}]\n")
    agents = agents_from(tmp_path, "agents:\n  a: {model: scripted/s.yaml}\n")
    with pytest.raises(
        SpecError, match=r"turn 1: must have one of text, tool_call, tool_calls, emit_state \(got \['txet'\]\)"
    ):
        runtime(tmp_path).start("a", agents=agents)


def test_bad_overrides_at_start_are_spec_errors(tmp_path):
    write(tmp_path, "s.yaml", SCRIPT)
    agents = agents_from(tmp_path, "agents:\n  a: {model: scripted/s.yaml}\n")
    rt = runtime(tmp_path)
    with pytest.raises(SpecError, match="mode stateful needs a state_schema"):
        rt.start("a", agents=agents, mode="stateful")
    with pytest.raises(SpecError, match="context.autorecap_at_pct"):
        rt.start("a", agents=agents, overrides={"context": {"autorecap_at_pct": 10}})
    assert rt.store.list_runs() == []


def test_spec_from_python_checks_the_same_rules():
    with pytest.raises(pydantic.ValidationError, match="not both"):
        AgentSpec(model="m", system_prompt="a", system_prompt_file="b")
    with pytest.raises(pydantic.ValidationError, match="needs a state_schema"):
        AgentSpec.model_validate({"model": "m", "context": {"mode": "stateful"}})


def test_a_duplicate_agent_name_is_an_error_not_a_silent_override(tmp_path, monkeypatch):
    msg = load_error(
        tmp_path,
        monkeypatch,
        """
        agents:
          triage: {model: openai/gpt-4o}
          helper: {model: m}
          triage: {model: ollama/llama3}
    """,
    )
    assert msg == "agents.yaml:4:3: agents.triage: duplicate key 'triage' (first at line 2). Keep one."


def test_a_duplicate_context_key_is_an_error(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "agents:\n  a:\n    model: m\n    context: {mode: recap, mode: append}\n")
    assert msg == "agents.yaml:4:28: agents.a.context.mode: duplicate key 'mode' (first at line 4). Keep one."


@pytest.mark.parametrize(
    "script,expected",
    [
        ("turns: hello\n", "'turns:' must be a list of replies"),
        ("turns: [{text: a}]\nsummaries: {a: b}\n", "'summaries:' must be a list of replies"),
        ("turns: [{tool_call: calculate}]\n", "turn 1: tool_call must be a mapping with a name"),
        (
            "turns: [{text: a}, {tool_calls: [{arguments: {}}]}]\n",
            "turn 2: tool_calls must be a list of mappings with a name",
        ),
        ("turns: [{emit_state: [1]}]\n", "turn 1: emit_state must be a mapping"),
        ("turns: [{text: a, usage: 700}]\n", "turn 1: usage must be a mapping like {input_tokens: 7000}"),
        ("- text: a\n", "a script must be a mapping with 'turns:'"),
    ],
)
def test_a_malformed_script_is_a_clear_error_at_start(tmp_path, script, expected):
    write(tmp_path, "s.yaml", script)
    agents = agents_from(tmp_path, "agents:\n  a: {model: scripted/s.yaml}\n")
    with pytest.raises(SpecError) as info:
        runtime(tmp_path).start("a", agents=agents)
    assert expected in str(info.value)
    assert str(info.value).startswith(str(tmp_path / "s.yaml"))


def test_a_missing_prompt_file_given_in_defaults_is_reported_in_defaults(tmp_path, monkeypatch):
    msg = load_error(tmp_path, monkeypatch, "defaults:\n  system_prompt_file: nope.md\nagents:\n  a: {model: m}\n")
    assert msg.startswith("agents.yaml:2:23: defaults.system_prompt_file: system prompt file 'nope.md' does not exist")
    assert msg.endswith("(applies to agent 'a')")


def test_the_declared_capabilities_and_the_resolved_ones_have_the_same_fields() -> None:
    """spec.Capabilities (what a definition may declare, each optional) and
    providers.base.Capabilities (what the registry resolves) differ on purpose, but a field
    added to one and not the other would be silently ignored: their fields must not drift."""
    import dataclasses

    from loomrt.providers.base import Capabilities as Resolved
    from loomrt.spec import Capabilities as Declared

    assert list(Declared.model_fields) == [f.name for f in dataclasses.fields(Resolved)]


def test_a_yaml_alias_bomb_is_refused_at_once_naming_an_alias() -> None:
    import time

    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(8):
        prev, name = chr(97 + i), chr(98 + i)
        rows.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    text = "\n".join(rows) + "\nagents:\n  x:\n    description: hi\n"
    started = time.perf_counter()
    with pytest.raises(SpecError, match=r"aliases expand to more than 100,000 nodes \(alias \*\w"):
        load_agents_text(text)
    assert time.perf_counter() - started < 5  # it was 21 s and 1.5 GB for a 418-byte file


def test_a_file_with_a_few_aliases_still_loads() -> None:
    text = "agents:\n  x: &d\n    model: local/smollm2-135m\n    max_tokens: 64\n  y:\n    <<: *d\n    max_tokens: 32\n"
    agents = load_agents_text(text)
    assert agents.agents["x"].max_tokens == 64 and agents.agents["y"].max_tokens == 32


def test_a_5000_digit_number_is_one_clear_error_with_its_line() -> None:
    with pytest.raises(SpecError, match="too large to read") as err:
        load_agents_text("agents:\n  x:\n    max_tokens: " + "9" * 5000 + "\n")
    assert ":3" in str(err.value)
