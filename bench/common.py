"""What every benchmark shares: the machine line, figures as name=value, medians, timing."""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python3 bench/x.py` from anywhere
    sys.path.insert(0, str(REPO))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def print_machine() -> None:
    """The first line of every benchmark: what it ran on."""
    mem = psutil.virtual_memory().total / 2**30
    fields = {
        "machine": platform.node() or "unknown", "os": f"{platform.system()}-{platform.release()}",
        "cpu": cpu_model().replace(" ", "_"), "cores": os.cpu_count() or 0,
        "ram_gib": f"{mem:.1f}", "python": platform.python_version(),
    }
    print(figures(fields), flush=True)


def figures(values: dict[str, object]) -> str:
    """One line of ``name=value`` pairs a script can read (values without spaces)."""
    return " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in values.items())


def run_cases(names: str, case: Callable[[str], dict[str, object]]) -> int:
    """Run each of the comma-separated case ``names`` (``case(name)`` gives its figures,
    with ``correct`` yes or no), printing a figures line each; 0 when every case was
    correct, else 1."""
    ok = True
    for name in names.split(","):
        values = case(name)
        ok = ok and values["correct"] == "yes"
        print(figures(values), flush=True)
    return 0 if ok else 1


def reported(audit: list[str]) -> int:
    """The results the nodes' calls carried, over a run's audit trail (its lines)."""
    return sum(int(line.split(" reported results ", 1)[1].split(" ", 1)[0])
               for line in audit if " reported results " in line)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def start(prog: str, tools: Iterable[str], keep: Path | None) -> Path | None:
    """Begin a benchmark: check ``tools`` are installed (naming a missing one on stderr),
    print the machine line, and return the work folder (``keep``, or a new temp folder).
    None means a tool is missing: exit 2."""
    for tool in tools:
        if shutil.which(tool) is None:
            print(f"{prog}: {tool} is not installed", file=sys.stderr)
            return None
    print_machine()
    work = keep or Path(tempfile.mkdtemp(prefix=f"{prog}-"))
    work.mkdir(parents=True, exist_ok=True)
    return work
