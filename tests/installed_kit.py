"""Skipping a test module whose optional dependency is missing, without importing it:
``pytest.importorskip`` imports the package at collection, and sentence_transformers alone
takes about 11 s to import, which every quick run would pay for tests it then deselects."""

from __future__ import annotations

import importlib.util

import pytest


def require(module: str, reason: str | None = None) -> None:
    """Skip the calling test module when ``module`` is not installed (it is not imported)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(reason or f"{module} is not installed", allow_module_level=True)
