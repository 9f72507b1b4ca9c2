"""structlog, configured once: a console renderer on a TTY, JSON lines otherwise.

Logs are for operators (a run started, finished, failed); what happened inside a run is
in its record, not in the logs.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

__all__ = ["configure_logging", "get_logger"]

_configured = False


def configure_logging(level: str | None = None) -> None:
    """Configure structlog once per process (to stderr). ``LOOMRT_LOG_LEVEL`` sets the level."""
    global _configured
    if _configured:
        return
    _configured = True
    name = (level or os.environ.get("LOOMRT_LOG_LEVEL") or "WARNING").upper()
    renderer = (
        structlog.dev.ConsoleRenderer(colors=True) if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, name, logging.WARNING)),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def _stderr_logger(*_args: object) -> structlog.PrintLogger:
    return structlog.PrintLogger(file=sys.stderr)  # looked up per call: sys.stderr may be swapped


def get_logger(**bind: object) -> structlog.typing.FilteringBoundLogger:
    configure_logging()
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger("loomrt").bind(**bind)
    return logger
