"""Per-run overrides of an agent's ``context:`` block, which may narrow, never widen.

A client that spawns a run (over MCP, and a parent spawning a sub-agent) may adjust the
run's retention, field by field, on the run's own clone of the definition. It may not
grant more than the definition does:

- a numeric limit may only decrease (``budget_tokens``, ``keep_last_n``, ``recall_max_entries``, ...);
- ``recall``, ``harvest_to_memory``, ``propose_schema`` and ``model_pins`` may only be turned off;
- the definition's ``pins`` may not be changed;
- a model pin (``summarizer_model``) may only be removed;
- ``on_invalid_patch`` may only go from ``retry`` to ``fail``;
- ``mode``, ``keep_first`` and ``backstop`` (how retention works, not what it allows) may change;
- no ``state_schema`` may be supplied.

:func:`narrowed_context` checks an override and returns the merged block; a widening
field is a :class:`~loomrt.errors.SpecError` that names it.
"""

from __future__ import annotations

from typing import Any

from loomrt.errors import SpecError
from loomrt.run.projection import message_limit
from loomrt.spec import AgentSpec, ContextSpec

__all__ = ["narrowed_context", "OFF_ONLY", "FREE"]

OFF_ONLY = ("recall", "harvest_to_memory", "propose_schema", "model_pins")
"""Switches an override may turn off, never on."""
FREE = ("mode", "keep_first", "backstop")
"""Fields an override may set to any valid value."""


def narrowed_context(spec: AgentSpec, override: dict[str, Any] | None, *, where: str = "context") -> dict[str, Any]:
    """The run's ``context:`` block with ``override`` merged in, or SpecError naming the
    field (``where.FIELD``) that would widen what ``spec`` allows."""
    current = spec.context.model_dump()
    if not override:
        return current
    if not isinstance(override, dict):
        raise SpecError(f"must be an object of context fields, not {type(override).__name__}", path=where)
    for key, value in override.items():
        path = f"{where}.{key}"
        if key not in ContextSpec.model_fields:
            known = ", ".join(sorted(ContextSpec.model_fields))
            raise SpecError(f"unknown context field {key!r}. Known fields: {known}", path=path)
        _check(key, current[key], value, path, current)
    merged = {**current, **override}
    try:
        ContextSpec.model_validate(merged)
    except ValueError as exc:
        raise SpecError(f"the override makes an invalid context block: {_first_error(exc)}", path=where) from None
    return merged


def _check(key: str, was: Any, value: Any, path: str, current: dict[str, Any]) -> None:
    if key in FREE or value == was:
        return
    if key == "state_schema":
        raise SpecError("an override may not supply a state schema: the definition owns Σ's shape", path=path)
    if key == "pins":
        raise SpecError("an override may not change the definition's pins (its standing instructions)", path=path)
    if key in OFF_ONLY:
        if value is not False:
            raise SpecError(f"may only be turned off (the definition has {key}: {str(was).lower()})", path=path)
        return
    if key == "summarizer_model":
        if value is not None:
            raise SpecError("a model pin may only be removed (null), not changed", path=path)
        return
    if key == "on_invalid_patch":
        if value != "fail":
            raise SpecError("may only be narrowed from retry to fail", path=path)
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"must be a number, not {type(value).__name__}", path=path)
    limit = message_limit(current, current["budget_tokens"]) if key == "message_max_tokens" and was is None else was
    if value > limit:
        raise SpecError(f"may only decrease: {value} is above the definition's {limit}", path=path)


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        err = errors()[0]
        return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
    return str(exc)
