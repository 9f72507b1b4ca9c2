"""The sabotage tests of ``loomrt bench run ui`` (issue 42's rule): each breaks ``loomrt ui``
the way a figure exists to catch, runs the measure at test size, and asserts the figure comes
out bad; the honest run at the same size meets every goal. Counted work, never seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
from installed_kit import require

require("starlette", reason="loomrt ui needs the ui extra: pip install 'loomrt[ui]'")

from loomrt.bench.ui_measure import ui_figures  # noqa: E402
from loomrt.ui import read as ui_read  # noqa: E402
from loomrt.ui import views as ui_views  # noqa: E402

WARM = "what the model saw at any call, warm: ≤ {} events replayed"

RUNS, EVENTS = (12, 40), 1_200


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ui_read, "PAGE_ROWS", 5)  # both sizes above a page, at test size
    monkeypatch.setattr(ui_read, "TIMELINE_PAGE", 100)
    monkeypatch.setattr(ui_views, "CHECKPOINT_EVERY", 100)


def test_the_honest_ui_meets_every_goal(tmp_path: Path) -> None:
    figures = ui_figures(tmp_path, RUNS, EVENTS)
    assert figures["goals"] and all(figures["goals"].values()), figures
    assert figures["runs_page"]["12"]["queries"] == 2


def test_a_runs_page_that_sums_each_row_apart_grows_with_the_rows(tmp_path: Path, monkeypatch) -> None:
    honest = ui_read.glances  # sabotage: no grouped query, one query per row shown
    monkeypatch.setattr(ui_read, "glances", lambda store, runs: {r.run_id: honest(store, [r])[r.run_id] for r in runs})
    figures = ui_figures(tmp_path, RUNS, EVENTS)
    assert not figures["goals"]["runs page in two queries (the runs, the rows' sums), whatever the rows shown"]
    assert figures["runs_page"]["40"]["queries"] == 1 + 5


def test_a_runs_page_that_reads_every_run_grows_with_the_record(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ui_read, "PAGE_ROWS", 10**6)  # sabotage: every run the record holds is a row
    figures = ui_figures(tmp_path, RUNS, EVENTS)
    assert not figures["runs_page_flat"]
    assert figures["runs_page"]["40"]["runs_summed"] > figures["runs_page"]["12"]["runs_summed"]


def test_pages_that_read_the_record_again_for_each_request_are_seen(tmp_path: Path, monkeypatch) -> None:
    # sabotage: nothing kept (get goes through get_many)
    monkeypatch.setattr(ui_read.RecordCache, "get_many", lambda self, what, infos, read: read(infos))
    figures = ui_figures(tmp_path, RUNS, EVENTS)
    assert not figures["goals"]["the next page reads its page, not the record"]
    assert not figures["goals"]["what the model saw at any call, warm: ≤ 100 events read"]
    assert not figures["goals"]["polled again with nothing moved, one query"]
    assert figures["runs_poll"]["40"]["queries"] == 2


def test_a_run_page_that_reads_its_whole_timeline_is_seen(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ui_read, "TIMELINE_PAGE", 10**9)  # sabotage: no paging
    figures = ui_figures(tmp_path, RUNS, EVENTS)
    assert not figures["goals"][
        "opening reads less than twice the record (its private material judged, a page), replays nothing"
    ]


def test_what_the_model_saw_without_checkpoints_replays_the_record(tmp_path: Path, monkeypatch) -> None:
    honest = ui_views.Views.__init__  # sabotage: no checkpoint but the first event's

    def no_checkpoints(self: ui_views.Views, every: int | None = None, size: int | None = None) -> None:
        honest(self, 10**9, size)

    monkeypatch.setattr(ui_views.Views, "__init__", no_checkpoints)
    figures = ui_figures(tmp_path, RUNS, EVENTS)
    assert not figures["goals"][WARM.format(100)]
    early = figures["long_run"]["prompt_first"]["replayed"]
    middle = figures["long_run"]["prompt_middle"]["replayed"]
    assert middle > 100 and middle > EVENTS // 3, (early, middle)


def test_what_the_model_saw_replayed_afresh_for_each_call_is_the_whole_record(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ui_views, "RUNS_KEPT", 0)  # sabotage: no run's views kept between requests
    figures = ui_figures(tmp_path, RUNS, EVENTS)
    assert not figures["goals"][WARM.format(100)]
    last = figures["long_run"]["prompt_last"]["replayed"]
    assert last >= figures["long_run"]["events"] - 10, last
