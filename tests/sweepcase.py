"""The sweep the end-to-end sweep tests run (docs/sweeps.md), and how to run it by
hand.

:func:`write_sweep` writes a sweep folder holding a small real program, ``prog.py``, a
table of ``rows`` rows, a check script and the sweep file that ties them together:

* the table ``params.csv`` has the columns ``k`` (1..rows), ``group`` (``g0``..``g2``) and
  ``label`` (a value with a space, a ``;`` and a ``$(...)``: it must reach the program as
  one argument, unexpanded);
* each task gets the input ``config.ini`` (its ``k``, its task number ``{#}`` and how long
  to sleep), which ``prog.py`` reads; the program writes ``out.txt`` (a text line), and
  ``data.bin`` (binary: the bytes 0..255, then ``k`` as two bytes), prints ``done k=<k>``
  and exits 3 when ``k`` is a multiple of 10 (allowed by ``exit_status = [0, 3]``), else 0;
* ``[results]``: ``out`` = out.txt, ``data`` = data.bin, ``log`` = stdout;
* ``[validate]``: ``exit_status``, ``nonempty``, ``match`` and ``check.sh``, which rejects
  (exit 1, ``rejected k=<k>``) every ``k`` listed in the sweep folder's ``reject.txt``;
* ``[collect]``: ``all.txt`` (every ``out``, plain) and ``by-group/{group}.bin`` (the
  ``data`` results, blockwise by group).

:func:`by_hand` runs one task's expanded command as a user would without the cluster: in a
fresh folder holding the inputs and links to the sweep folder's files, and returns its
results by name.  The tests compare the cluster's files with these, byte for byte.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

from cluster.localcluster import LocalCluster
from cluster.sweep.attempts import Attempt, read_attempts
from cluster.sweep.expand import Task
from cluster.sweep.joblog import read_joblog
from cluster.triggers.sweeppush import prepare_sweep

PROGRAM = '''\
import sys
import time

args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
conf = {}
with open("config.ini", encoding="utf-8") as fh:
    for line in fh:
        name, _, value = line.partition(" = ")
        conf[name] = value.strip()
time.sleep(float(conf["sleep"]))
k = int(args["--k"])
assert int(conf["k"]) == k, (conf, args)
with open("out.txt", "w", encoding="utf-8") as out:
    out.write(f"k={k} seq={conf['seq']} label={args['--label']} square={k * k}\\n")
with open("data.bin", "wb") as data:
    data.write(bytes(range(256)) + k.to_bytes(2, "big"))
print(f"done k={k}")
sys.exit(3 if k % 10 == 0 else 0)
'''

CHECK = '''\
#!/bin/sh
# The check of a task's results ($1: its result folder; run in the sweep folder).
k=$(sed -n 's/^k=\\([0-9]*\\) .*/\\1/p' "$1/out")
if grep -qx "$k" reject.txt; then
    echo "rejected k=$k"
    exit 1
fi
exit 0
'''

SWEEP = '''\
command = "python3 prog.py --k {{k}} --label {{label}}"
table = "params.csv"
timeout = {timeout}
retries = 1

[inputs]
"config.ini" = "k = {{k}}\\nseq = {{#}}\\nsleep = {sleep}\\n"

[results]
out = "out.txt"
data = "data.bin"
log = "stdout"

[validate]
exit_status = [0, 3]
nonempty = ["out", "data"]
match = {{ log = "^done k=[0-9]+$" }}
script = "check.sh"

[collect]
"all.txt" = {{ from = "out" }}
"by-group/{{group}}.bin" = {{ from = "data" }}
'''

#: The result names of the sweep and the files (or stream) they come from.
RESULTS = {"out": "out.txt", "data": "data.bin", "log": "stdout"}


def label(k: int) -> str:
    """Row ``k``'s label: a space, a ``;`` and a command substitution, kept as written."""
    return f"w{k} x;y $(echo no)"


def write_sweep(folder: Path, rows: int, reject: Iterable[int], *, sleep: float = 0.0,
                timeout: float = 30) -> Path:
    """Write the sweep (module docstring) into ``folder``; return its sweep file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prog.py").write_text(PROGRAM, encoding="utf-8")
    check = folder / "check.sh"
    check.write_text(CHECK, encoding="utf-8")
    check.chmod(0o755)
    lines = ["k,group,label"] + [f"{k},g{k % 3},{label(k)}" for k in range(1, rows + 1)]
    (folder / "params.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    set_rejected(folder, reject)
    sweep = folder / "sweep.toml"
    sweep.write_text(SWEEP.format(timeout=timeout, sleep=sleep), encoding="utf-8")
    return sweep


def set_rejected(folder: Path, reject: Iterable[int]) -> None:
    """The ``k`` values the check script rejects from now on."""
    (folder / "reject.txt").write_text("".join(f"{k}\n" for k in reject), encoding="utf-8")


def by_hand(task: Task, sweep_dir: Path, folder: Path) -> dict[str, bytes]:
    """The results (by result name) of ``task``'s command run by hand in ``folder`` (made
    new) beside links to the sweep folder's files, with the inputs written first."""
    folder.mkdir(parents=True)
    for entry in sweep_dir.iterdir():
        (folder / entry.name).symlink_to(entry)
    for name, text in task.inputs:
        (folder / name).write_text(text, encoding="utf-8")
    done = subprocess.run(["sh", "-c", task.command], cwd=folder, capture_output=True,
                          timeout=60, env={**os.environ, "CLUSTER_SWEEP_DIR": str(sweep_dir),
                                           "CLUSTER_SLOT": "1"})
    assert done.returncode in (0, 3), (task.command, done.stderr)
    return {name: done.stdout if source == "stdout" else (folder / source).read_bytes()
            for name, source in RESULTS.items()}


def collected(valid: Iterable[tuple[Task, Mapping[str, bytes]]]) -> dict[str, bytes]:
    """The collected files (path under collected/ -> bytes) the sweep's ``[collect]`` makes
    from ``valid`` (each valid task with its results), given in task order."""
    files: dict[str, bytes] = {"all.txt": b""}
    for task, results in valid:
        files["all.txt"] += results["out"]
        group = f"by-group/{task.row.values[1]}.bin"  # the column group
        files[group] = files.get(group, b"") + results["data"]
    return files


def files_under(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` by its relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def check_archive(archive: Path, everything: Sequence[Task],
                  hand: Mapping[str, Mapping[str, bytes]], rejected: Collection[int]
                  ) -> dict[str, list[Attempt]]:
    """Assert what a run of the sweep left in ``archive``: ``results.tsv`` has one row per
    task in task order, ``ok`` in one try or (a ``k`` in ``rejected``) invalid with the
    check's reason after two; ``results/`` holds one folder per task, a valid task's files
    byte for byte those of ``hand`` (task id -> results run by hand); ``collected/`` is the
    valid results concatenated in task order.  Return the run's tries by task id."""
    rows = list(read_joblog(archive / "results.tsv"))
    assert [r.seq for r in rows] == [t.number for t in everything]
    for row, task in zip(rows, everything, strict=True):
        k = int(task.row.values[0])
        assert row.params == (("k", str(k)), ("group", f"g{k % 3}"), ("label", label(k)))
        want = (f"invalid: check.sh exited 1: rejected k={k}", 2) if k in rejected else \
            ("ok", 1)
        assert (row.status, row.attempts) == want, row
    results = archive / "results"
    assert sorted(p.name for p in results.iterdir()) == sorted(t.task_id for t in everything)
    valid = [t for t in everything if int(t.row.values[0]) not in rejected]
    for task in valid:
        kept = {p.name: p.read_bytes() for p in (results / task.task_id).iterdir()}
        assert kept == hand[task.task_id], task
    assert files_under(archive / "collected") == collected(
        (t, hand[t.task_id]) for t in valid)
    tries: dict[str, list[Attempt]] = {t.task_id: [] for t in everything}
    for attempt in read_attempts(archive / "sweep-attempts.tsv"):
        tries[attempt.task].append(attempt)
    return tries


def submit(cluster: LocalCluster, sweep: Path, user: str, *extra: str,
           timeout: float = 120.0) -> Path:
    """Push the sweep of the sweep file ``sweep`` into ``cluster``'s home as ``user``'s
    run (with the run options ``extra``), as clusterpush.py --sweep does, and wait for the
    run's archive folder."""
    submission = prepare_sweep(sweep)
    before = cluster.archives()
    spec = cluster.push(submission.folder, user, submission.words[:1],
                        [*submission.words[1:], *extra])
    return cluster.wait_for_run(spec, before, timeout)
