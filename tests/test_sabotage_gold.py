"""Sabotage tests for "the scripted model holds no gold values" (docs/benchmarks.md): each
hands the model a gold value the way a harness could, and shows that the walk of
tests/gold_kit.py, which tests/test_bench.py runs at every call of a play, finds it. (Kept
apart from tests/test_sabotage.py, whose table should list these rows too.)

| figure | sabotage | test |
|---|---|---|
| the scripted model holds no gold values (chat200) | the harness hands the model the whole turn, the fact it asks about included | ``test_the_gold_walk_finds_a_chat_turn_handed_over_whole`` |
| the scripted model holds no gold values (agentic) | the model's plan keeps the needed values in its calls' arguments (and so grades itself right) | ``test_the_gold_walk_finds_a_plan_that_keeps_the_values`` |
| the walk itself | a gold value deep in a closure, a container or a class attribute of the model | ``test_the_gold_walk_looks_into_closures_containers_and_classes`` |
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from gold_kit import gold_during, gold_held

from loomrt.bench.workloads import ChatModel, ChatTurn, Move, Step


def test_the_gold_walk_finds_a_chat_turn_handed_over_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        walked, found = gold_during("chat200", ["append"], patch)
    assert walked >= 60 and not found, found[:3]

    # the turn itself as the model's cue: it reads only the question and the reply, but holds the gold
    monkeypatch.setattr(ChatTurn, "cue", property(lambda t: t))
    walked, found = gold_during("chat200", ["append"], monkeypatch)
    assert walked >= 60 and any(".current.asks.value: " in f for f in found), found[:3]


def test_the_gold_walk_finds_a_plan_that_keeps_the_values(monkeypatch: pytest.MonkeyPatch) -> None:
    def keeping(step: Step) -> Move:  # the planned call, the needed value in place, as the model's plan
        needs = step.needs
        return Move(step.tool, dict(step.arguments), needs.key if needs else "", needs.search if needs else "")

    monkeypatch.setattr(Step, "move", property(keeping))
    walked, found = gold_during("agentic", ["append"], monkeypatch)
    assert walked >= 40 and any(".plan[" in f and ".arguments['cmd']: " in f for f in found), found[:3]


def test_the_gold_walk_looks_into_closures_containers_and_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    gold = {"4417#23"}

    def grader(value: str) -> Callable[[str], bool]:
        return lambda said: value in said

    model = ChatModel()
    assert gold_held(model, gold) == []
    vars(model)["extras"] = [{"grade": grader("4417#23")}]
    assert gold_held(model, gold) == ["model.extras[0]['grade']<closure 0>: 4417#23"]
    del vars(model)["extras"]

    monkeypatch.setattr(ChatModel, "answer_key", ("door code 4417#23",), raising=False)
    assert gold_held(model, gold) == ["model<ChatModel>.answer_key[0]: 4417#23"]
    monkeypatch.delattr(ChatModel, "answer_key")

    # a value noted in Σ is the model's own reading only if it was shown the value in a prompt
    model.patched.add("Please note that my landlord's door code is 4417#23.")
    assert gold_held(model, gold) == ["model.patched[0]: 4417#23"]
    assert gold_held(model, gold, shown=gold) == []
