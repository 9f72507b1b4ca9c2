"""``loomrt ui`` over HTTP (Starlette's test client, no browser): the runs page and its
filters, a run's timeline with its distillation markers, what the model saw (the same as
``runs show --prompt``), the tokens chart's data, the audit, private material redacted, the
token, and bad input answered with a page that says what is wrong."""

from __future__ import annotations

import html
import json
import re
import sqlite3
from pathlib import Path

import pytest
from installed_kit import require
from typer.testing import CliRunner
from ui_kit import UiRecord, ui_record

require("starlette", reason="loomrt ui needs the ui extra: pip install 'loomrt[ui]'")

from starlette.testclient import TestClient  # noqa: E402

from loomrt.bench.integrity_measure import forged_turn  # noqa: E402
from loomrt.cli.app import app as cli  # noqa: E402
from loomrt.errors import SpecError  # noqa: E402
from loomrt.ui import read as ui_read  # noqa: E402
from loomrt.ui import timeline as ui_timeline  # noqa: E402
from loomrt.ui.access import check_ui_listen, guarded  # noqa: E402
from loomrt.ui.app import create_app  # noqa: E402

TOKEN = "t" * 43


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> UiRecord:
    return ui_record(tmp_path_factory.mktemp("ui"))


@pytest.fixture()
def client(record: UiRecord) -> TestClient:
    return TestClient(create_app(record.store))


def _turn_calls(record: UiRecord, run_id: str) -> list[int]:
    calls = record.store.events(run_id, kinds=["model_call"])
    return [e.seq for e in calls if e.data.get("prompt_from") == "context"]


def _shown_texts(page: str) -> list[str]:
    """The texts of a prompt's parts as a reader sees them (the pointer links' tags removed)."""
    blocks = re.findall(r'<pre class="content">(.*?)</pre>', page, re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", b)) for b in blocks]


def test_the_runs_page_lists_every_run_and_filters(client: TestClient, record: UiRecord) -> None:
    page = client.get("/").text
    for run_id in (record.recap, record.fork, record.fold, record.fanout):
        assert f'href="/runs/{run_id}"' in page
    fold_only = client.get("/runs/rows", params={"mode": "fold"}).text
    assert record.fold in fold_only and record.recap not in fold_only
    by_id = client.get("/runs/rows", params={"q": record.recap[:6]}).text
    assert record.recap in by_id and record.fold not in by_id
    nothing = client.get("/runs/rows", params={"agent": "no-such-agent"}).text
    assert "No run matches" in nothing
    assert 'hx-trigger="every 2s"' in page  # the list is read again while runs play


def test_a_new_run_shows_up_on_the_next_poll(tmp_path: Path) -> None:
    from loomrt.events import RunInfo
    from loomrt.record.sqlite import SQLiteStore

    path = tmp_path / "record.sqlite"
    client = TestClient(create_app(SQLiteStore(path)))
    assert "No run matches" in client.get("/runs/rows").text
    other = SQLiteStore(path)  # another process's store, the same file
    other.create_run(RunInfo(run_id="other-process-1", agent="a", def_hash="h", mode="recap", model="m"))
    assert "other-process-1" in client.get("/runs/rows").text
    for n in (1, 2):  # a run that moves is read again (its row is kept per state of its record, never stale)
        other.append("other-process-1", "user_input", {"content": f"input {n}"})
        row = client.get("/runs/rows").text.split("other-process-1", 1)[1]
        assert re.findall(r'<td class="n">(\d+)</td>', row)[0] == str(n)


def test_the_timeline_marks_every_distillation(client: TestClient, record: UiRecord) -> None:
    page = client.get(f"/runs/{record.recap}").text
    distillations = record.store.events(record.recap, kinds=["distillation"])
    assert len(distillations) >= 2
    for d in distillations:
        assert f'id="e{d.seq}" class="ev distil' in page
        span = d.data["span_seqs"]
        assert f"evicted #{span[0]}–#{span[-1]} ({len(span)} messages)" in page
        assert f"{d.data['tokens_before']:,} → {d.data['tokens_after']:,} tokens" in page


def test_what_the_model_saw_is_runs_show_prompt(client: TestClient, record: UiRecord, monkeypatch) -> None:
    first_distillation = record.store.events(record.recap, kinds=["distillation"])[0].seq
    seq = next(s for s in _turn_calls(record, record.recap) if s > first_distillation)
    monkeypatch.setenv("LOOMRT_DB_URL", f"sqlite:{record.path}")
    shown = CliRunner().invoke(cli, ["runs", "show", record.recap, "--prompt", str(seq), "--json"])
    assert shown.exit_code == 0, shown.output
    expected = json.loads(shown.output)["prompt"]
    parts = ui_read.Reader(record.store).prompt(record.recap, seq)
    assert [p.label.split(" ")[0] for p in parts] == [
        f"#{m['seq']}" if m.get("seq") is not None and not m.get("synthetic") else m.get("synthetic") or "synthetic"
        for m in expected
    ]
    page = client.get(f"/runs/{record.recap}/prompt/{seq}", headers={"HX-Request": "true"}).text
    assert _shown_texts(page) == [m["content"] for m in expected]
    assert 'data-kind="distilled"' in page  # the recap the distillation wrote, coloured apart
    assert "the tools the run offers on each call: vault" in page


def test_private_material_is_redacted_unless_asked(record: UiRecord) -> None:
    redacted = TestClient(create_app(record.store))
    whole = TestClient(create_app(record.store, include_private=True))
    for run_id in (record.recap, record.fork):
        page = redacted.get(f"/runs/{run_id}").text
        assert record.secret not in page
        for seq in _turn_calls(record, run_id):
            assert record.secret not in redacted.get(f"/runs/{run_id}/prompt/{seq}").text
    assert "[private tool result #" in redacted.get(f"/runs/{record.recap}").text
    assert record.secret in whole.get(f"/runs/{record.recap}").text  # the record keeps it; the flag shows it
    result = next(e for e in record.store.events(record.recap, kinds=["tool_result"]))
    assert record.secret not in redacted.get(f"/runs/{record.recap}/events/{result.seq}").text


def test_the_timeline_pages_a_long_record(client: TestClient, record: UiRecord, monkeypatch) -> None:
    monkeypatch.setattr(ui_read, "TIMELINE_PAGE", 10)
    first = client.get(f"/runs/{record.recap}").text
    assert 'id="e10"' in first and 'id="e11"' not in first
    assert f'hx-get="/runs/{record.recap}/timeline?after=10"' in first
    second = client.get(f"/runs/{record.recap}/timeline", params={"after": 10}).text
    assert 'id="e11"' in second and 'id="e20"' in second and 'id="e21"' not in second


def test_the_tokens_chart_has_every_model_call(client: TestClient, record: UiRecord) -> None:
    series = client.get(f"/runs/{record.recap}/tokens.json").json()
    calls = record.store.events(record.recap, kinds=["model_call"])
    x, turn, distil, _cached, budget = series["data"]
    assert x == [e.seq for e in calls]
    for e, t, d in zip(calls, turn, distil, strict=True):
        tokens = e.data["usage"]["input_tokens"]
        assert (t, d) == ((tokens, None) if e.data["purpose"] == "turn" else (None, tokens))
    assert any(d is not None for d in distil) and set(budget) == {500}


def test_the_audit_is_runs_verify(client: TestClient, record: UiRecord, tmp_path: Path) -> None:
    assert 'data-clean="true"' in client.get(f"/runs/{record.recap}/audit").text
    copy = tmp_path / "copy.sqlite"
    with sqlite3.connect(record.path) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    with sqlite3.connect(copy) as db:  # a well-chained turn appended around the store (threat model, reliability.md)
        forged_turn(db, record.recap)
    from loomrt.record.sqlite import SQLiteStore

    tampered = TestClient(create_app(SQLiteStore(copy))).get(f"/runs/{record.recap}/audit").text
    assert 'data-clean="false"' in tampered and "problem" in tampered


def test_children_and_forks_link_to_their_runs(client: TestClient, record: UiRecord) -> None:
    parent = client.get(f"/runs/{record.fanout}").text
    children = record.store.children(record.fanout)
    assert len(children) == 2
    for c in children:
        assert f'href="/runs/{c.run_id}"' in parent
    assert "<h2>Σ</h2>" in parent
    fork = client.get(f"/runs/{record.fork}").text
    assert f'href="/runs/{record.recap}"' in fork


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/runs/no-such-run", 404, "no run &#39;no-such-run&#39;"),
        ("/runs/no-such-run/prompt/3", 404, "no run &#39;no-such-run&#39;"),
        ("/runs/no-such-run/tokens.json", 404, "no run &#39;no-such-run&#39;"),
        ("/runs/no-such-run/audit", 404, "no run &#39;no-such-run&#39;"),
        ("/runs/no-such-run/recall?q=x", 404, "no run &#39;no-such-run&#39;"),
        ("/runs/{recap}/prompt/1", 404, "#1 is not a turn&#39;s model call"),
        ("/runs/{recap}/prompt/x", 400, "seq must be a whole number, not &#39;x&#39;"),
        ("/runs/{recap}/events/99999", 404, "has no event #99999"),
        ("/runs/{recap}/timeline?after=zz", 400, "after must be a whole number"),
        ("/nowhere", 404, "no page at /nowhere"),
    ],
)
def test_bad_input_gets_a_page_that_says_what_is_wrong(client, record, path, status, says) -> None:
    response = client.get(path.format(recap=record.recap))
    assert response.status_code == status
    assert says in response.text and "The runs page" in response.text


def test_the_token_guards_every_page(record: UiRecord) -> None:
    app = guarded(create_app(record.store), host="127.0.0.1", port=8766, token=TOKEN)
    browser = TestClient(app, base_url="http://127.0.0.1:8766")
    assert browser.get("/").status_code == 401
    assert browser.get(f"/runs/{record.recap}").status_code == 401
    assert browser.get("/static/ui.js").status_code == 401
    assert browser.get("/?token=wrong").status_code == 401
    first = browser.get(f"/?token={TOKEN}&mode=fold", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/?mode=fold"  # the token leaves the URL
    assert "HttpOnly" in first.headers["set-cookie"] and "SameSite=Strict" in first.headers["set-cookie"]
    assert browser.get(f"/runs/{record.recap}").status_code == 200  # the cookie carries it now
    other = TestClient(app, base_url="http://127.0.0.1:8766")
    assert other.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    rebinding = TestClient(app, base_url="http://evil.example:8766")
    assert rebinding.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 421
    cross = other.get("/", headers={"Authorization": f"Bearer {TOKEN}", "Origin": "http://evil.example"})
    assert cross.status_code == 403


def test_off_the_loopback_a_token_file_is_required(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="without --token-file"):
        check_ui_listen("0.0.0.0", False, TOKEN)
    with pytest.raises(SpecError, match="at least 32"):
        check_ui_listen("0.0.0.0", True, "short")
    check_ui_listen("0.0.0.0", True, TOKEN)
    check_ui_listen("127.0.0.1", False, TOKEN)
    result = CliRunner().invoke(cli, ["ui", "--host", "0.0.0.0"])
    assert result.exit_code != 0 and "without --token-file" in result.output


def test_every_kind_has_a_title() -> None:
    from loomrt.events import EVENT_KINDS, Event

    for kind in EVENT_KINDS:
        item = ui_timeline.item_of(Event(run_id="r", seq=1, kind=kind, data={}))
        assert item.title and item.seq == 1


def test_recall_returns_what_loomrt_recall_does_and_redacts(record: UiRecord, monkeypatch) -> None:
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "none")  # lexical: no model to load in a quick test
    monkeypatch.setenv("LOOMRT_DB_URL", f"sqlite:{record.path}")
    printed = CliRunner().invoke(cli, ["recall", record.recap, "venue chairs parking", "--json"])
    assert printed.exit_code == 0, printed.output
    expected = [h["seq"] for h in json.loads(printed.stdout)]
    assert expected
    redacted = TestClient(create_app(record.store))
    page = redacted.get(f"/runs/{record.recap}/recall", params={"q": "venue chairs parking"}).text
    assert re.findall(r'<li class="hit" data-seq="(\d+)"', page) == [str(s) for s in expected]
    secret = redacted.get(f"/runs/{record.recap}/recall", params={"q": record.secret}).text
    assert record.secret not in secret and "[private tool result #" in secret
    whole = TestClient(create_app(record.store, include_private=True))
    assert record.secret in whole.get(f"/runs/{record.recap}/recall", params={"q": record.secret}).text
    assert redacted.get(f"/runs/{record.recap}/recall", params={"q": "x", "k": "0"}).status_code == 400


@pytest.mark.slow
def test_loomrt_ui_serves_the_url_it_prints(record: UiRecord, tmp_path: Path) -> None:
    """The command as a user runs it: it prints a URL with this start's token; the URL opens
    the page, and the same page without the token is refused."""
    import http.client
    import os
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "LOOMRT_DB_URL": f"sqlite:{record.path}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "loomrt", "ui", "--port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url = ""
        deadline = time.monotonic() + 60
        while not url and time.monotonic() < deadline:
            line = proc.stderr.readline()
            url = line.strip() if "?token=" in line else ""
        assert url.startswith(f"http://127.0.0.1:{port}/?token="), url
        token = url.split("?token=")[1]

        def get(path: str, **headers: str) -> tuple[int, dict[str, str], str]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read().decode()

        deadline = time.monotonic() + 30
        while True:
            try:
                first = get(url.split(f":{port}")[1])
                break
            except OSError:
                assert time.monotonic() < deadline, "loomrt ui did not answer"
                time.sleep(0.1)
        assert first[0] == 303 and f"loomrt_ui_token_{port}=" in first[1]["set-cookie"]
        assert get("/", Cookie=first[1]["set-cookie"].split(";")[0])[2].count(record.recap) >= 1
        assert record.recap in get("/", Authorization=f"Bearer {token}")[2]
        assert get("/")[0] == 401
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_fold_run_shows_its_card_tree(client: TestClient, record: UiRecord) -> None:
    distillations = record.store.events(record.fold, kinds=["distillation"])
    written = {c["id"]: c for d in distillations for c in d.data.get("cards") or []}
    catalog = [x["card"] for x in distillations[-1].data["context"] if "card" in x]
    page = client.get(f"/runs/{record.fold}").text
    shown = re.findall(r'<details class="card[^"]*" id="card-(\w+)" data-depth="(\d+)"', page)
    assert catalog and [i for i, _ in shown][:1] == catalog[:1]
    below = {i for root in catalog for i in _subtree(root, written)}
    assert {i for i, _ in shown} == below  # every card the catalog reaches, and no other
    for card_id, depth in shown:
        assert int(depth) == written[card_id]["depth"]


def _subtree(card_id: str, cards: dict[str, dict]) -> list[str]:
    return [card_id, *(i for child in cards[card_id]["children"] for i in _subtree(child, cards))]


def test_sigma_at_each_update_with_its_patch(client: TestClient, record: UiRecord) -> None:
    updates = record.store.events(record.fanout, kinds=["state_update"])
    assert updates
    page = client.get(f"/runs/{record.fanout}").text
    for u in updates:
        assert f'hx-get="/runs/{record.fanout}/state/{u.seq}"' in page
        shown = client.get(f"/runs/{record.fanout}/state/{u.seq}").text
        blocks = [json.loads(html.unescape(b)) for b in re.findall(r'<pre class="state[^"]*">(.*?)</pre>', shown, re.S)]
        assert blocks == [u.data["state"], u.data["patch"]]
    assert "No Σ yet at #1" in client.get(f"/runs/{record.fanout}/state/1").text


def test_the_runs_page_filters_by_day(client: TestClient, record: UiRecord) -> None:
    import datetime as dt

    today = dt.date.today()
    assert record.recap in client.get("/runs/rows", params={"from": today.isoformat(), "to": today.isoformat()}).text
    later = (today + dt.timedelta(days=1)).isoformat()
    assert "No run matches" in client.get("/runs/rows", params={"from": later}).text
    earlier = (today - dt.timedelta(days=1)).isoformat()
    assert "No run matches" in client.get("/runs/rows", params={"to": earlier}).text
    bad = client.get("/runs/rows", params={"from": "yesterday"})
    assert bad.status_code == 400 and "from must be a day written YYYY-MM-DD, not &#39;yesterday&#39;" in bad.text


def test_a_record_that_cannot_be_replayed_gets_a_page_not_a_trace(record: UiRecord, monkeypatch) -> None:
    def cannot(*args: object, **kwargs: object) -> None:
        raise KeyError("context")  # as a projection meeting an event it cannot replay

    monkeypatch.setattr(ui_read, "prompt_of", cannot)
    client = TestClient(create_app(record.store), raise_server_exceptions=False)
    seq = _turn_calls(record, record.recap)[-1]
    response = client.get(f"/runs/{record.recap}/prompt/{seq}")
    assert response.status_code == 500
    assert f"could not read /runs/{record.recap}/prompt/{seq}: KeyError" in response.text
    assert "Traceback" not in response.text


def test_children_show_the_sigma_rows_they_handed_up(client: TestClient, record: UiRecord) -> None:
    page = client.get(f"/runs/{record.fanout}").text
    handed = record.store.events(record.fanout, kinds=["spawn_child_result"])
    rows = re.findall(r'<pre class="state child-row">(.*?)</pre>', page, re.S)
    assert handed and sorted(json.dumps(json.loads(html.unescape(r)), sort_keys=True) for r in rows) == sorted(
        json.dumps(e.data["state"], sort_keys=True) for e in handed
    )


def test_a_fork_of_a_fork_names_its_lineage(client: TestClient, record: UiRecord) -> None:
    page = client.get(f"/runs/{record.grandfork}").text
    lineage = page.split('class="lineage">', 1)[1].split("</td>", 1)[0]
    fork_seq = record.store.get_run(record.fork).fork_seq
    assert lineage.index(f'href="/runs/{record.fork}"') < lineage.index(f'href="/runs/{record.recap}"')
    assert f'href="/runs/{record.recap}#e{fork_seq}"' in lineage and "itself a fork of" in lineage


def test_the_pages_read_postgresql_as_they_read_sqlite(record: UiRecord, postgres_url: str) -> None:
    """The same record copied into PostgreSQL (`loomrt db copy`): the same runs, markers,
    prompt and audit (the postgres side is slow by the conftest's rule)."""
    from loomrt.record import default_store
    from loomrt.record.copy import copy_record

    target = default_store(postgres_url)
    copy_record(record.store, target)
    on_sqlite, on_pg = TestClient(create_app(record.store)), TestClient(create_app(target))
    assert record.recap in on_pg.get("/").text
    seq = _turn_calls(record, record.recap)[-1]
    for path in (f"/runs/{record.recap}/prompt/{seq}", f"/runs/{record.fold}", f"/runs/{record.recap}/tokens.json"):
        assert on_pg.get(path).text == on_sqlite.get(path).text, path
    assert 'data-clean="true"' in on_pg.get(f"/runs/{record.recap}/audit").text
    target.close()


def test_recall_searches_one_source_when_asked(client: TestClient, record: UiRecord, monkeypatch) -> None:
    monkeypatch.setenv("LOOMRT_RECALL_EMBEDDER", "none")
    url = f"/runs/{record.fork}/recall"
    every = client.get(url, params={"q": "venue chairs parking", "k": 20}).text
    sources = re.findall(r"</a> · (run|family) · score", every)
    assert {"run", "family"} <= set(sources), sources  # the fork evicted its own turns and shares its parent's
    for source in ("run", "family"):
        only = client.get(url, params={"q": "venue chairs parking", "k": 20, "source": source}).text
        assert set(re.findall(r"</a> · (\w+) · score", only)) == {source}
    assert client.get(url, params={"q": "x", "source": "memory"}).status_code == 400


def test_the_timeline_tails_a_run_that_moves(tmp_path: Path) -> None:
    from loomrt.events import RunInfo
    from loomrt.record.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "record.sqlite")
    store.create_run(RunInfo(run_id="moving", agent="a", def_hash="h", mode="recap", model="m"))
    store.append("moving", "user_input", {"content": "first"})
    client = TestClient(create_app(store))
    page = client.get("/runs/moving").text
    assert 'class="live" data-after="1" hx-get="/runs/moving/timeline?after=1" hx-trigger="every 2s"' in page
    quiet = client.get("/runs/moving/timeline", params={"after": 1}).text
    assert 'id="e' not in quiet and 'data-after="1"' in quiet  # nothing new: the tail asks again from #1
    store.append("moving", "user_input", {"content": "second, from another process"})
    moved = client.get("/runs/moving/timeline", params={"after": 1}).text
    assert 'id="e2"' in moved and "second, from another process" in moved and 'data-after="2"' in moved


def test_a_fold_fork_shows_the_cards_it_shares_with_its_family(client: TestClient, record: UiRecord) -> None:
    parent = client.get(f"/runs/{record.fold}").text
    fork = client.get(f"/runs/{record.fold_fork}").text
    tree = r'<details class="card[^"]*" id="card-(\w+)" data-depth="(\d+)"'
    assert re.findall(tree, fork) == re.findall(tree, parent) != []  # forked at the end: the whole catalog
    assert "the family's" in fork and "the family's" not in parent  # read from the card index
    covered = re.findall(r'covers <a href="([^"]+)">', fork)
    assert covered and all(h.startswith(f"/runs/{record.fold}#e") for h in covered)  # the parent's page holds them


def test_a_forks_shared_history_links_to_the_page_that_holds_it(client: TestClient, record: UiRecord) -> None:
    fork_seq = record.store.get_run(record.fork).fork_seq
    assert fork_seq is not None
    seq = _turn_calls(record, record.fork)[0]
    page = client.get(f"/runs/{record.fork}/prompt/{seq}").text
    links = re.findall(r'<a href="/runs/(\w+)#e(\d+)">', page)
    assert links
    for owner, at in links:
        assert owner == (record.recap if int(at) <= fork_seq else record.fork), (owner, at)
    assert {o for o, _ in links} == {record.recap, record.fork}


def test_what_the_model_saw_reads_the_record_up_to_the_call(record: UiRecord) -> None:
    from loomrt.bench.ui_measure import CountingStore

    counting = CountingStore(record.store)
    client = TestClient(create_app(counting))
    client.get(f"/runs/{record.recap}")  # the private judgement, kept for this state of the record
    first = _turn_calls(record, record.recap)[0]
    counting.count()
    assert client.get(f"/runs/{record.recap}/prompt/{first}").status_code == 200
    read = counting.count()["events_read"]
    assert read <= first + 1, read  # the events up to the call (and the run_started that names the tools)
