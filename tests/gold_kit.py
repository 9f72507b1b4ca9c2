"""Looking for gold values in the benchmarks' scripted model, for tests/test_bench.py and
tests/test_sabotage_gold.py.

The bench's promise is that the scripted model is never told a gold value (the value a
question asks for, the value a plan step needs): it answers from what it reads, and the
workload grades it. :func:`held_strings` walks everything an object holds (attributes,
dataclass fields, slots, dicts, lists, sets, tuples, closures, bound methods, partials and
its classes' own attributes) and yields every string in it; :func:`gold_during` plays a
workload with the model walked at every call it answers.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from loomrt.bench.core import BenchConfig
from loomrt.bench.model import BenchModel, Needle, prompt_text
from loomrt.bench.runner import run_bench
from loomrt.providers.base import ModelRequest, ModelResponse

LEARNED = "model.patched"
"""Where a stateful model keeps what it noted in Σ: values it read in its prompt, never told."""

_SCALARS = (int, float, complex, bool, type(None))


def _parts(where: str, obj: Any) -> Iterator[tuple[str, Any]]:
    """What ``obj`` holds, one level down, each with where it is."""
    if isinstance(obj, dict):
        for i, (k, v) in enumerate(obj.items()):
            yield f"{where}<key {i}>", k
            yield f"{where}[{k!r}]", v
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            yield f"{where}[{i}]", v
        return
    if isinstance(obj, types.MethodType):
        yield f"{where}.__self__", obj.__self__
        yield f"{where}.__func__", obj.__func__
    if isinstance(obj, functools.partial):
        yield f"{where}.func", obj.func
        yield f"{where}.args", obj.args
        yield f"{where}.keywords", obj.keywords
    if inspect.isfunction(obj):
        for i, cell in enumerate(obj.__closure__ or ()):
            try:
                yield f"{where}<closure {i}>", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        yield f"{where}.__defaults__", obj.__defaults__
        yield f"{where}.__kwdefaults__", obj.__kwdefaults__
        return
    own = vars(obj) if hasattr(obj, "__dict__") and not isinstance(obj, type) else {}
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.name not in own:  # a slotted dataclass's fields (the others are in ``own``)
                yield f"{where}.{f.name}", getattr(obj, f.name, None)
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if isinstance(name, str) and hasattr(obj, name):
                yield f"{where}.{name}", getattr(obj, name)
        if cls.__module__ != "builtins":  # what a class of it holds (a planted class attribute)
            for name, value in vars(cls).items():
                if not (name.startswith("__") and name.endswith("__")):
                    yield f"{where}<{cls.__name__}>.{name}", value
    for name, value in own.items():
        yield f"{where}.{name}", value


def held_strings(obj: Any, where: str = "model") -> Iterator[tuple[str, str]]:
    """Every string ``obj`` holds, however deep, with where it is (each object walked once)."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(where, obj)]
    while stack:
        at, o = stack.pop()
        if isinstance(o, str):
            yield at, o
            continue
        if isinstance(o, (bytes, bytearray)):
            yield at, bytes(o).decode("utf-8", "replace")
            continue
        if isinstance(o, _SCALARS) or isinstance(o, (type, types.ModuleType)) or id(o) in seen:
            continue
        seen.add(id(o))
        stack.extend(reversed(list(_parts(at, o))))


def gold_held(obj: Any, gold: Iterable[str], *, shown: Iterable[str] = ()) -> list[str]:
    """Where ``obj`` holds a gold value (``where: value``). A value under :data:`LEARNED` that
    the model was ``shown`` in a prompt is what it noted from its reading, not a leak."""
    gold, shown = set(gold), set(shown)
    return [
        f"{at}: {g}"
        for at, s in held_strings(obj)
        for g in gold
        if g in s and not (at.startswith(LEARNED) and g in shown)
    ]


def gold_during(workload: str, modes: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[str]]:
    """Play ``workload`` (test size, the hash embedder) in ``modes`` (and append) and walk the
    scripted model for the workload's gold values before each call it answers. Returns how
    many calls were walked and where gold was found (``model N: where: value``, one model
    per mode played)."""
    from loomrt.bench import workloads

    gold: set[str] = set()
    for name in ("chat_script", "agentic_script"):  # the needles the workload plants are its gold
        script = getattr(workloads, name)

        def planting(*args: Any, _script: Any = script, **kw: Any) -> Any:
            out = _script(*args, **kw)
            gold.update(n.value for n in out[-1] if isinstance(n, Needle))
            return out

        monkeypatch.setattr(workloads, name, planting)
    answer = BenchModel.__call__
    models: list[BenchModel] = []  # kept, so that no two models share an id
    shown: dict[int, set[str]] = {}  # the gold values each model was sent in a prompt
    walked: list[int] = [0]
    found: list[str] = []

    def walked_call(self: BenchModel, request: ModelRequest) -> ModelResponse:
        if id(self) not in shown:
            models.append(self)
            shown[id(self)] = set()
        prompt = prompt_text(request.messages)
        shown[id(self)].update(g for g in gold if g in prompt)
        walked[0] += 1
        n = next(i for i, m in enumerate(models) if m is self) + 1
        found.extend(f"model {n}: {f}" for f in gold_held(self, gold, shown=shown[id(self)]))
        return answer(self, request)

    monkeypatch.setattr(BenchModel, "__call__", walked_call)
    out = run_bench([workload], BenchConfig(quick=True, embedder="hash", modes=modes))
    assert not out["failed"] and workload in out["workloads"], out["failed"]
    assert gold, "the workload planted no gold values"
    return walked[0], found
