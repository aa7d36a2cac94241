"""The README's set-up and CI install one list of system packages, and the
commands the README tells people to type are entry points pip puts on PATH."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.helpers import REPO

PACKAGES = REPO / "packages.txt"
#: How both install it: the list without its comment lines.
FROM_LIST = "$(grep -v '^#' packages.txt)"


def _block(marker: str) -> str:
    """The fenced block after ``<!-- marker -->`` in the README."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(rf"<!-- {marker} -->\n```sh\n(.*?)```", text, re.S)
    assert found, f"README.md has no <!-- {marker} --> block"
    return found.group(1)


def test_packages_txt_is_a_list_of_debian_package_names() -> None:
    names = [line for line in PACKAGES.read_text().splitlines()
             if line and not line.startswith("#")]
    assert names and all(re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", n) for n in names), names
    # What the tests need of the system (a missing one fails CI instead of skipping).
    for needed in ("ghostscript", "mupdf-tools", "openssh-server", "rsync", "iproute2",
                   "chromium", "chromium-driver", "cron", "git", "parallel",
                   "gcc", "libc6-dev",  # the build tests compile real C
                   "ccache", "pkg-config", "liblcms2-dev", "libmujs-dev",  # real products
                   "slurmctld", "slurmd", "slurm-client", "munge",  # a private Slurm
                   "gridengine-master", "gridengine-exec", "gridengine-client"):  # and SGE
        assert needed in names


def test_the_readme_and_ci_install_the_same_list() -> None:
    setup = _block("setup-commands").strip().splitlines()
    assert len(setup) == 3, setup  # the three set-up commands
    assert FROM_LIST in setup[0] and "apt-get install" in setup[0]
    assert setup[1] == "python3 -m pip install -e '.[test]'"
    assert setup[2] == "etc/fetch-sources"  # the real products' sources
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    installs = [ln for ln in ci.splitlines() if "apt-get install" in ln]
    assert installs and all(FROM_LIST in ln for ln in installs), installs
    assert "python3 -m pip install -e '.[test]'" in ci
    assert "\netc/fetch-sources\n" in ci


def test_the_readme_main_command_is_an_entry_point() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    command = _block("main-command").split()[0]
    assert command in scripts
    for name in ("clusterpush", "clusteradmin", "clustermonitor", "clusterstatus",
                 "localcluster", "bootstrap-node"):
        module, _, function = scripts[name].partition(":")
        assert function == "main" and (REPO / (module.replace(".", "/") + ".py")).is_file()


def test_each_entry_point_runs_the_main_of_its_top_level_script() -> None:
    """progname.COMMANDS (the name a command shows) pairs each top-level script with the
    entry point that runs the same ``main``: the pairs are pyproject's."""
    from cluster.cli import progname

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(progname.COMMANDS.values()) == set(scripts)
    for script, command in progname.COMMANDS.items():
        module = scripts[command].partition(":")[0]
        assert f"from cluster.cli import {module.rpartition('.')[2]}" in (
            REPO / script).read_text(encoding="utf-8"), (script, command)


def test_a_command_is_named_as_it_was_typed() -> None:
    from cluster.cli import progname

    assert progname.prog("clusterpush.py", "/venv/bin/clusterpush") == "clusterpush"
    assert progname.prog("clusterpush.py", "./clusterpush.py") == "clusterpush.py"
    assert progname.prog("clusterpush.py", "/usr/bin/pytest") == "clusterpush.py"
    assert progname.prog("bootstrap_node.py", "bootstrap-node") == "bootstrap-node"
    assert progname.prog("run.py", "run") == "run.py"  # no entry point: always the script


def test_no_test_or_module_reads_a_path_outside_the_checkout() -> None:
    """A fresh clone on a fresh machine has only itself: the corpus the tests use is the
    repository's own ``corpus/``, never a folder of the machine it was written on."""
    offenders = [f"{path.relative_to(REPO)}:{n}"
                 for tree in ("cluster", "tests") for path in sorted((REPO / tree).rglob("*.py"))
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if re.search(r"""["']/work/""", line)]
    assert offenders == [], offenders


def test_the_manual_gives_the_debian_mupdf_build_the_tests_use(tmp_path: Path) -> None:
    """The master.conf line docs/operating.md shows for Debian's MuPDF source ("How a node
    builds a product tree") is the command the real-product tests build it with, and
    master.conf reads it back unchanged."""
    from cluster import configfile
    from tests.realsources import MUPDF_DEBIAN_BUILD

    line = f"build_mupdf = {MUPDF_DEBIAN_BUILD}"
    assert line in (REPO / "docs" / "operating.md").read_text(encoding="utf-8")
    (tmp_path / "master.conf").write_text(f"[master]\n{line}\n", encoding="utf-8")
    assert configfile.load(tmp_path / "master.conf").build_mupdf == MUPDF_DEBIAN_BUILD
