"""A history replayed from elsewhere keeps when its words were said (``said_at`` on a user
input): the injected passage, the Recall tool and fold's times read it, not the replay's
clock; and a LoCoMo session date becomes that time."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from test_recall_inject import FILLER, NEEDLE, QUESTION, runtime, spec

from loomrt.bench.locomo_recall import Turn, said_at
from loomrt.errors import SpecError

MAY_8 = dt.datetime(2023, 5, 8, 13, 56, tzinfo=dt.UTC).timestamp()


def test_an_injected_passage_carries_when_it_was_said_not_when_it_was_recorded() -> None:
    rt, provider = runtime()
    run = rt.start(spec(), interactive=True)

    async def go() -> None:
        await rt.send(run, "Help me set up the deployment.", said_at=MAY_8 - 60)
        await rt.send(run, NEEDLE, said_at=MAY_8)
        for i in range(14):
            await rt.send(run, f"turn {i}: {FILLER}", said_at=MAY_8 + 60 * (i + 1))
        await rt.send(run, QUESTION)

    asyncio.run(go())
    injected = rt.store.latest(run.run_id, "recall_injected").data["passages"]
    needle = next(p for p in injected if p["text"] == NEEDLE)
    assert needle["date"] == "8 May 2023, 13:56"  # as people write it: a small model copies it
    assert "8 May 2023, 13:56" in provider.calls[-1].messages[-2]["content"]
    stored = next(e for e in rt.store.events(run.run_id, kinds=["user_input"]) if e.data["content"] == NEEDLE)
    assert stored.data["said_at"] == MAY_8 and stored.ts > MAY_8  # the record still says when it was written
    hits = run.toolset.recall.search("staging database port", top_k=3)
    assert any(h.text == NEEDLE and h.ts == MAY_8 for h in hits)


def test_said_at_must_be_a_time() -> None:
    rt, _ = runtime()
    run = rt.start(spec(), interactive=True)
    for bad in (float("nan"), -5.0, "yesterday"):
        with pytest.raises(SpecError, match="said_at must be a time"):
            asyncio.run(rt.send(run, "hello", said_at=bad))  # type: ignore[arg-type]
    assert rt.store.events(run.run_id, kinds=["user_input"]) == []


def test_a_locomo_session_date_is_when_its_turns_were_said() -> None:
    turn = Turn(dia_id="D1:1", speaker="Caroline", text="Hi!", date="1:56 pm on 8 May, 2023", session=1)
    assert said_at(turn) == MAY_8
    assert said_at(Turn(dia_id="D1:2", speaker="Mel", text="Hey", date="sometime in May", session=1)) is None


def test_the_locomo_replay_indexes_each_turn_at_its_session_date() -> None:
    """The index ``bench qa``'s ``recall`` and ``full/inject`` rows read: a passage injected
    from it is dated when the turn was said (it once said the day of the replay, and the
    model answered temporal questions with that day)."""
    from loomrt.bench.locomo_recall import replay

    sample = {
        "sample_id": "conv-t",
        "conversation": {
            "speaker_a": "Ana",
            "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D1:1", "text": f"I adopted a grey cat called Pixel, line {i}."}
                for i in range(1)
            ]
            + [
                {"speaker": "Ben", "dia_id": f"D1:{i}", "text": f"filler talk about the weather {i}"}
                for i in range(2, 30)
            ],
        },
    }
    _, run, _ = asyncio.run(replay(sample, embedder=False))
    hits = run.toolset.recall.search("grey cat Pixel", top_k=3)
    assert hits and hits[0].ts == MAY_8
