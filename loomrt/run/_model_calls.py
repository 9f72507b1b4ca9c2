"""Calling the model from a run: retries recorded as events, usage added to the totals."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loomrt.activity import Activity, AnswerText
from loomrt.crashpoints import reached
from loomrt.messages import Message
from loomrt.prompt_hash import prompt_hash
from loomrt.providers.base import ModelProvider, ModelRequest, ModelResponse, Purpose, ToolSchema
from loomrt.providers.retry import call_with_retries
from loomrt.run.state import RunState

if TYPE_CHECKING:
    from loomrt.run.inject import Injected

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
    injected: Injected | None = None,
    reply_prefix: str = "",
) -> ModelResponse:
    """One model call on behalf of ``run``, recorded as a ``model_call`` event.

    ``injected`` is a recalled block (:mod:`loomrt.run.inject`) sent with the working context
    (where :meth:`~loomrt.run.projection.RunView.injected_at` puts it), in this call's prompt
    only; the call records its ``recall_injected`` seq. A turn's call tells the run's watchers
    it thinks, and streams its answer to them where the provider streams. ``reply_prefix``
    is the text the reply begins with, where the provider can begin one (the embedded model)."""
    provider = provider or run.provider
    from_context = messages is run.context
    if not from_context:
        injected = None
    wire = list(run.view.wire) if from_context else [m.to_litellm() for m in messages]
    if injected is not None:
        wire.insert(run.view.injected_at(), injected.message.to_litellm())
    request = ModelRequest(
        # the working context's wire form is kept by the view; other prompts are built here
        messages=wire,
        tools=tools,
        max_tokens=max_tokens or run.spec.max_tokens,
        temperature=run.spec.temperature,
        purpose=purpose,
        response_schema=response_schema,
        tool_choice=tool_choice,  # type: ignore[arg-type]
        on_text=_streamer(run) if purpose == "turn" and run.watchers else None,
        reply_prefix=reply_prefix,
    )

    def on_retry(attempt: int, error: Exception, delay: float) -> None:
        run.show(Activity(run.run_id, "retrying", attempt=attempt))
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
    block = injected.message if injected is not None else None
    sent = run.view.prompt_hash(block) if from_context else prompt_hash(request.messages)
    estimated = run.judged_estimate() if from_context else None
    if estimated is not None and injected is not None:
        estimated += injected.tokens
    if purpose == "turn":
        run.show(Activity(run.run_id, "thinking"))
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
            **({"prompt_from": "context"} if from_context else {}),
            **({"recall_injected": injected.seq, "injected_tokens": injected.tokens} if injected is not None else {}),
            **({"estimated_tokens": estimated} if estimated is not None else {}),
        },
    )
    return response


def _streamer(run: RunState) -> Callable[[str], None]:
    """What a turn's model call streams its answer to: the run's watchers."""
    return lambda text: run.show(AnswerText(run.run_id, text))
