"""The status page's provisioner block in a real headless Chromium (docs/provisioning.md).

The real status service (:func:`cluster.console.httpd.run`, in a thread) serves a home with
a ``provision.json`` as clusterscale writes it, a node that Slurm job 41 runs, and hostile
texts (a job's reason and the trouble message carry HTML); Chromium (selenium and
chromedriver, as tests/e2e/test_status_page_browser.py) shows "from Slurm: wanted W,
pending P, running R", each job, the trouble and the node's Slurm job id, the HTML as text.
The file rewritten stale says the provisioner is not running; removed, the block goes.
Without chromium or chromedriver the test is skipped, except under CI (``CI=true``).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from cluster import configfile
from cluster.console import httpd
from cluster.console.httpd import StatusServer
from cluster.home import Home
from cluster.wire.provision import ProvisionJob, ProvisionStatus, format_status
from tests.e2e.test_status_page_browser import browser, field, until
from tests.helpers import free_port, wait_for
from tests.unit.test_console_status import heartbeat

__all__ = ["browser"]  # the fixture, used by name

HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1">'
TROUBLE = ("sbatch: exit status 1: sbatch: error: Batch job submission failed: Invalid "
           "partition name specified " + HOSTILE)


def look(written: float) -> ProvisionStatus:
    return ProvisionStatus(
        written=written, pid=4242, engine="Slurm", interval=10.0, wanted=3, pending=1,
        running=1, jobs=(ProvisionJob("41", "slurm-node", "slurm-41", "running"),
                         ProvisionJob("42", "slurm-node", "slurm-42", "pending",
                                      "PartitionDown " + HOSTILE)),
        action="wanted 3 pending 1 running 1: ...", trouble=TROUBLE)


@pytest.fixture
def page(tmp_path: Path) -> Iterator[tuple[Home, str]]:
    """The status service on a home with the file and a node of job 41; its page URL."""
    home = Home(tmp_path / "home")
    home.create()
    heartbeat(home, "slurm-41", time.time())
    home.provision_status.write_text(format_status(look(time.time())), encoding="utf-8")
    cfg = configfile.load(None, {"home": str(home.root), "status_port": str(free_port())})
    stop = threading.Event()
    ready: list[StatusServer] = []
    thread = threading.Thread(target=httpd.run, args=(home, cfg, stop.is_set, 0.05,
                                                      ready.append), daemon=True)
    thread.start()
    wait_for(lambda: ready, 10, "the status server to listen")
    yield home, f"http://127.0.0.1:{cfg.status_port}/"
    stop.set()
    thread.join(timeout=10)


def test_the_page_shows_the_provisioners_look_and_each_nodes_slurm_job(
        page: tuple[Home, str], browser: WebDriver) -> None:
    home, url = page
    browser.get(url)
    until(browser, "the provisioner's summary",
          lambda b: field(b, '#provision [data-field="summary"]').startswith(
              "from Slurm: wanted 3, pending 1, running 1"))
    box = browser.find_element(By.ID, "provision")
    assert box.get_attribute("data-state") == "trouble"
    assert field(browser, '#provision [data-field="trouble"]') == f"trouble: {TROUBLE}"
    assert field(browser, '#provision li.provision-job[data-job="41"]') == \
        "slurm-41 (Slurm job 41) running"
    pending = browser.find_element(By.CSS_SELECTOR, '#provision li[data-job="42"]')
    assert pending.get_attribute("data-state") == "pending"
    assert pending.text == f"slurm-42 (Slurm job 42) pending: PartitionDown {HOSTILE}"
    assert field(browser, 'tr.node[data-node="slurm-41"] [data-field="batch-job"]') == \
        "Slurm job 41"
    # The HTML in the texts stayed text: no element was made of it, no handler ran.
    assert browser.find_elements(By.CSS_SELECTOR, "#provision img") == []
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-pwned") is None

    home.provision_status.write_text(format_status(look(time.time() - 45)), encoding="utf-8")
    until(browser, "the provisioner as not running",
          lambda b: b.find_element(By.ID, "provision").get_attribute("data-state") == "stale")
    said = re.fullmatch(r"the provisioner is not running: provision\.json was written "
                        r"([0-9]+) s ago \(more than 3 x 10 s\)",
                        field(browser, '#provision [data-field="stale"]'))
    assert said and 45 <= int(said.group(1)) < 45 + 60, said

    home.provision_status.unlink()
    until(browser, "no provisioner block",
          lambda b: not b.find_element(By.ID, "provision").is_displayed())
