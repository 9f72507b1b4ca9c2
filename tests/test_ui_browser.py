"""``loomrt ui`` in a real browser: Debian's headless Chromium, driven by Selenium through the
system's chromium-driver (Playwright's own browser download cannot run here). It opens the
runs page, a distilled recap run, its fork, the fold demo and the fan-out's stateful parent;
checks the distillation markers, that "what the model saw" after a distillation is what
``runs show --prompt`` prints, that the private result is redacted, that the chart and the
audit render, and that a request without the token is refused.

With ``LOOMRT_UI_SCREENSHOTS=DIR`` it saves each page as a PNG there (docs/ui.md's pictures:
``LOOMRT_UI_SCREENSHOTS=docs/ui pytest tests/test_ui_browser.py``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner
from ui_kit import UiRecord, ui_record

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
TOKEN = "b" * 43


def _browser_or_skip() -> tuple[str, str]:
    if CHROMIUM and DRIVER:
        return CHROMIUM, DRIVER
    why = "no chromium and chromium-driver on PATH (apt-get install -y chromium chromium-driver)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the browser test must run in CI: {why}")
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> UiRecord:
    return ui_record(tmp_path_factory.mktemp("ui-browser"))


@pytest.fixture(scope="module")
def server(record: UiRecord) -> Iterator[str]:
    pytest.importorskip("uvicorn")
    import uvicorn

    from loomrt.ui.access import guarded
    from loomrt.ui.app import create_app

    port = _free_port()
    app = guarded(create_app(record.store), host="127.0.0.1", port=port, token=TOKEN)
    served = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not served.started:
        assert time.monotonic() < deadline, "the UI server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    served.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver = _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1100"):
        options.add_argument(flag)
    b = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    yield b
    b.quit()


def _wait(browser: Any, css: str, timeout: float = 15) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def _shot(browser: Any, name: str, height: int = 1100) -> None:
    folder = os.environ.get("LOOMRT_UI_SCREENSHOTS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    browser.set_window_size(1400, height)
    time.sleep(0.3)
    browser.save_screenshot(str(Path(folder) / f"{name}.png"))
    browser.set_window_size(1400, 1100)


def test_a_request_without_the_token_is_refused(browser: Any, server: str) -> None:
    browser.delete_all_cookies()
    browser.get(server + "/")
    assert "a valid bearer token is required" in browser.page_source
    assert "Runs" not in browser.title


def test_the_runs_page_and_a_distilled_recap_run(browser: Any, server: str, record: UiRecord, monkeypatch) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/?token={TOKEN}")
    assert "token=" not in browser.current_url  # the token left the address bar for a cookie
    _wait(browser, "table.runs")
    listed = {a.text for a in browser.find_elements(By.CSS_SELECTOR, "table.runs td.id a")}
    assert {record.recap, record.fork, record.fold, record.fanout} <= listed
    _shot(browser, "runs", 700)

    browser.get(f"{server}/runs/{record.recap}")
    markers = browser.find_elements(By.CSS_SELECTOR, "#timeline li.ev.distil")
    distillations = record.store.events(record.recap, kinds=["distillation"])
    assert [m.get_attribute("id") for m in markers] == [f"e{d.seq}" for d in distillations]
    assert len(markers) >= 2
    assert record.secret not in browser.page_source
    private = browser.find_elements(By.CSS_SELECTOR, "#timeline li.ev.private")
    assert private and "[private tool result #" in private[0].text

    audit = _wait(browser, "#audit .verdict")
    assert audit.get_attribute("data-clean") == "true", audit.text
    chart = _wait(browser, "#chart canvas")
    calls = record.store.events(record.recap, kinds=["model_call"])
    assert chart and browser.find_element(By.ID, "chart").get_attribute("data-points") == str(len(calls))

    after = next(
        e.seq for e in calls if e.seq > distillations[0].seq and e.data.get("prompt_from") == "context"
    )  # the first turn call after a distillation
    browser.find_element(By.CSS_SELECTOR, f"#e{after} button.saw").click()
    _wait(browser, f'#saw .prompt[data-seq="{after}"]')
    shown = [p.get_attribute("textContent") for p in browser.find_elements(By.CSS_SELECTOR, "#saw pre.content")]
    from loomrt.cli.app import app as cli

    monkeypatch.setenv("LOOMRT_DB_URL", f"sqlite:{record.path}")
    printed = CliRunner().invoke(cli, ["runs", "show", record.recap, "--prompt", str(after), "--json"])
    assert printed.exit_code == 0, printed.output
    assert shown == [m["content"] for m in json.loads(printed.output)["prompt"]]
    kinds = [p.get_attribute("data-kind") for p in browser.find_elements(By.CSS_SELECTOR, "#saw div.part")]
    assert "distilled" in kinds and kinds[0] == "head"
    browser.execute_script("window.scrollTo(0, 0)")
    _shot(browser, "run", 1300)
    browser.execute_script(f"document.getElementById('e{distillations[0].seq}').scrollIntoView()")
    browser.find_element(By.CSS_SELECTOR, f"#e{distillations[0].seq} details summary").click()
    _shot(browser, "saw", 1100)


def test_a_fork_a_fold_run_and_a_stateful_parent_with_children(browser: Any, server: str, record: UiRecord) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/?token={TOKEN}")
    browser.get(f"{server}/runs/{record.fork}")
    assert browser.find_element(By.CSS_SELECTOR, f'table.facts a[href="/runs/{record.recap}"]')
    assert record.secret not in browser.page_source  # the parent's private result, in the fork's shared history
    browser.get(f"{server}/runs/{record.fold}")
    assert browser.find_elements(By.CSS_SELECTOR, "#timeline li.ev.distil")
    root = browser.find_element(By.CSS_SELECTOR, "section.cards > details.card")
    root.find_element(By.TAG_NAME, "summary").click()  # open the root card: the cards it rolls up show
    assert root.find_element(By.CSS_SELECTOR, "details.card").is_displayed()
    _shot(browser, "fold", 1300)
    browser.get(f"{server}/runs/{record.fold_fork}")  # a fork of the fold run: the family's cards
    shared = browser.find_elements(By.CSS_SELECTOR, "section.cards > details.card")
    assert shared and "the family's" in shared[0].find_element(By.TAG_NAME, "summary").text
    browser.get(f"{server}/runs/{record.fanout}")
    children = record.store.children(record.fanout)
    for c in children:
        assert browser.find_element(By.CSS_SELECTOR, f'.panel a[href="/runs/{c.run_id}"]')
    assert "<h2>Σ</h2>" in browser.page_source
    _shot(browser, "stateful", 1100)
