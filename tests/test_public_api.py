"""The public API: __all__ is complete and every name in it exists (httpx's test_exported_members)."""

from __future__ import annotations

import types

import loomrt


def test_all_is_complete_and_exists() -> None:
    exported = set(loomrt.__all__)
    public = {
        n for n in dir(loomrt)
        if not n.startswith("_") and not isinstance(getattr(loomrt, n), types.ModuleType) and n != "annotations"
    }
    assert public <= exported, f"public but not in __all__: {sorted(public - exported)}"
    assert all(hasattr(loomrt, n) for n in exported)
