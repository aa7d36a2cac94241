"""The status service's pieces without a server: the answer cache, which archive files are
served (hostile names, symlinks), content types and the page's text."""

from __future__ import annotations

import gzip
import os
import re
import threading
import time
from pathlib import Path

import pytest

from cluster.console import answers, archivefiles, httpd, page
from cluster.console.answers import Answer, TtlCache
from cluster.console.archivefiles import ArchiveRefused
from cluster.home import Home

RUN = "20261123120000-p0-ab12"


# ------------------------------------------------------------------------------ the cache
class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_answer_is_made_once_per_ttl() -> None:
    clock = FakeClock()
    cache = TtlCache(ttl=0.5, clock=clock)
    made: list[int] = []

    def make() -> Answer:
        made.append(1)
        return Answer(200, str(len(made)).encode())

    assert cache.get("status", make).body == b"1"
    clock.now += 0.4
    assert cache.get("status", make).body == b"1"  # still fresh
    clock.now += 0.2
    assert cache.get("status", make).body == b"2"  # 0.6 s old: made again
    assert cache.get("other", make).body == b"3"   # another key has its own entry
    assert cache.made == 3


def test_concurrent_clients_wait_for_one_make() -> None:
    cache = TtlCache(ttl=5.0)
    calls = 0
    lock = threading.Lock()

    def make() -> Answer:
        nonlocal calls
        with lock:
            calls += 1
        time.sleep(0.2)  # a slow read of the home: everyone else waits for it
        return Answer(200, b"snap")

    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get("status", make).body))
               for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [b"snap"] * 20
    assert calls == 1


def test_a_failed_make_is_not_cached_and_the_oldest_entry_goes_first() -> None:
    clock = FakeClock()
    cache = TtlCache(ttl=10, max_entries=2, clock=clock)

    def boom() -> Answer:
        raise OSError("disk gone")

    with pytest.raises(OSError):
        cache.get("a", boom)
    assert cache.get("a", lambda: Answer(200, b"a")).body == b"a"
    clock.now += 1
    cache.get("b", lambda: Answer(200, b"b"))
    clock.now += 1
    cache.get("c", lambda: Answer(200, b"c"))
    # "a" was dropped (the oldest); "b" and "c" are still served from the cache.
    assert cache.get("a", lambda: Answer(200, b"a2")).body == b"a2"
    assert cache.get("c", lambda: Answer(200, b"c2")).body == b"c"


def test_in_the_background_a_stale_value_is_served_while_one_thread_makes_the_next() -> None:
    clock = FakeClock()
    cache: TtlCache[str] = TtlCache(ttl=0.5, clock=clock)
    started = threading.Event()
    release = threading.Event()
    made: list[str] = []

    def slow() -> str:
        made.append("x")
        if len(made) > 1:
            started.set()
            release.wait(10)
        return f"v{len(made)}"

    assert cache.get("k", slow, background=True) == "v1"  # the first waits: nothing to serve
    clock.now += 1
    began = time.monotonic()
    assert cache.get("k", slow, background=True) == "v1"  # stale, at once
    assert started.wait(10) and time.monotonic() - began < 5
    assert cache.get("k", slow, background=True) == "v1"  # still refreshing: no second maker
    assert len(made) == 2
    release.set()
    deadline = time.monotonic() + 10
    while cache.get("k", slow, background=True) != "v2" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cache.get("k", slow, background=True) == "v2" and len(made) == 2


def test_after_a_quiet_spell_the_value_is_made_again_before_the_answer() -> None:
    """A value older than max_stale (four ttl) is never served, even in the background."""
    clock = FakeClock()
    cache: TtlCache[str] = TtlCache(ttl=0.5, clock=clock)
    made: list[str] = []

    def make() -> str:
        made.append("x")
        return f"v{len(made)}"

    assert cache.get("k", make, background=True) == "v1"
    clock.now += 60  # nobody asked for a minute
    assert cache.get("k", make, background=True) == "v2"  # made now, not the old one
    assert len(made) == 2


def test_a_failing_background_refresh_keeps_the_stale_value() -> None:
    clock = FakeClock()
    cache: TtlCache[str] = TtlCache(ttl=0.5, clock=clock)
    cache.get("k", lambda: "old")
    clock.now += 1

    def boom() -> str:
        raise OSError("disk gone")

    assert cache.get("k", boom, background=True) == "old"
    deadline = time.monotonic() + 10
    while cache._refreshing and time.monotonic() < deadline:  # noqa: SLF001 -- its end
        time.sleep(0.01)
    assert cache.get("k", boom, background=True) == "old"


def test_big_answers_are_also_kept_gzipped() -> None:
    small = answers.json_answer({"a": 1}, compress=True)
    assert small.gzipped is None
    value = {"nodes": [{"name": f"n{i}", "caps": "os=Linux cpus=8"} for i in range(200)]}
    big = answers.json_answer(value, compress=True)
    assert big.gzipped is not None and len(big.gzipped) < len(big.body) / 5
    assert gzip.decompress(big.gzipped) == big.body
    assert answers.json_answer(value).gzipped is None


# ------------------------------------------------------------------------------ archive files
@pytest.fixture
def home(tmp_path: Path) -> Home:
    home = Home(tmp_path / "home")
    home.create()
    folder = home.archive / RUN
    (folder / "bmpcmp" / "set1").mkdir(parents=True)
    (folder / "logs").mkdir()
    (folder / "report.txt").write_text("the report\n")
    (folder / f"{RUN}.tab").write_text("t\t0\n")
    (folder / "run.info").write_text(f"id {RUN}\n")
    (folder / "logs" / "node1.log").write_text("log\n")
    (folder / "bmpcmp" / "index.html").write_text("<html></html>")
    (folder / "junit.xml").write_text("<testsuites/>")
    (folder / "result.json").write_text("{}")
    (folder / "bmpcmp" / "set1" / "a.diff.png").write_bytes(b"\x89PNG")
    (folder / "results" / "t1").mkdir(parents=True)
    (folder / "results" / "t1" / "out.csv").write_text("1,2\n")
    (folder / "collected").mkdir()
    (folder / "collected" / "all.csv").write_text("1,2\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    (home.root / "cluster.secret").write_text("key\n")
    return home


@pytest.mark.parametrize("rest", [
    f"{RUN}/report.txt", f"{RUN}/{RUN}.tab", f"{RUN}/bmpcmp/index.html",
    f"{RUN}/bmpcmp/set1/a.diff.png", f"{RUN}/junit.xml", f"{RUN}/result.json",
    f"{RUN}/results/t1/out.csv", f"{RUN}/collected/all.csv"])
def test_the_report_table_and_bmpcmp_files_are_served(home: Home, rest: str) -> None:
    assert archivefiles.resolve(home, rest) == (home.archive / rest).resolve()


def test_fetch_lists_exactly_the_files_the_page_serves(home: Home, tmp_path: Path) -> None:
    folder = home.archive / RUN
    (folder / "results" / "escape").symlink_to(tmp_path / "outside.txt")
    (folder / "results" / ".partial").write_text("x")
    names = [rel for rel, _ in archivefiles.fetchable(home, RUN)]
    assert names == [f"{RUN}.tab", "bmpcmp/index.html", "bmpcmp/set1/a.diff.png",
                     "collected/all.csv", "junit.xml", "report.txt", "result.json",
                     "results/t1/out.csv"]
    for rel in names:
        archivefiles.resolve(home, f"{RUN}/{rel}")
    with pytest.raises(ArchiveRefused):
        archivefiles.fetchable(home, "20990101000000-p0-none")


@pytest.mark.parametrize("rest", [
    f"{RUN}/run.info", f"{RUN}/logs/node1.log", f"{RUN}/other.tab", f"{RUN}/bmpcmp",
    f"{RUN}/bmpcmp/set1", f"{RUN}/bmpcmp/missing.png", "20990101000000-p0-none/report.txt",
    RUN, f"{RUN}/"])
def test_other_archive_files_and_missing_ones_are_404(home: Home, rest: str) -> None:
    with pytest.raises(ArchiveRefused) as refused:
        archivefiles.resolve(home, rest)
    assert refused.value.status == 404
    assert "archive/" in refused.value.message


@pytest.mark.parametrize("rest, named", [
    ("../cluster.secret", "'..'"),
    (f"{RUN}/../../cluster.secret", "'..'"),
    (f"{RUN}/bmpcmp/../report.txt", "'..'"),
    (f"{RUN}/./report.txt", "'.'"),
    (f"{RUN}//report.txt", "''"),
    (f"{RUN}/bmpcmp/.hidden", "'.hidden'"),
    (f"{RUN}/bmpcmp\\..\\report.txt", "backslash"),
    (f"{RUN}/report.txt\x00.png", "control"),
    ("..%2f/report.txt", "run id"),
    ("/etc/passwd", "run id"),
    ("a b/report.txt", "run id"),
    ("x" * 65 + "/report.txt", "run id"),
    (f"{RUN}/" + "a/" * 600 + "x", "at most"),
])
def test_hostile_paths_are_400_naming_the_bad_part(home: Home, rest: str, named: str) -> None:
    with pytest.raises(ArchiveRefused) as refused:
        archivefiles.resolve(home, rest)
    assert refused.value.status == 400
    assert named in refused.value.message


def test_symlinks_out_of_the_run_folder_are_not_followed(home: Home, tmp_path: Path) -> None:
    folder = home.archive / RUN
    (folder / "report.txt").unlink()
    os.symlink(tmp_path / "outside.txt", folder / "report.txt")
    os.symlink(home.root / "cluster.secret", folder / "bmpcmp" / "key.png")
    os.symlink(tmp_path, folder / "bmpcmp" / "up")
    other = tmp_path / "elsewhere"
    (other / "bmpcmp").mkdir(parents=True)
    (other / "report.txt").write_text("not archived here\n")
    os.symlink(other, home.archive / "20261123130000-p0-link")
    for rest in (f"{RUN}/report.txt", f"{RUN}/bmpcmp/key.png", f"{RUN}/bmpcmp/up/outside.txt",
                 "20261123130000-p0-link/report.txt"):
        with pytest.raises(ArchiveRefused) as refused:
            archivefiles.resolve(home, rest)
        assert refused.value.status == 404, rest


def test_a_symlink_inside_the_run_folder_is_served(home: Home) -> None:
    folder = home.archive / RUN
    os.symlink("../report.txt", folder / "bmpcmp" / "report-copy.txt")
    assert archivefiles.resolve(home, f"{RUN}/bmpcmp/report-copy.txt") == \
        (folder / "report.txt").resolve()


@pytest.mark.parametrize("name, expected", [
    ("report.txt", "text/plain; charset=utf-8"), (f"{RUN}.tab", "text/plain; charset=utf-8"),
    ("index.html", "text/html; charset=utf-8"), ("x.diff.PNG", "image/png"),
    ("x.ppm", "image/x-portable-pixmap"), ("x.bin", "application/octet-stream"),
    ("noext", "application/octet-stream")])
def test_content_types(name: str, expected: str) -> None:
    assert archivefiles.content_type(Path(name)) == expected


# ------------------------------------------------------------------------------ the page
def test_the_page_loads_nothing_from_elsewhere() -> None:
    text = page.render()
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text)
    assert not re.search(r"url\(|@import|<link|<script\s+src", text)
    assert "http://" not in text and "https://" not in text
    assert text.count("<script>") == 1 and text.count("<style>") == 1


def test_the_page_has_the_hooks_scripts_rely_on() -> None:
    text = page.render(poll_seconds=2.0)
    for hook in ('id="running-list"', 'id="queue-rows"', 'id="node-rows"', 'id="recent-rows"',
                 'id="detail"', 'id="conn"', "link-report", "link-tab", "link-bmpcmp",
                 '"data-state": state', "dataset.polls", '"api/status"', '"api/runs/"',
                 'id="provision"', '"provision-job mono"', '"data-field": "batch-job"',
                 '"data-field": "trouble"', '"data-field": "stale"'):
        assert hook in text, hook
    assert "const POLL_MS = 2000;" in text
    assert "innerHTML" not in text  # values from the home go in as text only


def test_the_port_taken_message_names_address_and_port() -> None:
    message = httpd.port_taken_message(("127.0.0.1", 9020))
    assert "127.0.0.1:9020" in message and "status_port" in message
