"""Calling the model from a run: retries recorded as events, usage added to the totals."""

from __future__ import annotations

import time
from typing import Any

from loomrt.audit import prompt_hash
from loomrt.crashpoints import reached
from loomrt.messages import Message
from loomrt.providers.base import ModelProvider, ModelRequest, ModelResponse, Purpose, ToolSchema
from loomrt.providers.retry import call_with_retries
from loomrt.run.state import RunState

__all__ = ["call_model"]


async def call_model(
    run: RunState,
    messages: list[Message],
    *,
    purpose: Purpose = "turn",
    tools: tuple[ToolSchema, ...] = (),
    response_schema: dict[str, Any] | None = None,
    tool_choice: str = "auto",
    provider: ModelProvider | None = None,
    max_tokens: int | None = None,
) -> ModelResponse:
    """One model call on behalf of ``run``, recorded as a ``model_call`` event."""
    provider = provider or run.provider
    request = ModelRequest(
        # the working context's wire form is kept by the view; other prompts are built here
        messages=list(run.view.wire) if messages is run.context else [m.to_litellm() for m in messages],
        tools=tools,
        max_tokens=max_tokens or run.spec.max_tokens,
        temperature=run.spec.temperature,
        purpose=purpose,
        response_schema=response_schema,
        tool_choice=tool_choice,  # type: ignore[arg-type]
    )

    def on_retry(attempt: int, error: Exception, delay: float) -> None:
        run.emit(
            "retry",
            {
                "attempt": attempt,
                "error": str(error),
                "delay_s": round(delay, 3),
                "status": getattr(error, "status", None),
                "purpose": purpose,
            },
        )

    # before the provider sees them; the working context's is kept by the view, step by step
    sent = run.view.prompt_hash() if messages is run.context else prompt_hash(request.messages)
    estimated = run.judged_estimate() if messages is run.context else None
    started = time.perf_counter()
    response = await call_with_retries(provider, request, retries=run.spec.retries, on_retry=on_retry)
    reached("model_answered")
    run.emit(
        "model_call",
        {  # recorded with what the loop makes of the answer, in one transaction
            "purpose": purpose,
            "model": response.model or provider.model,
            "usage": response.usage.to_dict(),
            "seconds": round(time.perf_counter() - started, 4),
            "finish_reason": response.finish_reason,
            "prompt_hash": sent,
            **({"prompt_from": "context"} if messages is run.context else {}),
            **({"estimated_tokens": estimated} if estimated is not None else {}),
        },
    )
    return response
