"""The public API: __all__ is complete and every name in it exists (httpx's test_exported_members)."""

from __future__ import annotations

import types

import loomrt


def test_all_is_complete_and_exists() -> None:
    exported = set(loomrt.__all__)
    public = {
        n
        for n in dir(loomrt)
        if not n.startswith("_") and not isinstance(getattr(loomrt, n), types.ModuleType) and n != "annotations"
    }
    assert public <= exported, f"public but not in __all__: {sorted(public - exported)}"
    assert all(hasattr(loomrt, n) for n in exported)


def _modules():
    import importlib
    import pkgutil

    # (loomrt.cli is left out: its public surface is the command line, docs/cli.md)
    for pkg_name in (
        "loomrt",
        "loomrt.providers",
        "loomrt.recall",
        "loomrt.run",
        "loomrt.run.reducers",
        "loomrt.record",
        "loomrt.bench",
    ):
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.ispkg and not info.name.startswith("_"):
                yield importlib.import_module(f"{pkg_name}.{info.name}")


def test_every_module_declares_its_public_surface_both_ways() -> None:
    """Each module's __all__ names only what exists, and every public class or function
    defined in the module is in it (a private helper has a leading underscore)."""
    import inspect

    problems = []
    for module in _modules():
        exported = getattr(module, "__all__", None)
        if exported is None:
            problems.append(f"{module.__name__}: no __all__")
            continue
        problems += [f"{module.__name__}.{n}: in __all__ but missing" for n in exported if not hasattr(module, n)]
        for name, value in vars(module).items():
            if name.startswith("_") or not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            if getattr(value, "__module__", None) == module.__name__ and name not in exported:
                problems.append(f"{module.__name__}.{name}: public but not in __all__")
    assert problems == []


def test_every_event_kind_has_a_typed_payload_and_a_drifting_payload_is_refused(tmp_path) -> None:
    import pytest

    from loomrt.events import EVENT_KINDS
    from loomrt.payloads import PAYLOADS, check_payload, events_json_schema

    assert len(EVENT_KINDS) == len(PAYLOADS) == len(set(EVENT_KINDS))
    assert set(events_json_schema()["discriminator"]["mapping"]) == set(EVENT_KINDS)
    check_payload("user_input", {"content": "hello"})
    with pytest.raises(ValueError, match="a tool_result event's payload is invalid at content"):
        check_payload("tool_result", {"tool_call_id": "c1", "name": "calc", "content": 4})
