"""A full disk at the end of a run leaves the previous tables whole, and one at a master's
start makes it wait with one line (a real full tmpfs).

The master home is on a small tmpfs mounted for the test.  When the run ends, the disk is
filled so that the new baseline cannot be written: the master says so and leaves the run's
end record; the tables are byte for byte what they were, with no temporary files beside
them.  Once there is room again, the next clustermaster finishes the run: one archive and
one rotation.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.master.files import ending
from cluster.master.run import invocation
from cluster.queue import QueueFile
from cluster.records import Job
from cluster.report.tab import read_tab
from cluster.wire import protocol
from tests.component.scripted_nodes import (
    CONFIGS,
    FILES,
    make_home,
    master_argv,
    request,
    run_to_the_end,
    signed_talk,
    wait_for_run,
)
from tests.helpers import free_port, wait_for

MD5 = "0123456789abcdef0123456789abcdef"
#: Rows of an untested product in the baseline: the merged table is big (about 1.5 MB).
KEPT_ROWS = 15000


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_enospc_during_the_rotation_leaves_the_tables_whole(tmpfs: Path) -> None:
    home = make_home(tmpfs / "home")
    names = [f"ex__{f}.{c}" for f in FILES for c in CONFIGS]
    kept = [f"mu__{i:05d}.pdf.pnm.72.0\t0\t0.1\t0\t0\t0\t{MD5}\tr0\tmupdf\told"
            for i in range(KEPT_ROWS)]
    rows = sorted([*(f"{n}\t0\t0.1\t0\t0\t0\t{MD5}\tr0\tgs\told" for n in names), *kept])
    tables = {"current.tab": ("\n".join(rows) + "\n").encode(),
              "previous.tab": b"ex__a.ps.ppmraw.72.0\t0\t0.1\t0\t0\t0\t" + MD5.encode()
              + b"\tr-1\tgs\tolder\n",
              "previous2.tab": b"ex__b.ps.ppmraw.72.0\t0\t0.1\t0\t0\t0\t" + MD5.encode()
              + b"\tr-2\tgs\toldest\n"}
    for name, data in tables.items():
        (home.tables / name).write_bytes(data)
    port = free_port(5) + 2
    argv = master_argv(home, port, "linger=0.5", suffixed=True)
    master = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    filler = tmpfs / "filler"
    try:
        run_id = wait_for_run(home, 2, port)
        assert signed_talk(port, request("n1", run_id)) == b"BUILD\n"
        reply = protocol.parse_reply(signed_talk(port, request("n1", run_id, "slots 8",
                                                               "jobs 0 0")))
        held = [Job.parse(line).name for line in reply.jobs]
        assert sorted(held) == sorted(names)
        # Fill the disk, leaving room for the run's own small files but not the baseline.
        st = os.statvfs(tmpfs)
        with open(filler, "wb") as fh:
            fh.write(b"\0" * max(st.f_bavail * st.f_frsize - 200_000, 0))
        run_to_the_end(port, "n1", run_id, held, MD5)
        _, err = master.communicate(timeout=60)
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()
    assert master.returncode == 0, err
    assert "No space left on device" in err and "the next clustermaster finishes it" in err
    for name, data in tables.items():
        assert (home.tables / name).read_bytes() == data, f"{name} changed on a full disk"
    assert sorted(p.name for p in home.tables.iterdir() if p.name.endswith(".tab")) == sorted(
        tables)
    assert not [p for p in home.tables.iterdir() if p.name.endswith(".tmp")]
    assert (home.run_dir(run_id) / ending.FILE_NAME).exists()
    # Room again: the next master finishes the run, rotating the baseline once.
    filler.unlink()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert QueueFile(home.queue(2), home.queue_lock(2)).read() == []
    assert not home.run_dir(run_id).exists()
    assert [p.name for p in home.archive.iterdir()] == [run_id]
    assert (home.tables / "previous2.tab").read_bytes() == tables["previous.tab"]
    assert (home.tables / "previous.tab").read_bytes() == tables["current.tab"]
    assert len(read_tab(home.tables / "current.tab")) == KEPT_ROWS + len(names)


def test_a_full_disk_at_the_start_waits_with_one_line_then_runs(tmpfs: Path,
                                                                 tmp_path: Path) -> None:
    """A master started on a full disk (its PID file cannot be written) neither dies with a
    traceback nor says so at every tick: it writes one line naming the PID file, the free
    space and the room it waits for, and waits; a second invocation meanwhile exits at once
    without a word; when room is back the first takes the queued run and serves it to the
    end: the table holds every test, the queue is empty."""
    home = make_home(tmpfs / "home")
    filler = tmpfs / "filler"
    st = os.statvfs(tmpfs)
    with open(filler, "wb") as fh:
        fh.write(b"\0" * (st.f_bavail * st.f_frsize))
    assert os.statvfs(tmpfs).f_bavail == 0
    port = free_port(5) + 2
    argv = master_argv(home, port, "linger=0.5", suffixed=True)
    err_path = tmp_path / "first.err"  # off the full disk, as a terminal would be
    with open(err_path, "w") as err:
        master = subprocess.Popen(argv, stderr=err, text=True)
    try:
        wait_for(lambda: "disk full" in err_path.read_text(), 30, "the full-disk line")
        second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0 and second.stderr == "", second.stderr
        time.sleep(3 * invocation.DISK_POLL)  # more polls: still one line, still waiting
        assert master.poll() is None
        lines = err_path.read_text().splitlines()
        assert len(lines) == 1, lines
        assert "Traceback" not in lines[0] and str(home.pid_file(2)) in lines[0]
        assert "0 bytes free" in lines[0] and f"until {invocation.DISK_ROOM} are free" in lines[0]
        assert not home.job_start(2).exists()

        filler.unlink()
        run_id = wait_for_run(home, 2, port)
        assert signed_talk(port, request("n1", run_id)) == b"BUILD\n"
        reply = protocol.parse_reply(signed_talk(port, request("n1", run_id, "slots 8",
                                                               "jobs 0 0")))
        held = [Job.parse(line).name for line in reply.jobs]
        run_to_the_end(port, "n1", run_id, held, MD5)
        assert master.wait(timeout=60) == 0
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()
    text = err_path.read_text()
    assert "Traceback" not in text and "Logging error" not in text, text
    assert "room again" in text
    assert QueueFile(home.queue(2), home.queue_lock(2)).read() == []
    names = sorted(f"ex__{f}.{c}" for f in FILES for c in CONFIGS)
    assert sorted(read_tab(home.tables / "current.tab")) == names
