"""``clusteradmin culprit RUN``: a culprit search as it stands (docs/operating.md, "Finding
the culprit commit"; the search itself is docs/results.md's section of that name).

Read from the search's record ``culprits/<run>.toml`` (:mod:`cluster.master.files.culprits`):
the commits searched, each bisection run (its commit, its run id once it ended, its state:
queued, running -- the priority-1 job.start is it -- done or skipped, and the tests it
runs) and each changed test's current range, or its culprit once pinned.  RUN is the
commit run whose differences are searched, or one of its bisection runs.
"""

from __future__ import annotations

from typing import Any

from cluster.console.runinfo import job_start
from cluster.defaults import COMMIT_PRIORITY
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.files import culprits
from cluster.master.files.culprits import Search


def _find(home: Home, run: str) -> Search:
    try:
        search = culprits.load(home, run)
        if search is not None:
            return search
        for other in culprits.searches(home):
            found = culprits.load(home, other)
            if found is not None and any(s.run == run for s in found.steps):
                return found
    except ValueError as exc:
        raise ClusterError(str(exc)) from None
    raise ClusterError(f"no culprit search for run {run} (none in {home.culprits}); a "
                       "search starts after a commit run with confirmed differences and "
                       "untested commits before it")


def search(home: Home, run: str) -> dict[str, Any]:
    """The search of run ``run`` (or of the search a bisection run ``run`` belongs to) as
    a JSON-able dict; ClusterError when there is none."""
    found = _find(home, run)
    running = job_start(home, COMMIT_PRIORITY)
    running_step = ""
    if running is not None:
        running_step = next((o.partition("=")[2] for o in running.options
                             if o.startswith(culprits.OPTION + "=")), "")
    commits = found.commits
    steps = []
    for number, step in enumerate(found.steps):
        state = step.state
        run_id = step.run
        if state == culprits.QUEUED and running_step == f"{found.run}.{number}":
            state, run_id = "running", running.id if running is not None else ""
        steps.append({"step": number, "commit": commits[step.commit], "index": step.commit,
                      "run": run_id, "state": state, "why": step.why,
                      "tests": list(step.tests)})
    tests = []
    for test in found.tests:
        certain = all(i not in test.skipped for i in range(test.good + 1, test.bad))
        tests.append({"test": test.name, "good": commits[test.good],
                      "bad": commits[test.bad], "untested": test.candidates(),
                      "skipped": [commits[i] for i in test.skipped],
                      "culprit": commits[test.bad] if test.pinned and certain else None,
                      "suspects": [commits[i] for i in test.suspects()]
                      if test.pinned and not certain else []})
    return {"run": found.run, "tree": found.tree, "products": found.products,
            "good": commits[0], "good_run": found.good_run, "bad": commits[-1],
            "untested": len(commits) - 2, "state": found.state, "report": found.report,
            "commits": commits, "steps": steps, "tests": tests}


def format_search(data: dict[str, Any]) -> list[str]:
    """The text of :func:`search`'s dict."""
    commits: list[str] = data["commits"]

    def short(sha: str) -> str:
        return f"{sha[:12]} (#{commits.index(sha) + 1})"

    lines = [f"culprit search for run {data['run']} (tree {data['tree']}, products "
             f"{','.join(data['products'])}): {data['state']}",
             f"  range: {short(data['good'])} (last tested, run {data['good_run']}) .. "
             f"{short(data['bad'])} (run {data['run']}), {data['untested']} untested "
             "commit(s) between"]
    if data["report"]:
        lines.append(f"  follow-up report: {data['report']}")
    lines.append(f"bisection runs: {len(data['steps'])}")
    for step in data["steps"]:
        why = f" ({step['why']})" if step["why"] else ""
        lines.append(f"  {step['step']}: {short(step['commit'])} run {step['run'] or '-'} "
                     f"{step['state']}{why}, {len(step['tests'])} test(s)")
    lines.append("tests:")
    for test in data["tests"]:
        if test["culprit"]:
            where = f"culprit {short(test['culprit'])}"
        elif test["suspects"]:
            where = "culprit one of " + ", ".join(short(s) for s in test["suspects"])
        else:
            where = (f"between {short(test['good'])} (same output) and "
                     f"{short(test['bad'])} (changed), {len(test['untested'])} to test")
        lines.append(f"  {test['test']}: {where}")
    return lines
