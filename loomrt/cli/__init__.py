"""The ``loomrt`` command line (typer)."""

from loomrt.cli.app import app, main

__all__ = ["app", "main"]
