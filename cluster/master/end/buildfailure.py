"""The report of a run a node's fatal failure stopped (a build failure): the failing
nodes' build logs quoted, from the run's archive (:func:`failure_report`).

:func:`cluster.master.end.finish.finish` gives it to a run whose outcome is ``FAILED``; no
table is touched.
"""

from __future__ import annotations

import re
from pathlib import Path

from cluster.master.state.runstate import RunState
from cluster.node import buildlog

#: How many failing nodes' build logs a failure report quotes (the others are listed).
QUOTED_NODES = 3
#: The node named by RunState.fatal ("node <name> failed with code <n>: <reason>").
_FATAL_NODE = re.compile(r"^node (?P<node>\S+) failed with code -?\d+")


def failure_report(header: str, state: RunState, logs: Path, command: str = "") -> str:
    """The report of a run that a node's fatal failure stopped (build failure).

    It quotes, from the failing node's build log (``<node>.build.log`` in ``logs``, the
    archive's copy), the compiler's and make's error lines (:mod:`cluster.node.buildlog`:
    the first 20, each cut to a sane width; the last 20 lines when none is recognised),
    with the node's name, the build ``command``, what became of it (its exit status, the
    node's last line in the log) and where the whole log is.  Other nodes whose build log
    ends with a failed build are quoted alike (up to QUOTED_NODES in all); every other log
    in ``logs`` is only named.
    """
    lines = [header, "",
             "An error occurred that prevented the local cluster run from finishing:",
             f"  {state.fatal}", ""]
    paths = sorted(logs.glob("*")) if logs.is_dir() else []
    named = _FATAL_NODE.match(state.fatal)
    first = named.group("node") if named else ""
    build_logs = sorted((p for p in paths if p.name.endswith(BUILD_LOG_SUFFIX)),
                        key=lambda p: (p.name != f"{first}{BUILD_LOG_SUFFIX}", p.name))
    quoted: set[Path] = set()
    for path in build_logs:
        node = path.name[:-len(BUILD_LOG_SUFFIX)]
        text = path.read_text(encoding="utf-8", errors="replace")
        ended = _build_end(text, node)
        if len(quoted) >= QUOTED_NODES or (node != first and not ended):
            continue
        quoted.add(path)
        lines += [f"The build failed on node {node}:",
                  f"  command: {_ran_command(text) or command or '(unknown)'}",
                  f"  result:  {ended or '(the log does not say)'}",
                  f"  whole log: {path}"]
        title, *quoted_lines = buildlog.diagnose(text).quote()
        lines.append(f"  {title}")
        lines += [f"    {line}" for line in quoted_lines]
        lines.append("")
    others = [p for p in paths if p not in quoted]
    if others:
        lines.append("Other logs of the run:")
        lines += [f"  {p}" for p in others]
        lines.append("")
    return "\n".join(lines) + "\n"


#: The name a node's build log has in the run's logs (runcontext: ``<node>.build.log``).
BUILD_LOG_SUFFIX = ".build.log"


def _ran_command(text: str) -> str:
    """The last build command a node's build log says it ran (its ``$ <command>`` line), or
    '': the command of the tree's kind (``build_ghostpdl``, ``build_mupdf``, a tree's
    ``cluster-build``) with the node's slots filled in, which job.start's ``build`` is not."""
    for line in reversed(text.splitlines()[:200]):
        if line.startswith("$ "):
            return line[2:].strip()
    return ""


def _build_end(text: str, node: str) -> str:
    """The node's own last line of its build log when it says the build failed ('' if not):
    ``'make' exited with status 2``, ``... timed out after ...``, ``... was killed ...``."""
    prefix = f"node {node}: "
    for line in reversed(text.splitlines()[-200:]):
        if line.startswith(prefix):
            said = line[len(prefix):]
            return said if re.search(r" (?:exited with status|timed out after|was) ",
                                     said) else ""
    return ""
