"""The web app: Starlette routes over :class:`loomrt.ui.read.Reader`, rendered by Jinja2
templates, updated in place by htmx, behind :func:`loomrt.ui.access.guarded`. Read-only:
every route is a GET."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from loomrt.cli._render import model_label
from loomrt.errors import NotFoundError
from loomrt.record.store import Store
from loomrt.ui.read import Reader, RecordCache, RunsFilter

__all__ = ["create_app", "HERE"]

HERE = Path(__file__).resolve().parent
POLL_S = 2
"""How often the runs page asks the store again (htmx polling: another process's runs show up too)."""


def _when(ts: float | None) -> str:
    return "" if ts is None else dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _took(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes} min {s} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
    env.filters["when"] = _when
    env.filters["took"] = _took
    env.filters["model"] = model_label  # scripted/PATH relative to the working folder, as the CLI shows it
    env.filters["num"] = lambda n: f"{int(n or 0):,}"
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, ensure_ascii=False, indent=2, default=str)
    return env


def create_app(store: Store, *, include_private: bool = False) -> Starlette:
    """The UI over ``store`` (unguarded: :func:`loomrt.ui.access.guarded` wraps it to serve)."""
    env = _templates()

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        body = env.get_template(name).render(include_private=include_private, poll_s=POLL_S, **context)
        return HTMLResponse(body, status_code=status)

    cache = RecordCache()

    def reader() -> Reader:
        return Reader(store, include_private, cache)

    def seq_of(request: Request, name: str) -> int:
        raw = request.path_params.get(name) or request.query_params.get(name) or "0"
        try:
            return int(raw)
        except ValueError:
            raise HTTPException(400, f"{name} must be a whole number, not {raw!r}") from None

    def day(request: Request, name: str, after: int = 0) -> float | None:
        """A ``YYYY-MM-DD`` parameter as the Unix time its local day starts (``after`` days later)."""
        raw = request.query_params.get(name)
        if not raw:
            return None
        try:
            start = dt.datetime.strptime(raw, "%Y-%m-%d")
        except ValueError:
            raise HTTPException(400, f"{name} must be a day written YYYY-MM-DD, not {raw!r}") from None
        return (start + dt.timedelta(days=after)).timestamp()

    def runs_filter(request: Request) -> RunsFilter:
        q = request.query_params
        return RunsFilter(
            agent=q.get("agent") or None,
            status=q.get("status") or None,
            mode=q.get("mode") or None,
            q=q.get("q"),
            since=day(request, "from"),
            until=day(request, "to", after=1),  # the whole of the last day
        )

    def runs(request: Request) -> Response:
        f = runs_filter(request)
        return page(request, "runs.html", f=f, found=reader().runs(f), days=request.query_params)

    def runs_rows(request: Request) -> Response:
        f = runs_filter(request)
        return page(request, "_rows.html", f=f, found=reader().runs(f))

    def run(request: Request) -> Response:
        r = reader()
        run_id = request.path_params["run_id"]
        head = r.header(run_id)
        items, next_after = r.timeline(run_id)
        return page(
            request,
            "run.html",
            head=head,
            items=items,
            next_after=next_after,
            tail=items[-1].seq if items else 0,
            at=r.where(run_id),
            markers=r.distillations(run_id),
            cards=r.cards(run_id) if head.info.mode == "fold" else [],
            run_id=run_id,
        )

    def timeline(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        after = seq_of(request, "after")
        r = reader()
        items, next_after = r.timeline(run_id, after=after)
        tail = items[-1].seq if items else after  # the live tail asks again from here
        return page(
            request, "_timeline.html", items=items, next_after=next_after, tail=tail, run_id=run_id, at=r.where(run_id)
        )

    def prompt(request: Request) -> Response:
        run_id, seq = request.path_params["run_id"], seq_of(request, "seq")
        r = reader()
        parts = r.prompt(run_id, seq)
        name = "_prompt.html" if request.headers.get("hx-request") else "prompt.html"
        total = sum(p.tokens for p in parts)
        return page(request, name, parts=parts, run_id=run_id, seq=seq, total=total, tools=r.tools(run_id))

    def warm(request: Request) -> Response:
        """The run page asks for this once shown: the run's record replayed to its end, its view
        checkpointed, so that "what the model saw" at any call replays a few events (empty reply)."""
        reader().warm(request.path_params["run_id"])
        return Response(status_code=204)

    def tokens(request: Request) -> Response:
        return JSONResponse(reader().tokens(request.path_params["run_id"]))

    def audit(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        return page(request, "_audit.html", verdict=reader().verify(run_id), run_id=run_id)

    def recall(request: Request) -> Response:
        run_id, query = request.path_params["run_id"], (request.query_params.get("q") or "").strip()
        if not query:
            return page(request, "_recall.html", answer=None, query="", run_id=run_id)
        k = seq_of(request, "k") if request.query_params.get("k") else 5
        if not 1 <= k <= 50:
            raise HTTPException(400, f"k must be between 1 and 50, not {k}")
        source = request.query_params.get("source") or None
        if source not in (None, "run", "family"):
            raise HTTPException(400, f"source is run or family (a fork's shared history), not {source!r}")
        r = reader()
        answer = r.recall(run_id, query, k, source)
        return page(request, "_recall.html", answer=answer, query=query, run_id=run_id, at=r.where(run_id))

    def state(request: Request) -> Response:
        run_id, seq = request.path_params["run_id"], seq_of(request, "seq")
        return page(request, "_state.html", update=reader().state_at(run_id, seq), seq=seq, run_id=run_id)

    def event(request: Request) -> Response:
        run_id, seq = request.path_params["run_id"], seq_of(request, "seq")
        return JSONResponse(reader().event(run_id, seq).to_json_dict())

    async def not_found(request: Request, exc: Exception) -> Response:
        return page(request, "error.html", status=404, message=str(exc))

    async def failed(request: Request, exc: Exception) -> Response:
        """A record the read model cannot read (one the projection cannot replay, a store gone):
        a page that says what failed, not a stack trace."""
        message = f"could not read {request.url.path}: {type(exc).__name__}: {exc}"
        return page(request, "error.html", status=500, message=message)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = exc.detail if exc.status_code != 404 else f"no page at {request.url.path}"
        return page(request, "error.html", status=exc.status_code, message=message)

    # The pages are plain functions: Starlette runs each in its thread pool, so a long read (a
    # verify, a replay, the embedder loading for Recall) never holds up the others' polling.
    routes = [
        Route("/", runs),
        Route("/runs/rows", runs_rows),
        Route("/runs/{run_id}", run),
        Route("/runs/{run_id}/timeline", timeline),
        Route("/runs/{run_id}/prompt/{seq}", prompt),
        Route("/runs/{run_id}/warm", warm),
        Route("/runs/{run_id}/tokens.json", tokens),
        Route("/runs/{run_id}/audit", audit),
        Route("/runs/{run_id}/events/{seq}", event),
        Route("/runs/{run_id}/recall", recall),
        Route("/runs/{run_id}/state/{seq}", state),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes, exception_handlers={NotFoundError: not_found, HTTPException: http_error, Exception: failed}
    )
    app.state.cache = cache  # what the server keeps (the ui measure counts the events its views replay)
    return app
