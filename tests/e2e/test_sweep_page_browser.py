"""The status page's per-run view of an ended sweep, in a real headless Chromium.

No cluster runs: the home holds one archived sweep run made by the real end step from tries
and result folders laid out as the master's intake leaves them
(:mod:`tests.component.test_sweep_end`).  The real status server (``httpd.run``) serves it;
Chromium opens ``#run=<id>`` and must show the failed parameter sets, with their values, in
task order.  Skipped without chromium and chromedriver, except under CI (the fixture of
:mod:`tests.e2e.test_status_page_browser`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from cluster import configfile
from cluster.console import httpd
from cluster.console.httpd import StatusServer
from cluster.home import Home
from tests.component.test_sweep_end import RUN1, archived_run
from tests.e2e.test_status_page_browser import browser, until  # noqa: F401 (the fixture)
from tests.helpers import free_port, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def served_sweep(tmp_path: Path) -> Iterator[int]:
    """A home with the archived sweep run, served on a free port; yields the port."""
    home = Home(tmp_path / "home")
    home.create()
    archived_run(home)
    cfg = configfile.load(None, {"home": str(home.root), "status_port": str(free_port())})
    stop = threading.Event()
    ready: list[StatusServer] = []
    thread = threading.Thread(target=httpd.run, args=(home, cfg, stop.is_set, 0.05,
                                                      ready.append), daemon=True)
    thread.start()
    wait_for(lambda: ready, 10, "the status server to listen")
    yield cfg.status_port
    stop.set()
    thread.join(timeout=10)


def test_the_per_run_view_lists_an_ended_sweeps_failed_parameter_sets(
        browser: WebDriver, served_sweep: int) -> None:  # noqa: F811 (the fixture)
    browser.get(f"http://127.0.0.1:{served_sweep}/#run={RUN1}")
    until(browser, "the sweep's failed parameter sets",
          lambda b: b.find_element(By.CSS_SELECTOR,
                                   '#sweep-failed [data-field="not-ok"]').text == "3")
    rows = browser.find_elements(By.CSS_SELECTOR, "#sweep-failed tr.sweep-failed")
    assert [r.get_attribute("data-seq") for r in rows] == ["3", "4", "6"]
    cells = [[c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in rows]
    assert cells == [["#3", "a=x b=3", "failed: exit status 2", "n1"],
                     ["#4", "a=a/b b=4", "timeout", "n1"],
                     ["#6", "a=x b=6", "failed: not run", "-"]]
