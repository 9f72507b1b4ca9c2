"""The run loop: one async core that plays one turn.

build the working context → call the model → record its answer and what the mode makes
of it (one transaction) → execute tool calls → check the budget → distil if needed →
repeat, until a final answer, max_iterations, or an error. Mode-specific behaviour lives
in the mode object (:mod:`.reducers`).
"""

from __future__ import annotations

import math

from loomrt.activity import Activity
from loomrt.crashpoints import reached
from loomrt.errors import LoomError, RunError, SpecError, StoreError
from loomrt.messages import ToolCall
from loomrt.run._model_calls import call_model
from loomrt.run.distil import maybe_distil
from loomrt.run.inject import inject_recall
from loomrt.run.state import CancelledElsewhere, RunState
from loomrt.run.steps import AskAgain, FinalOutput, RunTools
from loomrt.tools import CURRENT_CALL, Private

__all__ = ["play_turn", "add_user_input", "check_input", "INPUT_MAX_CHARS", "close_interrupted_calls", "execute_tool"]

INTERRUPTED = (
    "Error: the run stopped before this tool call returned, and it was resumed from the record. "
    "Whether the call took effect is unknown; check, or call it again if you still need it."
)


INPUT_MAX_CHARS = 1_000_000
"""The longest user input (a prompt) a run takes, in characters: about 250k tokens, more
than any context window loomrt targets. A longer one is refused before it is recorded."""


def check_input(content: object) -> None:
    """Raise SpecError unless ``content`` is a user input a run can take."""
    if not isinstance(content, str):
        raise SpecError(f"a prompt must be text, not {type(content).__name__}")
    if len(content) > INPUT_MAX_CHARS:
        raise SpecError(
            f"the prompt is {len(content):,} characters, over the limit of {INPUT_MAX_CHARS:,}. "
            "Put the material in a file and give the agent read_file, or split the task."
        )


async def add_user_input(run: RunState, content: str, *, said_at: float | None = None) -> None:
    """Record a user input; the first one (the task) is pinned when ``keep_first`` is on.
    ``said_at``: when the words were said (epoch seconds), for a history imported from elsewhere."""
    check_input(content)
    if said_at is not None and (
        isinstance(said_at, bool) or not (isinstance(said_at, int | float) and math.isfinite(said_at) and said_at >= 0)
    ):
        raise SpecError(f"said_at must be a time in epoch seconds, not {said_at!r}")
    await run.add("user_input", {"content": content, **({"said_at": float(said_at)} if said_at is not None else {})})


async def play_turn(run: RunState) -> str:
    """Play the model until it answers. Records ``final`` (one-shot) or ``parked`` (interactive).

    Raises :class:`RunError` after recording an ``error`` event.
    """
    try:
        await run.toolset.open_sources()  # MCP servers start on first use (and again, after one died)
        for _ in range(run.spec.max_iterations):
            if run.view.status == "cancelled":  # handed to this owner: its last write took the cancel in
                return run.output or ""
            await maybe_distil(run)
            injected = await inject_recall(run)  # the evicted words the turn needs, in this call's prompt only
            response = await call_model(
                run,
                run.context,
                injected=injected,
                tools=run.mode.offered_tools(run),
                response_schema=run.mode.response_schema(run),
                tool_choice=run.mode.tool_choice(run),
            )
            try:
                async with run.atomic(step=True):  # the answer, what the mode made of it, the turn's end: all or none
                    step = await run.mode.interpret(run, response)
                    if isinstance(step, FinalOutput):
                        if run.interactive:
                            await run.add("parked", {"output": step.output})
                        else:
                            await run.add("final", {"output": step.output, "state": run.state})
            except CancelledElsewhere:  # cancelled while the model thought: its answer is not played
                await run.flush()  # what the call cost is recorded all the same
                return run.output or ""
            match step:
                case FinalOutput(output=output):
                    return output
                case RunTools(calls=calls):
                    for call in calls:
                        await execute_tool(run, call)
                case AskAgain():
                    pass
        raise RunError(
            f"reached max_iterations ({run.spec.max_iterations}) without a final answer. "
            "Raise max_iterations in the agent definition, or give a narrower task.",
            run_id=run.run_id,
        )
    except LoomError as exc:
        if type(exc) is StoreError:  # the record itself could not be read or written (a database restart):
            raise  # not the run's failure; it stays where its record is, for its worker to resume
        if isinstance(exc, RunError):
            exc.run_id = exc.run_id or run.run_id
            exc.last_seq = run.last_seq
        await run.add("error", {"message": str(exc), "type": type(exc).__name__})
        raise
    except Exception as exc:  # a bug in a tool, a provider or loomrt: the run ends with a clear error
        error = RunError(
            f"unexpected {type(exc).__name__}: {exc}. This is a bug in a tool, a provider or loomrt; "
            f"the record keeps everything up to here (`loomrt runs events {run.run_id}`).",
            run_id=run.run_id,
            last_seq=run.last_seq,
        )
        await run.add("error", {"message": str(error), "type": type(exc).__name__})
        raise error from exc


async def close_interrupted_calls(run: RunState) -> None:
    """Settle every tool call of the last assistant message that has no result.

    A call whose ``tool_call`` event is recorded was running when the run stopped (a crash,
    Ctrl-C): it may have acted, so it is not run again; it gets an error result that says
    so. A call that was never started (the run stopped between the answer and the tool) is
    run now: otherwise the model would be sent a malformed conversation.
    """
    last = next((i for i in range(len(run.context) - 1, -1, -1) if run.context[i].role != "tool"), None)
    if last is None or run.context[last].role != "assistant":
        return
    answered = {m.tool_call_id for m in run.context[last + 1 :]}
    pending = await run.mode.unanswered_calls(run, [c for c in run.context[last].tool_calls if c.id not in answered])
    if not pending:
        return
    started = {e.data.get("id") for e in await run.store.read(run.run_id, kinds=["tool_call"])}
    for call in pending:
        tool = run.toolset.tools.get(call.name)
        if call.id in started and tool is not None and tool.resumable:
            await execute_tool(run, call, again=True)  # it reconciles what it did from the record
        elif call.id in started:
            await run.add(
                "tool_result", {"tool_call_id": call.id, "name": call.name, "content": INTERRUPTED, "is_error": True}
            )
        else:
            await execute_tool(run, call)


async def execute_tool(run: RunState, call: ToolCall, *, again: bool = False) -> None:
    """Run one tool call and append its result. A failing or unknown tool is a result, not a crash.
    ``again``: the call was started before a crash (its ``tool_call`` is recorded already)."""
    if not again:
        await run.add("tool_call", call.to_dict())
    run.show(Activity(run.run_id, "calling", tool=call.name))
    tool = run.toolset.tools.get(call.name)
    if tool is None and run.toolset.sources:  # a resumed run settles its calls before its first model call
        await run.toolset.open_sources()
        tool = run.toolset.tools.get(call.name)
    private = tool is not None and tool.private
    if tool is None:
        content = f"Error: no tool named {call.name!r}. Available: {', '.join(sorted(run.toolset.tools)) or 'none'}."
        is_error = True
    else:
        token = CURRENT_CALL.set(call.id)
        try:
            reached("in_tool")
            content, is_error = await tool.call(call.arguments), False
            private = private or isinstance(content, Private)
        except Exception as exc:  # noqa: BLE001 - the model sees the error and can recover
            content, is_error = f"Error: {type(exc).__name__}: {exc}", True
        finally:
            CURRENT_CALL.reset(token)
    await run.add(
        "tool_result",
        {
            "tool_call_id": call.id,
            "name": call.name,
            "content": str(content),
            "is_error": is_error,
            **({"private": True} if private else {}),
        },
    )
