"""Retries with exponential backoff and jitter on 429, 5xx and timeouts.

The base delay is 0.5 s unless ``LOOMRT_RETRY_BASE_S`` says otherwise (the test suite sets
it to 0.001); the delay before retry *n* is uniform in ``[0, min(20 s, base * 2**(n-1))]``
("full jitter"). Every retry is reported to ``on_retry`` before the sleep, which the run
loop records as a ``retry`` event, so the record shows every attempt.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable

from loomrt.errors import ProviderError
from loomrt.providers.base import ModelProvider, ModelRequest, ModelResponse, malformed_call

__all__ = ["call_with_retries", "backoff_delay", "default_base_delay"]

BASE_DELAY_S = 0.5
MAX_DELAY_S = 20.0


def default_base_delay() -> float:
    """The base backoff delay: ``$LOOMRT_RETRY_BASE_S``, else :data:`BASE_DELAY_S`."""
    raw = os.environ.get("LOOMRT_RETRY_BASE_S")
    try:
        return max(0.0, float(raw)) if raw else BASE_DELAY_S
    except ValueError:
        return BASE_DELAY_S


def backoff_delay(attempt: int, *, base: float = BASE_DELAY_S, cap: float = MAX_DELAY_S) -> float:
    """Full-jitter exponential backoff for retry number ``attempt`` (1-based)."""
    return random.uniform(0, min(cap, base * 2 ** (attempt - 1)))


async def call_with_retries(
    provider: ModelProvider,
    request: ModelRequest,
    *,
    retries: int,
    on_retry: Callable[[int, Exception, float], None] | None = None,
    base_delay: float | None = None,
) -> ModelResponse:
    """Call ``provider``; retry retryable :class:`ProviderError` up to ``retries`` times.

    ``on_retry(attempt, error, delay)`` is told of each retry before it sleeps. A
    permanent error, or the last retryable one, is raised.
    """
    attempt = 0
    local_timeouts = 0
    while True:
        try:
            response = await provider.complete(request)
            for call in response.tool_calls:  # checked before anything records them
                wrong = malformed_call(call)
                if wrong is not None:
                    raise ProviderError(f"{provider.model}: a malformed reply: {wrong}", retryable=True)
            return response
        except ProviderError as exc:
            if exc.status == 408 and provider.capabilities.local:
                # a local model that timed out is retried once, with its timeout raised, never in a loop
                if local_timeouts or attempt >= retries:
                    raise ProviderError(
                        f"{exc.detail} (a local model is retried once after a timeout, with the timeout raised; "
                        "it timed out again). Raise timeout_s in the agent definition, or lower max_tokens.",
                        status=408,
                    ) from exc
                local_timeouts += 1
                attempt += 1
                raise_timeout = getattr(provider, "raise_timeout", None)
                factor = raise_timeout() if callable(raise_timeout) else None
                note = f"; retrying once with the timeout raised ×{factor:g}" if factor else "; retrying once"
                if on_retry:
                    on_retry(attempt, ProviderError(exc.detail + note, status=408, retryable=True), 0.0)
                continue
            if not exc.retryable or attempt >= retries:
                if exc.retryable:
                    raise ProviderError(
                        f"{exc.detail} (gave up after {attempt + 1} attempts)", status=exc.status
                    ) from exc
                raise
            attempt += 1
            delay = backoff_delay(attempt, base=default_base_delay() if base_delay is None else base_delay)
            if on_retry:
                on_retry(attempt, exc, delay)
            await asyncio.sleep(delay)
