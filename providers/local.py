"""The embedded model: llama-cpp-python in this process, behind litellm as provider ``local``.

:func:`register` adds :class:`LocalLLM` (a litellm ``CustomLLM``) to
``litellm.custom_provider_map``, so ``litellm.acompletion(model="local/smollm2-135m", ...)``
runs the model in-process, with no server to start; the gateway sends every call there
like any other provider.

- One ``Llama`` per model file per process, created on first use and guarded by a lock
  (llama.cpp is not thread-safe). Async calls run in a worker thread.
- ``n_ctx`` comes from the call (the gateway passes the model's context window, which an
  agent may declare); a later call that needs more reloads the model, larger.
- ``response_format`` ``{"type": "json_object", "schema": ...}`` (or OpenAI's
  ``json_schema`` form) becomes a llama.cpp grammar: the reply cannot be anything else.
- The call's timeout is enforced between tokens, and a cancelled call stops generating.
- A call made while :data:`STREAM_TO` holds a callable streams its text there as it is
  generated (the gateway sets it for a turn's answer); the reply and its usage are the
  same as without.
- A call made while :data:`STOP_WHEN` holds a predicate stops as soon as the predicate
  holds for the text written so far (finish reason ``stop_when``): the harvest extractor
  stops a reply that has begun to repeat itself instead of paying for the loop.
- A call made while :data:`REPLY_PREFIX` holds text begins its reply with that text: the
  model writes on from it, and the reply's text starts with it.
- Usage reports prompt, completion and cached prompt tokens (the prefix llama.cpp
  reused from the previous call's KV cache).
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import importlib.util
import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from loomrt.errors import ProviderError
from loomrt.providers.base import STOPPED_BY_CALLER
from loomrt.providers.models import INSTALL_HINT, get_model, model_path
from loomrt.providers.offline import import_litellm

__all__ = [
    "register",
    "prepare",
    "generate",
    "load",
    "n_threads",
    "Generation",
    "LOCAL_PROVIDER",
    "LocalError",
    "grammar_for",
    "prefill",
    "STREAM_TO",
    "STOP_WHEN",
    "REPLY_PREFIX",
    "TOOL_OR_TEXT",
    "ToolOrText",
    "PREFILL_CHUNK",
]

LOCAL_PROVIDER = "local"
# Llama.create_chat_completion's defaults, so a reply matches what bare llama-cpp-python gives
_SAMPLING = {"top_p": 0.95, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.0}
_DEFAULT_TEMPERATURE = 0.2

STREAM_TO: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "loomrt_local_stream_to", default=None
)
"""Where the embedded model streams the text of the call made in this context (None: nowhere).
litellm's call stays a plain one, so the reply and its usage (cached tokens included) are
what they would be without streaming."""
STOP_WHEN: contextvars.ContextVar[Callable[[str], bool] | None] = contextvars.ContextVar(
    "loomrt_local_stop_when", default=None
)
"""What stops the call made in this context early: asked with the text written so far at
every token (None: only the usual stops)."""
REPLY_PREFIX: contextvars.ContextVar[str] = contextvars.ContextVar("loomrt_local_reply_prefix", default="")
"""The text the reply of the call made in this context begins with (prefilled after the
chat template's assistant header; the model writes on from it)."""


@dataclass
class _Loaded:
    path: str
    llama: Any
    n_ctx: int
    lock: threading.Lock
    formatter: Any
    wanted: threading.Event = field(default_factory=threading.Event)
    """Set while a call waits for the model: a read-ahead (:func:`prefill`) stops for it."""


@dataclass(frozen=True)
class Generation:
    """One completion of the embedded model."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class LocalError(Exception):
    """A failure of the embedded model, with the HTTP-like status litellm maps it by."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


_INSTANCES: dict[str, _Loaded] = {}
_LOAD_LOCK = threading.Lock()


@atexit.register
def _close_all() -> None:
    """Free the models before interpreter teardown (llama-cpp-python's own finaliser runs
    after its module globals are gone and prints a TypeError at exit)."""
    for loaded in list(_INSTANCES.values()):
        if loaded.llama is not None:
            loaded.llama.close()
            loaded.llama = None
    _INSTANCES.clear()


def _llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise ProviderError(
            f"the embedded model needs llama-cpp-python, which is not installed. Install it with: {INSTALL_HINT}"
        ) from None
    return llama_cpp


def prepare(model: str) -> Path:
    """Check that ``model`` can run here: llama-cpp-python present, the GGUF assembled and verified.

    Raises :class:`~loomrt.errors.ProviderError` (not retryable) with the install hint or
    the sha256 mismatch. Cheap after the first call (the verification is stamped).
    """
    if importlib.util.find_spec("llama_cpp") is None:
        _llama_cpp()
    return model_path(model)


def load(model: str, n_ctx: int | None = None) -> _Loaded:
    """The process's ``Llama`` for ``model`` with at least ``n_ctx`` tokens of context."""
    entry = get_model(model)
    n_ctx = min(n_ctx or entry.context_window, entry.trained_context)
    path = str(prepare(model))
    with _LOAD_LOCK:
        current = _INSTANCES.get(path)
        if current is not None and current.n_ctx >= n_ctx:
            return current
        llama_cpp = _llama_cpp()
        if current is not None:
            with current.lock:  # never pull a model from under a running call
                current.llama.close()
                current.llama = None  # a call still holding this entry gets a retryable error
        try:
            llama = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=n_threads(), verbose=False)
        except Exception as exc:  # noqa: BLE001 - llama.cpp reports load failures as ValueError/RuntimeError
            raise ProviderError(f"llama.cpp could not load {model} from {path}: {exc}") from exc
        loaded = _Loaded(path, llama, n_ctx, threading.Lock(), _formatter(llama_cpp, llama))
        _INSTANCES[path] = loaded
        return loaded


def n_threads() -> int:
    """llama.cpp's threads: ``$LOOMRT_LLAMA_THREADS``; else one per CPU that is not busy.

    On an idle machine that is every CPU. When other work already keeps CPUs busy (the
    1-minute load average), llama.cpp gets the rest, at least one: its threads spin while
    they wait for each other, so one thread too many is far slower than one too few
    (Qwen 1.5B on 2 busy cores: 1 tok/s with 2 threads, 10 tok/s with 1).
    """
    raw = os.environ.get("LOOMRT_LLAMA_THREADS", "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    cpus = os.cpu_count() or 1
    try:
        busy = int(os.getloadavg()[0])
    except OSError:  # no load average on this platform
        busy = 0
    return max(1, cpus - busy)


def _formatter(llama_cpp: Any, llama: Any) -> Any:
    template = llama.metadata.get("tokenizer.chat_template")
    if not template:
        raise ProviderError("the GGUF file has no chat template (tokenizer.chat_template)")
    eos_id, bos_id = llama.token_eos(), llama.token_bos()
    return llama_cpp.llama_chat_format.Jinja2ChatFormatter(
        template=template,
        eos_token=llama._model.token_get_text(eos_id) if eos_id != -1 else "",
        bos_token=llama._model.token_get_text(bos_id) if bos_id != -1 else "",
        stop_token_ids=[eos_id],
    )


@lru_cache(maxsize=64)
def _grammar(schema_json: str | None) -> Any:
    from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

    if schema_json is None:
        return LlamaGrammar.from_string(JSON_GBNF, verbose=False)
    return LlamaGrammar.from_json_schema(schema_json, verbose=False)


TOOL_OR_TEXT = "tool_or_text"
"""A ``response_format`` type of the embedded model only: a JSON object that follows
``schema`` (a tool call), or plain text that does not start with ``{`` (the answer)."""


@dataclass(frozen=True)
class ToolOrText:
    """The grammar of a one-call turn (:data:`TOOL_OR_TEXT`). Only the first token needs it:
    once that token is not ``{`` the grammar's answer branch allows any text, so
    :func:`generate` samples the rest without it. llama.cpp checks every token of the
    vocabulary against a grammar at every step (151,936 on Qwen2.5), which costs about as
    much as the decode itself."""

    grammar: Any


@lru_cache(maxsize=32)
def _tool_or_text(schema_json: str) -> Any:
    from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

    call = re.sub(r"^root ::=", "tool-call ::=", json_schema_to_gbnf(schema_json), count=1, flags=re.M)
    rules = f"root ::= tool-call | answer-text\nanswer-text ::= [^{{] [^\\x00]*\n{call}"
    return LlamaGrammar.from_string(rules, verbose=False)


def grammar_for(response_format: dict[str, Any] | None) -> Any:
    """The llama.cpp grammar for an OpenAI-style ``response_format`` (None: free text). An
    object's properties are written in the order the schema declares them (the converter
    keeps the order it is given: sorted keys once made every reply alphabetical)."""
    if not response_format or response_format.get("type") == "text":
        return None
    kind = response_format.get("type")
    if kind == TOOL_OR_TEXT:
        try:
            return ToolOrText(_tool_or_text(json.dumps(response_format.get("schema"))))
        except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions
            raise LocalError(400, f"cannot turn the tool-call schema into a grammar: {exc}") from exc
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
    elif kind == "json_object":
        schema = response_format.get("schema")
    else:
        raise LocalError(400, f"unsupported response_format type {kind!r}; use json_object or json_schema")
    try:
        return _grammar(json.dumps(schema) if schema is not None else None)
    except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions
        raise LocalError(400, f"cannot turn the JSON Schema into a grammar: {exc}") from exc


def generate(
    loaded: _Loaded,
    messages: list[dict[str, Any]],
    *,
    max_tokens: int,
    temperature: float | None = None,
    grammar: Any = None,
    deadline: float | None = None,
    cancel: threading.Event | None = None,
    on_text: Callable[[str], None] | None = None,
    stop_when: Callable[[str], bool] | None = None,
    reply_prefix: str = "",
) -> Generation:
    """One chat completion on ``loaded`` (blocking; call it from a worker thread).

    Stops early, raising :class:`LocalError` 408, when ``deadline`` (``time.monotonic``)
    passes or ``cancel`` is set. ``on_text`` hears the text as it is generated; its pieces
    join into the completion's text. ``stop_when``, asked with the text so far at every
    token, stops the generation where it holds (finish reason ``stop_when``).
    ``reply_prefix`` begins the reply: the model writes on from it, and the text (the one
    ``stop_when`` is asked with too) starts with it.
    """
    llama_cpp = _llama_cpp()
    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
    loaded.wanted.set()
    try:
        if not loaded.lock.acquire(timeout=-1 if remaining is None else remaining):
            raise LocalError(408, "timed out waiting for the embedded model (another call holds it)")
    finally:
        loaded.wanted.clear()
    try:
        llama = loaded.llama
        if llama is None:
            raise LocalError(503, "the embedded model was reloaded with a larger context; call again")
        try:
            formatted = loaded.formatter(messages=messages)
        except Exception as exc:  # noqa: BLE001 - jinja raises for messages the template rejects
            raise LocalError(400, f"the chat template rejected the messages: {exc}") from exc
        tokens = llama.tokenize(
            (formatted.prompt + reply_prefix).encode("utf-8"), add_bos=not formatted.added_special, special=True
        )
        if len(tokens) >= loaded.n_ctx:
            raise LocalError(
                400,
                (
                    f"the prompt is {len(tokens)} tokens and the context window (n_ctx) is {loaded.n_ctx}. "
                    "Lower context.budget_tokens, or declare a larger capabilities.context_window."
                ),
            )
        cached = llama_cpp.Llama.longest_token_prefix(llama._input_ids.tolist(), tokens[:-1])
        aborted: list[str] = []
        streamed = _Streamed(llama, tokens, on_text)
        lifts = isinstance(grammar, ToolOrText)
        first: list[int] = []  # a one-call turn's first token, once sampled (ToolOrText)
        answer: list[bool] = []  # it began the answer: the grammar's work is done
        rest: list[bool] = []  # sampling the rest of the answer, without the grammar
        stopped: list[bool] = []  # stop_when held

        def should_stop(input_ids: Any, logits: Any) -> bool:
            streamed.hear(input_ids)
            if cancel is not None and cancel.is_set():
                aborted.append("cancelled")
            elif deadline is not None and time.monotonic() > deadline:
                aborted.append("timed out")
            elif lifts and not first and len(input_ids) > len(tokens):
                first.extend(int(t) for t in input_ids[len(tokens) :])
                answer.append(_answer_begins(llama.detokenize(first, prev_tokens=tokens)))
            elif stop_when is not None and not stopped and len(input_ids) > len(tokens):
                written = llama.detokenize(list(input_ids[len(tokens) :]), prev_tokens=tokens)
                if stop_when(reply_prefix + written.decode("utf-8", errors="ignore")):
                    stopped.append(True)
            return bool(aborted) or bool(stopped) or (any(answer) and not rest)  # (llama.cpp asks again once stopped)

        criteria = llama_cpp.StoppingCriteriaList([should_stop, *(formatted.stopping_criteria or [])])
        sampling = {"temperature": _DEFAULT_TEMPERATURE if temperature is None else temperature, **_SAMPLING}
        out = llama.create_completion(
            prompt=tokens,
            max_tokens=max_tokens,
            stop=formatted.stop,
            stopping_criteria=criteria,
            grammar=grammar.grammar if lifts else grammar,
            **sampling,
        )
        choice, usage = out["choices"][0], out["usage"]
        text, finish, completion = choice["text"], choice.get("finish_reason") or "stop", usage["completion_tokens"]
        if any(answer) and not aborted:  # the answer began: the rest is free text
            if completion >= max_tokens:
                finish = "length"
            else:
                rest.append(True)
                more = llama.create_completion(
                    prompt=tokens + first,
                    max_tokens=max_tokens - completion,
                    stop=formatted.stop,
                    stopping_criteria=criteria,
                    **sampling,
                )
                text += more["choices"][0]["text"]
                finish = more["choices"][0].get("finish_reason") or "stop"
                completion += more["usage"]["completion_tokens"]
    finally:
        loaded.lock.release()
    if aborted:
        raise LocalError(408, f"the embedded model {aborted[0]} while generating")
    if stopped:
        finish = STOPPED_BY_CALLER
    streamed.end(text)
    return Generation(
        text=reply_prefix + text,
        finish_reason=finish,
        prompt_tokens=usage["prompt_tokens"],
        completion_tokens=completion,
        cached_tokens=cached,
    )


PREFILL_CHUNK = 32
"""Tokens a read-ahead evaluates between looks at whether a call wants the model (about
half a second on 2 cores for Qwen2.5-1.5B)."""


def prefill(model: str, messages: list[dict[str, Any]], n_ctx: int | None = None) -> int:
    """Read the prompt of ``messages`` into the model's prefix cache ahead of the call that
    will send them with more at the end (a chat's next turn after a distillation made
    between turns, while the user types), so that call prefills only what is new. Blocking;
    call it from a worker thread. Tokens read: 0 when they were cached already, or when a
    call holds the model. Stops at once when a call wants the model; what it read is kept."""
    loaded = load(model, n_ctx)
    if not loaded.lock.acquire(blocking=False):
        return 0  # a call has the model: it reads its own prompt
    try:
        llama = loaded.llama
        if llama is None:
            return 0
        formatted = loaded.formatter(messages=messages)
        tokens = llama.tokenize(formatted.prompt.encode("utf-8"), add_bos=not formatted.added_special, special=True)
        tokens = tokens[:-1]  # (a call reads its prompt's last token itself)
        if len(tokens) >= loaded.n_ctx:
            return 0
        cached: int = _llama_cpp().Llama.longest_token_prefix(llama._input_ids.tolist(), tokens)
        llama.n_tokens = cached  # what follows is overwritten from here (llama.eval drops it)
        for start in range(cached, len(tokens), PREFILL_CHUNK):
            if loaded.wanted.is_set():
                break
            llama.eval(tokens[start : start + PREFILL_CHUNK])
        return int(llama.n_tokens) - cached
    finally:
        loaded.lock.release()


def _answer_begins(said: bytes) -> bool:
    """Whether a one-call turn's first token took the grammar's answer branch: whole
    characters that do not open a JSON object (a token that ends inside a character keeps
    the grammar, so no character is ever split across the two generations)."""
    try:
        return bool(said) and not said.decode("utf-8").startswith("{")
    except UnicodeDecodeError:
        return False


class _Streamed:
    """The text of one generation, sent to ``on_text`` as it grows. llama.cpp tells a
    stopping criterion the tokens evaluated so far (each sampled token one step later), so
    the last piece is sent by :meth:`end`, from the completion's text; a piece that ends
    inside a multi-byte character waits for the rest of it."""

    def __init__(self, llama: Any, prompt: list[int], on_text: Callable[[str], None] | None):
        self.llama, self.prompt, self.on_text = llama, prompt, on_text
        self.sent = ""

    def hear(self, input_ids: Any) -> None:
        if self.on_text is None or len(input_ids) <= len(self.prompt):
            return
        raw = self.llama.detokenize(list(input_ids[len(self.prompt) :]), prev_tokens=self.prompt)
        self._send(raw.decode("utf-8", errors="ignore").rstrip("\ufffd"))

    def end(self, text: str) -> None:
        if self.on_text is not None:
            self._send(text)

    def _send(self, text: str) -> None:
        if text.startswith(self.sent) and len(text) > len(self.sent):
            piece, self.sent = text[len(self.sent) :], text
            assert self.on_text is not None
            self.on_text(piece)


def _handler_class() -> type:
    litellm = import_litellm()
    from litellm.llms.custom_llm import CustomLLM, CustomLLMError

    class LocalLLM(CustomLLM):
        """litellm's ``local`` provider: the embedded llama.cpp model."""

        def completion(self, model: str, messages: list[dict[str, Any]], *args: Any, **kw: Any) -> Any:
            call = self._prepare(model, messages, kw)
            return self._respond(kw["model_response"], model, self._run(call, None))

        async def acompletion(self, model: str, messages: list[dict[str, Any]], *args: Any, **kw: Any) -> Any:
            call = self._prepare(model, messages, kw)
            cancel = threading.Event()
            sink = STREAM_TO.get()
            if sink is not None:  # the pieces are heard on the event loop, in order
                loop = asyncio.get_running_loop()
                call["on_text"] = lambda piece: loop.call_soon_threadsafe(sink, piece)
            try:
                generation = await asyncio.to_thread(self._run, call, cancel)
            except asyncio.CancelledError:
                cancel.set()  # the worker stops at its next token
                raise
            return self._respond(kw["model_response"], model, generation)

        def _prepare(self, model: str, messages: list[dict[str, Any]], kw: dict[str, Any]) -> dict[str, Any]:
            params = dict(kw.get("optional_params") or {})
            name = f"{LOCAL_PROVIDER}/{model}"
            if params.get("tools"):
                raise CustomLLMError(
                    400,
                    (  # type: ignore[no-untyped-call]
                        f"{name} has no native tool calling; call it through loomrt's gateway "
                        "(LiteLLMProvider), which turns tools into a constrained JSON decision"
                    ),
                )
            timeout = kw.get("timeout")
            seconds = getattr(timeout, "read", timeout)
            try:
                grammar = grammar_for(params.get("response_format"))
            except LocalError as exc:
                raise CustomLLMError(exc.status, str(exc)) from None  # type: ignore[no-untyped-call]
            return {
                "name": name,
                "messages": messages,
                "n_ctx": params.get("n_ctx"),
                "max_tokens": int(params.get("max_tokens") or params.get("max_completion_tokens") or 512),
                "temperature": params.get("temperature"),
                "grammar": grammar,
                "deadline": time.monotonic() + float(seconds) if seconds else None,
                "on_text": STREAM_TO.get(),
                "stop_when": STOP_WHEN.get(),
                "reply_prefix": REPLY_PREFIX.get(),
            }

        def _run(self, call: dict[str, Any], cancel: threading.Event | None) -> Generation:
            try:
                loaded = load(call["name"], call["n_ctx"])
                return generate(
                    loaded,
                    call["messages"],
                    max_tokens=call["max_tokens"],
                    temperature=call["temperature"],
                    grammar=call["grammar"],
                    deadline=call["deadline"],
                    cancel=cancel,
                    on_text=call["on_text"],
                    stop_when=call["stop_when"],
                    reply_prefix=call["reply_prefix"],
                )
            except LocalError as exc:
                raise CustomLLMError(exc.status, str(exc)) from None  # type: ignore[no-untyped-call]
            except ProviderError as exc:
                raise CustomLLMError(400, exc.detail) from None  # type: ignore[no-untyped-call]

        def _respond(self, response: Any, model: str, g: Generation) -> Any:
            response.choices[0].message.content = g.text
            response.choices[0].finish_reason = g.finish_reason
            response.model = f"{LOCAL_PROVIDER}/{model}"
            response.usage = litellm.Usage(
                prompt_tokens=g.prompt_tokens,
                completion_tokens=g.completion_tokens,
                total_tokens=g.prompt_tokens + g.completion_tokens,
                prompt_tokens_details={"cached_tokens": g.cached_tokens},
            )
            return response

    return LocalLLM


_REGISTER_LOCK = threading.Lock()


def register() -> None:
    """Register the embedded model in litellm as provider ``local`` (idempotent)."""
    litellm = import_litellm()
    with _REGISTER_LOCK:
        if any(item.get("provider") == LOCAL_PROVIDER for item in litellm.custom_provider_map):
            return
        litellm.custom_provider_map = [  # type: ignore[attr-defined]
            *litellm.custom_provider_map,
            {"provider": LOCAL_PROVIDER, "custom_handler": _handler_class()()},
        ]
