"""The ``ui`` measure: what ``loomrt ui``'s pages cost, by counted work (store queries and
events read), not seconds, through the app itself (its HTTP routes, over SQLite).

- **runs page**: ``GET /`` over 100 runs and over 1,000 runs. The page lists the newest 50,
  so its work must not grow with the runs the record holds, nor with the rows it shows: one
  query for the runs, and one grouped query for the sums of every row shown
  (:meth:`~loomrt.record.store.Store.run_sums`, :func:`loomrt.glance.glances`); polled again
  (every 2 s) with nothing moved, one query: a row is kept per state of its run's record;
- **a run of 10,000 events**: opening its page (the redaction judges the whole record once,
  the header sums its model calls and inputs, the page reads its first 200 events: at most
  twice the record), the next page of its timeline (its 200 events, not the record again:
  the judgement is kept per state of the record), and "what the model saw" at its last call
  (the record once: up to the call).

Server milliseconds are reported beside the counts, for the reader; the goals are on counts.
Each figure's sabotage test is in tests/test_sabotage_ui.py.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from loomrt.bench.core import BenchConfig, Progress, standalone_measure
from loomrt.events import Event, RunInfo
from loomrt.record.sqlite import SQLiteStore
from loomrt.record.store import Store

__all__ = ["ui", "ui_figures", "CountingStore", "long_run"]

RUNS = (100, 1_000)
LONG_EVENTS = 10_000


class CountingStore:
    """A store that counts its reads: queries, the events they returned, and the runs whose
    sums were asked for (:meth:`~loomrt.record.store.Store.run_sums`: one query, whatever the
    runs, so its work is counted by them)."""

    READS = ("get_run", "list_runs", "children", "latest", "head", "cards", "lease_holder")

    def __init__(self, inner: Store):
        self.inner = inner
        self.queries = 0
        self.events_read = 0
        self.runs_summed = 0

    def events(
        self, run_id: str, *, after: int = 0, kinds: Iterable[str] | None = None, until: int | None = None
    ) -> list[Event]:
        found = self.inner.events(run_id, after=after, kinds=kinds, until=until)
        self.queries += 1
        self.events_read += len(found)
        return found

    def run_sums(self, run_ids: Iterable[str]) -> dict[str, Any]:
        wanted = list(run_ids)
        self.queries += 1
        self.runs_summed += len(wanted)
        return self.inner.run_sums(wanted)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name in self.READS:

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.queries += 1
                return value(*args, **kwargs)

            return counted
        return value

    def count(self) -> dict[str, int]:
        out = {"queries": self.queries, "events_read": self.events_read, "runs_summed": self.runs_summed}
        self.queries = self.events_read = self.runs_summed = 0
        return out


def _runs(store: SQLiteStore, n: int) -> None:
    """``n`` small runs (a turn each), as the record holds them."""

    async def write() -> None:
        for i in range(n):
            run_id = f"bench-ui-{i:05d}"
            store.create_run(RunInfo(run_id=run_id, agent=f"agent-{i % 3}", def_hash="h", mode="recap", model="m"))
            await store.write_many(run_id, _turn(i))

    asyncio.run(write())


def _turn(i: int) -> list[tuple[str, dict[str, Any]]]:
    usage = {"input_tokens": 100 + i, "output_tokens": 10, "cached_tokens": 0}
    return [
        ("user_input", {"content": f"question {i}"}),
        ("model_call", {"purpose": "turn", "model": "m", "usage": usage, "seconds": 0.1, "prompt_from": "context"}),
        ("assistant_message", {"message": {"role": "assistant", "content": f"answer {i}"}}),
        ("parked", {"output": f"answer {i}"}),
    ]


def long_run(store: SQLiteStore, events: int) -> str:
    """A run of about ``events`` events: one the runtime played, then turns appended four events at a time."""
    from loomrt.runtime import Runtime
    from loomrt.spec import AgentSpec
    from loomrt.testing import FunctionProvider

    rt = Runtime(store, providers=lambda spec, model: FunctionProvider(lambda r: "ok"))
    spec = AgentSpec(model="function/inline", context={"mode": "append"})

    async def play() -> str:
        run = await rt.astart(spec, interactive=True)
        await rt.send(run, "hello")
        turns = (events - store.get_run(run.run_id).last_seq) // 4
        for i in range(turns):
            await store.write_many(run.run_id, _turn(i))
        return run.run_id

    return asyncio.run(play())


def _get(client: Any, counting: CountingStore, path: str) -> dict[str, Any]:
    """GET ``path``: the store's reads, the events the server's views replayed, the milliseconds."""
    views = client.app.state.cache.views
    counting.count()
    replayed = views.replayed
    started = time.perf_counter()
    response = client.get(path)
    ms = (time.perf_counter() - started) * 1000
    if response.status_code not in (200, 204):
        raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:200]}")
    return {**counting.count(), "replayed": views.replayed - replayed, "ms": round(ms, 1)}


def ui_figures(folder: Path, runs: tuple[int, ...] = RUNS, events: int = LONG_EVENTS) -> dict[str, Any]:
    """The runs page at each size of ``runs``, and a run of ``events`` events opened, paged and prompted."""
    from starlette.testclient import TestClient

    from loomrt.tokens import count_text
    from loomrt.ui import read as ui_read
    from loomrt.ui import views as ui_views
    from loomrt.ui.app import create_app

    count_text("warm")  # the tokenizer loads once per process (about 1 s): a server has paid it before any page
    out: dict[str, Any] = {"runs_page": {}, "rows_shown": ui_read.PAGE_ROWS}
    for n in runs:
        store = SQLiteStore(folder / f"runs-{n}.sqlite")
        _runs(store, n)
        counting = CountingStore(store)
        client = TestClient(create_app(counting))
        out["runs_page"][str(n)] = _get(client, counting, "/")
        out.setdefault("runs_poll", {})[str(n)] = _get(client, counting, "/runs/rows")  # nothing moved since
    sizes = [out["runs_page"][str(n)] for n in runs]
    out["runs_page_flat"] = all(len({s[k] for s in sizes}) == 1 for k in ("queries", "events_read", "runs_summed"))
    store = SQLiteStore(folder / "long.sqlite")
    run_id = long_run(store, events)
    counting = CountingStore(store)
    client = TestClient(create_app(counting))
    last = store.get_run(run_id).last_seq
    calls = [e.seq for e in store.events(run_id, kinds=["model_call"])]
    page = f"/runs/{run_id}"
    out["long_run"] = {
        "events": last,
        "checkpoint_every": ui_views.CHECKPOINT_EVERY,
        "prompt_cold": _get(client, counting, f"{page}/prompt/{calls[-1]}"),  # the one replay, not warmed first
    }
    client = TestClient(create_app(counting))  # a fresh server: as a reader opens the run
    out["long_run"].update(
        {
            "open": _get(client, counting, page),
            "warm": _get(client, counting, f"{page}/warm"),  # what the page asks for once shown
            "next_page": _get(client, counting, f"{page}/timeline?after={ui_read.TIMELINE_PAGE}"),
            "prompt_last": _get(client, counting, f"{page}/prompt/{calls[-1]}"),
            "prompt_middle": _get(client, counting, f"{page}/prompt/{calls[len(calls) // 2]}"),
            "prompt_first": _get(client, counting, f"{page}/prompt/{calls[1]}"),
        }
    )
    lr = out["long_run"]
    warm_prompts = [lr[k] for k in ("prompt_last", "prompt_middle", "prompt_first")]
    every = ui_views.CHECKPOINT_EVERY
    out["goals"] = {
        "runs page flat in the runs held": out["runs_page_flat"],
        "runs page in two queries (the runs, the rows' sums), whatever the rows shown": all(
            s["queries"] == 2 for s in sizes
        ),
        "polled again with nothing moved, one query": all(p["queries"] == 1 for p in out["runs_poll"].values()),
        "opening reads less than twice the record (its private material judged, a page), replays nothing": lr["open"][
            "events_read"
        ]
        < 2 * last
        and lr["open"]["replayed"] == 0,
        "the next page reads its page, not the record": lr["next_page"]["events_read"] <= ui_read.TIMELINE_PAGE,
        "the run's record replayed once (warming, or a cold server's first prompt)": lr["warm"]["replayed"] <= last
        and lr["prompt_cold"]["replayed"] <= last,
        f"what the model saw at any call, warm: ≤ {every} events replayed": all(
            p["replayed"] <= every for p in warm_prompts
        ),
        f"what the model saw at any call, warm: ≤ {every} events read": all(
            p["events_read"] <= every + 1 for p in warm_prompts
        ),
    }
    return out


@standalone_measure(
    "ui",
    "loomrt ui by counted work: the runs page over 100 and 1,000 runs, and a run of 10,000 events opened, "
    "paged and its last prompt shown (store queries and events read)",
)
def ui(config: BenchConfig, progress: Progress) -> dict[str, Any]:
    try:
        import starlette.testclient  # noqa: F401 - the measure drives the app through it (it needs httpx)
    except ImportError as exc:
        return {
            "skipped": f"{exc.name} is missing: the measure needs the ui extra and httpx (pip install 'loomrt[all]')"
        }
    progress.start("ui", 1)
    with tempfile.TemporaryDirectory(prefix="loomrt-bench-ui-") as folder:
        out = ui_figures(Path(folder), events=2_000 if config.quick else LONG_EVENTS)
    progress.advance()
    return out
