"""The litellm gateway: every model call, hosted or embedded, goes through ``litellm.acompletion``.

A :class:`LiteLLMProvider` serves one model string. From YAML::

    model: openai/gpt-4o-mini       # any litellm model string
    api_key_env: OPENAI_API_KEY     # the variable holding the key (never the key itself)
    api_base: http://10.0.0.5:8000  # optional: a self-hosted or proxied endpoint
    timeout_s: 60                   # one call's limit
    retries: 3                      # on 429, 5xx, timeouts and connection errors

What it does on each call:

- **tools**: a model with native tool calling gets them as OpenAI-style tools; a model
  without (every ``local`` model, unless declared otherwise) gets the grammar-constrained
  JSON decision of :mod:`loomrt.providers.decisions`, translated back into tool calls.
- **errors** become :class:`~loomrt.errors.ProviderError`: rate limits (429), 5xx, timeouts
  and connection errors are retryable; everything else (a bad key, an unknown model, a
  context overflow) is permanent, with the provider's message and what to do.
- **malformed tool calls** (arguments that are not a JSON object) are retryable: a
  fresh sample almost always fixes them, and each retry is an event on the record.
- **usage**: prompt, completion and cached prompt tokens (``prompt_tokens_details.cached_tokens``
  where the provider reports them).
- **streaming**: a request with ``on_text`` (a turn watched by a chat) streams the answer:
  a hosted model through litellm's stream, reassembled into the same reply; the embedded
  model through :data:`~loomrt.providers.local.STREAM_TO`, its call otherwise unchanged. A
  decision (JSON) is never streamed, and neither is an answer that starts as one.
- **the request guard**: with ``LOOMRT_ALLOW_MODEL_REQUESTS=0`` (the test suite sets it), a
  model that does not run locally is refused before any request is made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loomrt.errors import ProviderError, SpecError
from loomrt.messages import ToolCall
from loomrt.providers.base import STOPPED_BY_CALLER, Capabilities, ModelRequest, ModelResponse, Usage
from loomrt.providers.decisions import (
    ANSWER,
    ANSWER_NOW,
    decision_instructions,
    decision_schema,
    parse_decision,
    parse_json_reply,
    plain_history,
    unwrap_answer,
)
from loomrt.providers.offline import import_litellm
from loomrt.providers.registry import capabilities_for, is_embedded, runs_locally

if TYPE_CHECKING:
    from loomrt.spec import AgentSpec

__all__ = ["LiteLLMProvider", "map_litellm_error", "requests_allowed", "alternating"]

_MIN_DECISION_TOKENS = 512
"""A JSON decision cut off by max_tokens is invalid even under a grammar: give it room."""


DEFAULT_TIMEOUT_S = 120.0
"""One call's limit on a hosted model when the definition sets no timeout_s."""

CUT_OFF_NOTE = "\n\n[The answer was cut off at max_tokens={max_tokens}; raise max_tokens in the agent definition for longer answers.]"


def requests_allowed() -> bool:
    """False when ``LOOMRT_ALLOW_MODEL_REQUESTS`` is 0/false/no (non-local models are refused)."""
    return os.environ.get("LOOMRT_ALLOW_MODEL_REQUESTS", "1").strip().lower() not in ("0", "false", "no", "off")


class LiteLLMProvider:
    """A :class:`~loomrt.providers.base.ModelProvider` for any model litellm can reach.

    ``litellm_params`` are passed to every ``litellm.acompletion`` call as they are (for
    example ``extra_headers``, or litellm's ``mock_response`` in tests).
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float | None = None,
        capabilities: Capabilities | None = None,
        litellm_params: Mapping[str, Any] | None = None,
    ):
        self.model = model
        self.api_base = api_base
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.capabilities = capabilities or capabilities_for(model, api_base=api_base)
        self.litellm_params = dict(litellm_params or {})
        self.embedded = is_embedded(model)
        self._prepared = False
        self._timeout_factor = 1.0
        if self.embedded:
            from loomrt.providers.models import get_model

            try:
                get_model(model)
            except ProviderError as exc:
                raise SpecError(exc.detail, path="model") from None

    @classmethod
    def from_spec(cls, spec: AgentSpec, *, model: str | None = None) -> LiteLLMProvider:
        """The provider for ``model`` (default: the agent's) with the agent's endpoint settings.

        A summarizer model that differs from the agent's own gets the registry's
        capabilities only (the declared ones describe the agent's model).
        """
        model = model or spec.model
        declared = spec.capabilities if model == spec.model else None
        return cls(
            model,
            api_base=spec.api_base,
            api_key_env=spec.api_key_env,
            timeout_s=spec.timeout_s,
            capabilities=capabilities_for(model, api_base=spec.api_base, declared=declared),
        )

    # ------------------------------------------------------------------ the call

    def call_timeout(self, request: ModelRequest) -> float:
        """Seconds one call may take: ``timeout_s`` when the definition sets it; else 120 s on
        a hosted model, and on a local model a limit that scales with the work asked for (CPU
        prefill and generation run at a few tokens a second on a busy machine): 60 s + 1 s per
        8 prompt tokens + 1 s per token asked for, at least 120 s. Times
        :meth:`raise_timeout`'s factor."""
        if self.timeout_s is not None:
            return self.timeout_s * self._timeout_factor
        if not self.capabilities.local:
            return DEFAULT_TIMEOUT_S * self._timeout_factor
        from loomrt.tokens import count_dicts

        scaled = 60 + count_dicts(request.messages) / 8 + request.max_tokens
        return max(DEFAULT_TIMEOUT_S, scaled) * self._timeout_factor

    def raise_timeout(self) -> float:
        """Double the timeout of later calls (a local model's one retry after a timeout)."""
        self._timeout_factor *= 2
        return self._timeout_factor

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One call through ``litellm.acompletion``; see the module docstring for what it does."""
        if self.embedded and not self._prepared:
            from loomrt.providers import local

            # assembling and hashing the GGUF takes seconds the first time: off the event loop
            await asyncio.to_thread(local.prepare, self.model)
            self._prepared = True
        shape = self._shape(request)
        if shape == "decision" and request.tool_choice != "required":
            if self.embedded and self.capabilities.one_call_turns:
                return await self._decide_or_answer(request)
            return await self._decide_then_answer(request)
        if shape in ("decision", "json") and request.max_tokens < _MIN_DECISION_TOKENS:
            request = dataclasses.replace(request, max_tokens=_MIN_DECISION_TOKENS)
        streams = shape in ("text", "tools") and request.purpose == "turn"
        raw = await self._acompletion(
            self._kwargs(request, shape),
            request.on_text if streams else None,
            stop_when=request.stop_when,
            reply_prefix=request.reply_prefix if shape == "text" else "",
        )
        return self._response(raw, request, shape)

    async def prefill(self, request: ModelRequest) -> int:
        """Read ``request``'s prompt, as :meth:`complete` would send it, into the embedded
        model's prefix cache, ahead of the call that will send it with more at its end (a
        chat's next turn after a distillation made between turns, while the user types).
        Tokens read; 0 for any other model (a server keeps its own cache), or while the
        model is busy."""
        if not self.embedded:
            return 0
        from loomrt.providers import local

        shape = self._shape(request)
        if shape == "decision" and request.tool_choice != "required":
            one_call = self.capabilities.one_call_turns
            kwargs = self._kwargs(request, "one_call") if one_call else self._kwargs(request, shape, answer_text=False)
        else:
            kwargs = self._kwargs(request, shape)
        return await asyncio.to_thread(local.prefill, self.model, kwargs["messages"], kwargs.get("n_ctx"))

    async def _acompletion(
        self,
        kwargs: dict[str, Any],
        on_text: Callable[[str], None] | None = None,
        *,
        stop_when: Callable[[str], bool] | None = None,
        reply_prefix: str = "",
    ) -> Any:
        """One litellm call; with ``on_text``, its text streams there as it is written; with
        ``stop_when`` (the embedded model only), it stops where that holds; with
        ``reply_prefix`` (the embedded model only), the reply begins with it."""
        litellm = import_litellm()
        try:
            if on_text is None and (not self.embedded or (stop_when is None and not reply_prefix)):
                return await litellm.acompletion(**kwargs)
            if self.embedded:
                from loomrt.providers import local

                tokens = (
                    local.STREAM_TO.set(on_text),
                    local.STOP_WHEN.set(stop_when),
                    local.REPLY_PREFIX.set(reply_prefix),
                )
                try:
                    return await litellm.acompletion(**kwargs)
                finally:
                    local.REPLY_PREFIX.reset(tokens[2])
                    local.STOP_WHEN.reset(tokens[1])
                    local.STREAM_TO.reset(tokens[0])
            assert on_text is not None
            if not self._streams_usage(litellm):  # the record's usage must be the provider's, not an estimate
                return await litellm.acompletion(**kwargs)
            return await self._streamed(litellm, kwargs, on_text)
        except ProviderError:
            raise
        except Exception as exc:  # noqa: BLE001 - every litellm failure becomes a ProviderError
            raise map_litellm_error(exc, self.model) from exc

    def _streams_usage(self, litellm: Any) -> bool:
        """Whether a stream from this model reports its usage (``stream_options``): a hosted
        model that cannot is called without streaming, so its recorded usage is the same."""
        try:
            return "stream_options" in (litellm.get_supported_openai_params(model=self.model) or [])
        except Exception:  # noqa: BLE001 - a model litellm cannot place
            return False

    async def _streamed(self, litellm: Any, kwargs: dict[str, Any], on_text: Callable[[str], None]) -> Any:
        """A hosted model's streamed call, reassembled into the reply a plain call gives
        (usage included where the provider reports it in the stream)."""
        extra: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
        chunks = []
        async for chunk in await litellm.acompletion(**kwargs, **extra):
            chunks.append(chunk)
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is not None and delta.content:
                on_text(delta.content)
        built = litellm.stream_chunk_builder(chunks, messages=kwargs["messages"])
        if built is None:  # a stream that sent nothing
            raise ProviderError(f"{self.model}: the streamed reply was empty", retryable=True)
        return built

    async def _decide_then_answer(self, request: ModelRequest) -> ModelResponse:
        """Tools without native tool calling, and the model may answer: first a short
        constrained decision (a tool call, or ``{"action": "answer"}``), then, for an
        answer, the answer as free text under the request's own max_tokens, so that a long
        answer never has to fit inside a JSON string."""
        decide = dataclasses.replace(request, max_tokens=max(request.max_tokens, _MIN_DECISION_TOKENS))
        raw = await self._acompletion(self._kwargs(decide, "decision", answer_text=False))
        choice = raw.choices[0]
        text, finish = choice.message.content or "", choice.finish_reason
        value = parse_json_reply(text, model=self.model, finish_reason=finish, max_tokens=decide.max_tokens)
        usage = _usage(getattr(raw, "usage", None))
        if not (isinstance(value, dict) and value.get("action") == ANSWER):
            _, calls = parse_decision(text, decide, model=self.model, finish_reason=finish)
            return ModelResponse(text="", tool_calls=calls, usage=usage, model=self.model, finish_reason="tool_calls")
        if isinstance(value.get("text"), str) and value["text"].strip():  # a model that wrote its answer anyway
            return ModelResponse(text=value["text"], usage=usage, model=self.model, finish_reason="stop")
        stream = _UnlessDecision(request.on_text) if request.on_text else None
        answer = await self._acompletion(self._kwargs(request, "answer", decided=text), stream)
        response = self._response(answer, dataclasses.replace(request, tools=()), "text")
        usage += response.usage
        written = unwrap_answer(response.text)
        if written is None:  # the model wrote its decision again (a very small one may): ask without the tools
            bare = dataclasses.replace(request, tools=())
            raw = await self._acompletion(self._kwargs(bare, "text"), request.on_text)
            response = self._response(raw, bare, "text")
            usage, written = usage + response.usage, response.text
        return dataclasses.replace(response, text=written, usage=usage)

    async def _decide_or_answer(self, request: ModelRequest) -> ModelResponse:
        """Tools without native tool calling, in one generation: a grammar lets the embedded
        model open a tool-call JSON object or write the answer as text, which streams from
        its first token (``one_call_turns``). The call has the answer's own max_tokens; a tool
        call cut off by it is decided again by the two-step path, whose decision has room."""
        stream = _UnlessDecision(request.on_text) if request.on_text else None
        raw = await self._acompletion(self._kwargs(request, "one_call"), stream)
        choice = raw.choices[0]
        text, finish = choice.message.content or "", choice.finish_reason
        usage = _usage(getattr(raw, "usage", None))
        if text.startswith("{"):  # the grammar's tool-call branch (an answer may not start with "{")
            if finish == "length":
                again = await self._decide_then_answer(request)
                return dataclasses.replace(again, usage=usage + again.usage)
            _, calls = parse_decision(text, request, model=self.model, finish_reason=finish)
            return ModelResponse(text="", tool_calls=calls, usage=usage, model=self.model, finish_reason="tool_calls")
        if finish == "length":  # as a text answer cut off says so (the note is not streamed)
            text = text.rstrip() + CUT_OFF_NOTE.format(max_tokens=request.max_tokens)
        return ModelResponse(text=text.strip(), usage=usage, model=self.model, finish_reason=finish or "stop")

    def _shape(self, request: ModelRequest) -> str:
        """How this call asks: ``decision`` (constrained JSON for tools), ``tools`` (native),
        ``json`` (a reply that follows ``response_schema``) or ``text``."""
        if request.purpose != "turn":  # recaps and summaries are prose; an extraction asks for JSON
            return "json" if request.response_schema is not None and self.capabilities.structured_output else "text"
        if request.tools:
            return "tools" if self.capabilities.tool_calling else "decision"
        if request.response_schema is not None and self.capabilities.structured_output:
            return "json"
        return "text"

    def _kwargs(
        self, request: ModelRequest, shape: str, *, answer_text: bool = True, decided: str = ""
    ) -> dict[str, Any]:
        """litellm's arguments; ``answer_text=False`` asks a decision for no answer text
        (the answer is written afterwards, see :meth:`_decide_then_answer`). Shape
        ``answer`` is that answer: the decision's prompt as it was, then the decision the
        model wrote (``decided``) and a request for the answer as text, so the model's
        prefix cache holds all of it but the last line (prefix reuse by construction)."""
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "timeout": self.call_timeout(request),
            "num_retries": 0,  # retries are loomrt's, so each one is an event on the record
            **self._endpoint(),
        }
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if not self.capabilities.tool_calling:  # such chat templates rarely know the tool role
            kwargs["messages"] = plain_history(request.messages)
        else:
            kwargs["messages"] = alternating(request.messages)
        if shape == "answer":
            instructions = decision_instructions(request.tools, required=False, answer_text=False)
            asked = [*request.messages, {"role": "assistant", "content": decided}, ANSWER_NOW]
            kwargs["messages"] = plain_history(asked, instructions)
        elif shape == "one_call":
            instructions = decision_instructions(request.tools, required=False, one_call=True)
            kwargs["messages"] = plain_history(request.messages, instructions)
            kwargs["response_format"] = {
                "type": "tool_or_text",
                "schema": decision_schema(request.tools, required=True),
            }
        elif shape == "decision":
            required = request.tool_choice == "required"
            instructions = decision_instructions(request.tools, required=required, answer_text=answer_text)
            kwargs["messages"] = plain_history(request.messages, instructions)
            if self.capabilities.structured_output:  # else the instructions alone ask for the JSON
                schema = decision_schema(request.tools, required=required, answer_text=answer_text)
                kwargs["response_format"] = _json_format(schema, self.embedded)
        elif shape == "tools":
            kwargs["tools"] = [t.to_litellm() for t in request.tools]
            kwargs["tool_choice"] = request.tool_choice
        elif shape == "json":
            kwargs["response_format"] = _json_format(request.response_schema or {}, self.embedded)
        kwargs.update(self.litellm_params)
        return kwargs

    def _endpoint(self) -> dict[str, Any]:
        if self.embedded:
            from loomrt.providers import local

            local.prepare(self.model)  # a clear, permanent error for missing packages or a bad sha256
            local.register()
            return {"n_ctx": self.capabilities.context_window}
        mocked = "mock_response" in self.litellm_params or "mock_tool_calls" in self.litellm_params
        if not mocked and not requests_allowed() and not runs_locally(self.model, self.api_base):
            raise ProviderError(
                f"{self.model}: model requests are disabled (LOOMRT_ALLOW_MODEL_REQUESTS=0) and this "
                "model does not run locally. Use a local/ or scripted/ model, or unset the variable.",
                retryable=False,
            )
        out: dict[str, Any] = {}
        if self.api_base:
            out["api_base"] = self.api_base
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise ProviderError(
                    f"{self.model}: the environment variable {self.api_key_env} (api_key_env) is not set. "
                    f"Export it with your API key: export {self.api_key_env}=...",
                    retryable=False,
                )
            out["api_key"] = key
        elif not mocked and not self.api_base and not runs_locally(self.model, self.api_base):
            # a key the provider needs and nobody set is a configuration error: said once, not retried
            try:
                missing = import_litellm().validate_environment(self.model).get("missing_keys") or []
            except Exception:  # noqa: BLE001 - a model litellm cannot place: the call says why
                missing = []
            keys = [k for k in missing if k.endswith(("_KEY", "_TOKEN"))]
            if keys:
                raise ProviderError(
                    f"{self.model}: no API key: the environment variable {keys[0]} is not set. Export it "
                    f"(export {keys[0]}=...), or name the variable that holds the key with api_key_env "
                    "in the agent definition.",
                    retryable=False,
                )
        return out

    # ------------------------------------------------------------------ the reply

    def _response(self, raw: Any, request: ModelRequest, shape: str) -> ModelResponse:
        choice = raw.choices[0]
        text, finish = choice.message.content or "", choice.finish_reason
        calls: tuple[ToolCall, ...] = ()
        if shape == "decision":
            text, calls = parse_decision(text, request, model=self.model, finish_reason=finish)
        elif shape == "json" and finish != STOPPED_BY_CALLER:  # a stopped reply is the caller's to read
            parse_json_reply(text, model=self.model, finish_reason=finish, max_tokens=request.max_tokens)
        else:
            calls = tuple(_tool_call(tc, self.model) for tc in (choice.message.tool_calls or ()))
            if shape == "text" and finish == "length" and request.purpose == "turn":
                text = text.rstrip() + CUT_OFF_NOTE.format(max_tokens=request.max_tokens)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=_usage(getattr(raw, "usage", None)),
            model=getattr(raw, "model", None) or self.model,
            finish_reason="tool_calls" if calls else finish,
        )


class _UnlessDecision:
    """``on_text`` for an answer call, less a reply that starts as JSON: a model that writes
    its decision again (:func:`~loomrt.providers.decisions.unwrap_answer`) is not shown."""

    def __init__(self, on_text: Callable[[str], None]):
        self.on_text, self.held, self.passing = on_text, "", False

    def __call__(self, piece: str) -> None:
        if self.passing:
            self.on_text(piece)
            return
        self.held += piece
        start = self.held.lstrip()
        if start and not start.startswith("{"):  # text: what was held, then every later piece
            self.passing = True
            self.on_text(self.held)


def alternating(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with roles alternating: adjacent user messages (the pinned task and a
    recap block, say) are joined into one, and so are adjacent plain assistant messages,
    since strict chat templates refuse two of a role in a row. Tool pairs are untouched."""
    out: list[dict[str, Any]] = []
    for m in messages:
        prev = out[-1] if out else None
        mergeable = m.get("role") in ("user", "assistant") and not m.get("tool_calls")
        if prev is not None and mergeable and prev.get("role") == m["role"] and not prev.get("tool_calls"):
            joined = "\n\n".join(x for x in (prev.get("content") or "", m.get("content") or "") if x)
            out[-1] = {**prev, "content": joined}
        else:
            out.append(dict(m))  # a copy: litellm may change what it is given
    return out


def _json_format(schema: dict[str, Any], embedded: bool) -> dict[str, Any]:
    if embedded:  # llama-cpp-python's form: the schema becomes a grammar
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}


def _tool_call(tc: Any, model: str) -> ToolCall:
    fn = tc.function
    raw = fn.arguments
    try:
        args = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
    except (ValueError, RecursionError) as exc:
        raise ProviderError(
            f"{model}: the model sent malformed JSON arguments for tool {fn.name!r} ({exc}): {str(raw)[:200]!r}",
            retryable=True,
        ) from None
    if not isinstance(args, dict):
        raise ProviderError(
            f"{model}: the arguments for tool {fn.name!r} are not a JSON object: {str(raw)[:200]!r}", retryable=True
        )
    return ToolCall(id=tc.id or f"call_{fn.name}", name=fn.name, arguments=args)


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    if cached is None:  # Anthropic's name for prompt-cache reads
        cached = getattr(usage, "cache_read_input_tokens", None)
    return Usage(
        input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cached_tokens=int(cached or 0),
    )


_PREFIX = re.compile(r"^litellm\.\w+:\s*(\w+Exception - )?")


def map_litellm_error(exc: BaseException, model: str) -> ProviderError:
    """The :class:`ProviderError` for an exception litellm raised.

    Retryable: rate limits (429), timeouts, connection errors, 5xx. Permanent: the rest,
    each with a hint where one helps.
    """
    litellm = import_litellm()
    status = getattr(exc, "status_code", None)
    detail = _PREFIX.sub("", str(getattr(exc, "message", None) or exc)).strip() or type(exc).__name__
    if isinstance(exc, litellm.RateLimitError):
        return ProviderError(f"{model}: rate limited (429): {detail}", status=429, retryable=True)
    if isinstance(exc, litellm.Timeout):
        return ProviderError(f"{model}: the call timed out: {detail}", status=408, retryable=True)
    if isinstance(exc, litellm.ContextWindowExceededError):
        return ProviderError(
            f"{model}: the prompt does not fit the model's context window: {detail}. "
            "Lower context.budget_tokens, or declare capabilities.context_window.",
            status=400,
        )
    if isinstance(exc, litellm.AuthenticationError):
        return ProviderError(
            f"{model}: authentication failed (401): {detail}. Check the API key (api_key_env).", status=401
        )
    if isinstance(exc, litellm.NotFoundError):
        return ProviderError(f"{model}: not found (404): {detail}. Check the model name and api_base.", status=404)
    if isinstance(exc, litellm.APIConnectionError):
        return ProviderError(f"{model}: could not reach the provider: {detail}", status=status, retryable=True)
    if isinstance(status, int) and status >= 500:
        return ProviderError(f"{model}: provider error ({status}): {detail}", status=status, retryable=True)
    if isinstance(status, int):
        return ProviderError(f"{model}: the provider refused the request ({status}): {detail}", status=status)
    return ProviderError(f"{model}: {type(exc).__name__}: {detail}")
