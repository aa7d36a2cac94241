"""A full disk at the end of a run leaves the previous tables whole (a real full tmpfs).

The master home is on a small tmpfs mounted for the test.  When the run ends, the disk is
filled so that the new baseline cannot be written: the master says so and leaves the run's
end record; the tables are byte for byte what they were, with no temporary files beside
them.  Once there is room again, the next clustermaster finishes the run: one archive and
one rotation.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.master import ending
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
from tests.helpers import free_port

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
    port = free_port(3) + 2
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
