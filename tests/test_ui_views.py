"""``loomrt ui``'s projection checkpoints (:mod:`loomrt.ui.views`): what the model saw, read
from the nearest checkpoint, is what a whole replay of the record derives (``runs show
--prompt``), in every mode, for forks, redacted or not, asked in any order; a copy of a view
shares nothing a replay changes; a later private mark drops the checkpoints it changes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from installed_kit import require
from ui_kit import UiRecord, ui_record

require("starlette", reason="loomrt ui needs the ui extra: pip install 'loomrt[ui]'")

from starlette.testclient import TestClient  # noqa: E402

from loomrt.audit import prompt_as_of, prompt_of  # noqa: E402
from loomrt.bench.ui_measure import long_run  # noqa: E402
from loomrt.record.sqlite import SQLiteStore  # noqa: E402
from loomrt.run.projection import project  # noqa: E402
from loomrt.ui.app import create_app  # noqa: E402
from loomrt.ui.read import Reader, RecordCache  # noqa: E402
from loomrt.ui.views import snapshot, unchanged_until  # noqa: E402
from loomrt.visibility import PrivateRecord  # noqa: E402


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> UiRecord:
    return ui_record(tmp_path_factory.mktemp("ui-views"))


def _turn_calls(store: SQLiteStore, run_id: str) -> list[int]:
    return [e.seq for e in store.events(run_id, kinds=["model_call"]) if e.data.get("prompt_from") == "context"]


@pytest.mark.parametrize("include_private", [False, True])
def test_a_prompt_from_a_checkpoint_is_the_whole_replays(record: UiRecord, include_private: bool) -> None:
    cache = RecordCache()
    cache.views.every = 3  # checkpoints every few events: most calls start from one
    reader = Reader(record.store, include_private, cache)
    runs = [record.recap, record.fork, record.grandfork, record.fold, record.fold_fork, record.fanout]
    runs += [c.run_id for c in record.store.children(record.fanout)]
    checked = 0
    for run_id in runs:
        calls = _turn_calls(record.store, run_id)
        checked += bool(calls)  # a fork of a fork here makes no call of its own
        for seq in [*calls[-1:], *reversed(calls), *calls[-1:]]:  # the replay extended, then checkpoints behind it
            events = record.store.events(run_id, until=seq)
            events = events if include_private else reader._redacted(run_id, events)
            whole = prompt_as_of(events, seq, record.store)
            call = next(e for e in events if e.seq == seq)
            assert prompt_of(reader._view_before(run_id, seq), call, seq) == whole, (run_id, seq)
    assert checked >= 6
    assert cache.views.replayed < sum(record.store.get_run(r).last_seq for r in runs) * 2


def test_a_copy_of_a_view_shares_nothing_a_replay_changes(record: UiRecord) -> None:
    events = record.store.events(record.recap)
    half = len(events) // 2
    view = project(events[:half], store=record.store)
    copy = snapshot(view)
    before = (list(copy.context), dict(copy.messages), set(copy.private), dict(copy.taint.first_seen), copy.turns)
    for e in events[half:]:
        view.apply(e)
    assert (
        list(copy.context),
        dict(copy.messages),
        set(copy.private),
        dict(copy.taint.first_seen),
        copy.turns,
    ) == before
    for e in events[half:]:
        copy.apply(e)
    assert copy.context == view.context and copy.wire_steps == view.wire_steps
    copy.output = object()  # type: ignore[assignment]  # a field of a kind the copy does not know
    with pytest.raises(TypeError, match="RunView.output"):
        snapshot(copy)


def test_which_checkpoints_a_new_judgement_keeps() -> None:
    old = PrivateRecord(frozenset({5}), frozenset(), ((10, frozenset({"a"})),), ())
    assert unchanged_until(None, None) > 10**9
    assert unchanged_until(old, old) > 10**9
    assert unchanged_until(old, PrivateRecord(frozenset({5}), frozenset(), old.keys, ((40, 30),))) > 10**9
    assert unchanged_until(old, PrivateRecord(frozenset({5, 7}), frozenset(), old.keys, ())) == 0  # a new mark
    grown = PrivateRecord(frozenset({5}), frozenset(), (*old.keys, (20, frozenset({"b"}))), ())
    assert unchanged_until(old, grown) == 9  # from #10 on, the events read the keys of the update at #20
    assert unchanged_until(old, None) == 0


def test_a_later_private_mark_reaches_a_prompt_already_shown(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.sqlite")
    run_id = long_run(store, 120)
    client = TestClient(create_app(store))
    app_views = client.app.state.cache.views  # type: ignore[attr-defined]
    app_views.every = 10
    last = _turn_calls(store, run_id)[-1]
    assert client.get(f"/runs/{run_id}/warm").status_code == 204
    assert "hello" in client.get(f"/runs/{run_id}/prompt/{last}").text
    hello = store.events(run_id, kinds=["user_input"])[0].seq
    asyncio.run(store.write(run_id, "mark_private", {"seq": hello, "by": "user"}))
    page = client.get(f"/runs/{run_id}/prompt/{last}").text
    assert f"[private message #{hello}" in page and ">hello<" not in page


def test_parts_kept_between_requests_are_the_parts_made_afresh(record: UiRecord) -> None:
    kept = Reader(record.store, False, RecordCache())
    kept.warm(record.recap)  # the parts of the context now made first
    for seq in reversed(_turn_calls(record.store, record.recap)):
        assert kept.prompt(record.recap, seq) == Reader(record.store, False, RecordCache()).prompt(record.recap, seq)
    assert kept.cache.parts
