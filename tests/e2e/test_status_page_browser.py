"""End to end: a real headless Chromium at the status page during a live run.

A local cluster (master, monitor, status service, two nodes on loopback) runs a product shell
run of slow jobs (each sleeps); a second push waits behind it.  Chromium (Debian's
``chromium`` driven through ``chromedriver`` by selenium) opens the page that
``clusterstatus.py`` serves and, reading only what the page shows:

* sees the run, both nodes taking part, and its done count grow between two looks, and the
  second push waiting in the queue (a screenshot is taken then);
* after both processes of node2 (clusterpull and its run.py) are SIGKILLed, sees node2
  "down since" (``node_down_after`` is set to a few seconds for the test);
* sees the finished run among the recent runs, follows its report link and finds the
  report's text, and opens the per-run view: which node ran which tests.

The screenshot goes to the test's temporary folder, and also to ``$STATUS_PAGE_SCREENSHOT``
when that is set (how docs/status-page.png is made).  Without chromium or chromedriver the
test is skipped, except under CI (``CI=true``), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from cluster.demotree import write_demo_tree
from tests.e2e.conftest import MakeCluster
from tests.helpers import free_port

pytestmark = pytest.mark.e2e

#: The run: this many jobs, each sleeping JOB_SECONDS, on two one-slot nodes.
JOBS = 60
JOB_SECONDS = 0.5
#: A node not heard from for this long shows as down (the default is 300 s).
DOWN_AFTER = 5
#: Generous bounds for a 2-core machine shared with other tests [seconds].
PAGE_TIMEOUT = 60
RUN_TIMEOUT = 300

T = TypeVar("T")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        missing = "chromium" if chromium is None else "chromedriver"
        message = f"{missing} is not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: {message}")
        pytest.skip(message)
    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--no-first-run", "--disable-extensions",
                     "--window-size=1400,1250", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(argument)
    service = Service(executable_path=driver, log_output=str(tmp_path / "chromedriver.log"))
    browser = webdriver.Chrome(service=service, options=options)
    try:
        yield browser
    finally:
        browser.quit()


def until(browser: WebDriver, what: str, check: Callable[[WebDriver], T],
          timeout: float = PAGE_TIMEOUT) -> T:
    """``check(browser)`` once it is true; a failure names ``what`` (the page re-draws
    every 2 s, so an element read a moment ago may be gone: that counts as not yet)."""
    def guarded(b: WebDriver) -> Any:
        try:
            return check(b)
        except (StaleElementReferenceException, WebDriverException):
            return False
    return WebDriverWait(browser, timeout, poll_frequency=0.2).until(
        guarded, message=f"the page did not show {what} within {timeout} s")


def field(browser: WebDriver, css: str) -> str:
    return browser.find_element(By.CSS_SELECTOR, css).text


def done_count(browser: WebDriver, run_id: str) -> int:
    return int(field(browser, f'#running .run[data-run="{run_id}"] [data-field="done"]'))


def polls(browser: WebDriver) -> int:
    return int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-polls") or 0)


def kill_node(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def slow_corpus(root: Path) -> Path:
    corpus = root / "slow"
    corpus.mkdir()
    (corpus / "jobs.cmds").write_text(
        "".join(f"sleep {JOB_SECONDS}; echo job {i}\n" for i in range(1, JOBS + 1)))
    return corpus


def test_the_page_follows_a_live_run_a_dead_node_and_the_report(
        make_cluster: MakeCluster, browser: WebDriver, tmp_path: Path) -> None:
    cluster = make_cluster(corpus=slow_corpus(tmp_path), status_port=str(free_port()),
                           node_down_after=str(DOWN_AFTER))
    cluster.start()
    url = cluster.wait_for_status_page()
    tree = write_demo_tree(cluster.home_dir / "demo" / "shell", "shell", [])
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["shell"], [])
    browser.get(url)

    # The run, under way: its id as the page shows it, and a first look at its count.
    run_id = until(browser, "a running run with results", lambda b: next(
        (el.get_attribute("data-run") for el in b.find_elements(By.CSS_SELECTOR, "#running .run")
         if int(el.find_element(By.CSS_SELECTOR, '[data-field="done"]').text) > 0), None))
    assert run_id is not None
    card = f'#running .run[data-run="{run_id}"]'
    assert field(browser, f"{card} .what") == spec.line()
    assert field(browser, f'{card} [data-field="total"]') == str(JOBS)
    first = done_count(browser, run_id)
    # A second push of the same user (another tree) waits behind it in the queue: a user
    # lane serves only a user with no run served (docs/runoptions.md, "Fair share").
    cluster.push(write_demo_tree(cluster.home_dir / "demo" / "bob", "shell", []), "tester",
                 ["shell"], ["tree=bob"])
    # Both nodes take part, and the count grows between two looks.
    until(browser, "both nodes in the run", lambda b: {
        el.get_attribute("data-node") for el in b.find_elements(By.CSS_SELECTOR,
                                                                f"{card} .run-node")}
        == {"node1", "node2"})
    second = until(browser, "the done count grow", lambda b: (n := done_count(b, run_id)) > first
                   and n)
    assert first < second < JOBS
    for node in ("node1", "node2"):
        row = f'#nodes tr.node[data-node="{node}"]'
        assert browser.find_element(By.CSS_SELECTOR, row).get_attribute("data-state") == "up"
        until(browser, f"{node} working in the run",
              lambda b, row=row: field(b, f'{row} [data-field="run"]') == run_id)
    until(browser, "the second push waiting", lambda b: any(
        "user tester shell tree=bob" in el.text and "waiting" in el.text
        for el in b.find_elements(By.CSS_SELECTOR, "#queues tr.queued")))
    shot = tmp_path / "status-page.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("STATUS_PAGE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["STATUS_PAGE_SCREENSHOT"])

    # node2 dies: its clusterpull and its run.py (and the job they run).
    root = psutil.Process(cluster.node_procs["node2"].pid)
    kill_node([root, *root.children(recursive=True)])
    node2 = '#nodes tr.node[data-node="node2"]'
    until(browser, "node2 down", lambda b: b.find_element(By.CSS_SELECTOR, node2)
          .get_attribute("data-state") == "down")
    assert field(browser, f'{node2} [data-field="state"]').startswith("down since ")
    assert browser.find_element(By.CSS_SELECTOR, '#nodes tr.node[data-node="node1"]'
                                ).get_attribute("data-state") == "up"

    # The run ends on node1; the page lists it among the recent runs, with its report.
    archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    assert archive.name == run_id
    report = (archive / "report.txt").read_text()
    row = f'#recent tr.recent[data-run="{run_id}"]'
    until(browser, "the finished run among the recent runs",
          lambda b: b.find_elements(By.CSS_SELECTOR, row))
    assert field(browser, f"{row} td:nth-child(3)") == spec.line()
    assert browser.find_elements(By.CSS_SELECTOR, f"{row} a.link-tab")
    report_link = browser.find_element(By.CSS_SELECTOR, f"{row} a.link-report")
    assert report_link.get_attribute("href") == f"{url}archive/{run_id}/report.txt"
    report_link.click()
    until(browser, "the report", lambda b: b.current_url.endswith("/report.txt")
          and b.find_element(By.TAG_NAME, "body").text.strip())
    shown = browser.find_element(By.TAG_NAME, "body").text
    assert [line.rstrip() for line in shown.strip().splitlines()] == \
        [line.rstrip() for line in report.strip().splitlines()]
    assert f"ran {JOBS} tests in" in shown

    # The per-run view: which node ran which tests (node1 ran the most: it outlived node2).
    browser.get(f"{url}#run={run_id}")
    detail = f'#detail[data-run="{run_id}"][data-state="finished"]'
    until(browser, "the per-run view", lambda b: b.find_elements(By.CSS_SELECTOR, detail))
    counts = {el.get_attribute("data-node"): int(el.find_element(
        By.CSS_SELECTOR, '[data-field="count"]').text)
        for el in browser.find_elements(By.CSS_SELECTOR, f"{detail} .detail-node")}
    assert sum(counts.values()) == JOBS and counts["node1"] > counts.get("node2", 0)
    assert browser.find_elements(By.CSS_SELECTOR, f"{detail} tr.failed") == []
