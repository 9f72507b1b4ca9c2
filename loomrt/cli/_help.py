"""Help text with plain metavars, as click writes them: TEXT, INTEGER, PATH, and nothing for a flag.

Newer typer releases (0.2x) write each parameter's Python type in ``--help`` instead:
``<bool>`` beside every flag, ``<list[str]>``, ``<int range>``, and the usage line's
arguments as ``{agent}``. They come from typer itself (``TyperOption.display_type_rich``,
``TyperArgument.display_type_rich`` and ``_usage_display_name`` in :mod:`typer.core`), and
no setting turns them off, so :func:`plain_metavars` replaces those methods with ones that
name the type as click does. An explicit ``metavar=`` still wins. A typer without them
(the releases before) already writes click's metavars and is left as it is.
"""

from __future__ import annotations

from typing import Any

__all__ = ["plain_metavars", "plain_type"]

_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": "BOOLEAN"}


def plain_type(label: str) -> str:
    """typer's type label (``<int range>``, ``<list[str]>``, ``<path>``, ``<a|b>``) as click's
    metavar (``INTEGER``, ``TEXT``, ``PATH``, ``[a|b]``)."""
    if label.startswith("<") and label.endswith(">"):
        label = label[1:-1]
    if label.startswith("list[") and label.endswith("]"):  # a repeatable option: one value's metavar
        label = label[5:-1]
    label = label.removesuffix(" range")  # the range itself follows, as [x>=0]
    if "|" in label:
        return f"[{label}]"
    if "," in label:  # a tuple
        return " ".join(plain_type(part) for part in label.split(","))
    return _NAMES.get(label, label.upper())


def _option_type(self: Any, ctx: Any) -> str | None:
    if self.metavar is not None:
        return str(self.metavar)
    if getattr(self, "is_flag", False) or getattr(self, "count", False):
        return None
    shown = plain_type(str(self.display_type(ctx)))
    return shown + "..." if self.nargs != 1 else shown


def _argument_type(self: Any, ctx: Any) -> str | None:
    return str(self.metavar) if self.metavar is not None else plain_type(str(self.display_type(ctx)))


def _argument_usage(self: Any) -> str:
    name = str(self.metavar if self.metavar is not None else (self.name or "")).upper()
    name = name if self.required else f"[{name}]"
    return name + "..." if self.nargs != 1 else name


def plain_metavars() -> None:
    """Make typer's help write click's plain metavars (idempotent; a no-op on a typer that does already)."""
    from typer import core

    option, argument = getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)
    if option is not None and hasattr(option, "display_type_rich") and hasattr(option, "display_type"):
        option.display_type_rich = _option_type
    if argument is not None and hasattr(argument, "display_type_rich") and hasattr(argument, "display_type"):
        argument.display_type_rich = _argument_type
    if argument is not None and hasattr(argument, "_usage_display_name"):
        argument._usage_display_name = _argument_usage
