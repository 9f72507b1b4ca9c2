"""Retries with exponential backoff and jitter on 429, 5xx and timeouts."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from loomrt.errors import ProviderError
from loomrt.providers.base import ModelProvider, ModelRequest, ModelResponse

__all__ = ["call_with_retries", "backoff_delay"]

BASE_DELAY_S = 0.5
MAX_DELAY_S = 20.0


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
    while True:
        try:
            return await provider.complete(request)
        except ProviderError as exc:
            if not exc.retryable or attempt >= retries:
                if exc.retryable:
                    raise ProviderError(
                        f"{exc.detail} (gave up after {attempt + 1} attempts)", status=exc.status
                    ) from exc
                raise
            attempt += 1
            delay = backoff_delay(attempt, base=BASE_DELAY_S if base_delay is None else base_delay)
            if on_retry:
                on_retry(attempt, exc, delay)
            await asyncio.sleep(delay)
