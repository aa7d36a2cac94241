"""The node's BUILD by tree kind, against a scripted master on loopback: a MuPDF tree is built
with job.start's ``build_mupdf`` and its jobs' ``__bin__`` is ``build/release``; a tree's own
``cluster-build`` script overrides the command and names the binaries' folder; ``build_cache``
without ccache installed is said once in the build log and the build goes on."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from cluster.config import Config
from cluster.defaults import NODE_EXIT_DONE as EXIT_DONE
from cluster.wire.jobstart import JobStart
from tests.component.test_node_run import (
    RUN,
    SECRET,
    ScriptedMaster,
    make_node_home,
    node,
    script_once,
)
from tests.helpers import give_key

MARKER = "fedcba9876543210fedcba9876543210"
#: A job whose result md5 is the content of ``__bin__/marker`` (an executable file: the
#: node checks every ``__bin__/<name>`` a job names is one): where __bin__ points.
MARKER_JOB = ("echo gs > __temp__/t0.ps.ppmraw.72.0.log ; "
              "cat __bin__/marker > __temp__/t0.ps.ppmraw.72.0.md5")


def write_start(home: Path, products: tuple[str, ...] = ("mupdf",)) -> None:
    defaults = Config()
    start = JobStart(id=RUN, priority=0, queue="user t mupdf", kind="user", ref="t",
                     products=products, tree="mupdf", source="src", build="make",
                     build_ghostpdl=defaults.build_ghostpdl, build_mupdf=defaults.build_mupdf,
                     tests="tests")
    (home / "job.start").write_text(start.format())
    give_key(home, "n1", SECRET)


def make_mupdf_tree(home: Path) -> None:
    """``src`` as a MuPDF tree: source/fitz/ and a Makefile whose ``tools`` target writes the
    marker into build/$(build)/ (a plain ``make`` would write it into bin/)."""
    src = home / "src"
    (src / "source" / "fitz").mkdir(parents=True)
    (src / "Makefile").write_text(
        "all:\n\tmkdir -p bin\n\techo wrong > bin/marker\n"
        f"tools:\n\tmkdir -p build/$(build)\n\techo {MARKER} > build/$(build)/marker\n"
        "\tchmod +x build/$(build)/marker\n")


def run(home: Path, tmp_path: Path, serve: Callable[[ScriptedMaster], int],
        **settings: object) -> tuple[str, str]:
    """One run of MARKER_JOB; its result's md5 and the node's build log."""
    master = ScriptedMaster(script_once(MARKER_JOB))
    assert node(home, tmp_path, serve(master), **settings).run() == EXIT_DONE
    results = [r for req in master.seen for r in req.results]
    assert len(results) == 1, results
    log = (tmp_path / "work" / "runs" / RUN / "n1.build.log").read_text()
    return results[0].md5, log


def test_a_mupdf_tree_is_built_by_build_mupdf_and_its_binaries_are_in_build_release(
        tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    home = make_node_home(tmp_path)
    (home / "src" / "Makefile").unlink()
    make_mupdf_tree(home)
    write_start(home)
    md5, log = run(home, tmp_path, serve)
    assert md5 == MARKER, log
    assert "mupdf tree, build command from job.start build_mupdf, binaries in build/release/" \
        in log, log
    assert "$ make -j2 build=release tools\n" in log, log  # the node's 2 slots


def test_a_trees_cluster_build_script_overrides_the_command_and_the_binaries_folder(
        tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    home = make_node_home(tmp_path)
    make_mupdf_tree(home)
    (home / "src" / "cluster-build").write_text(
        "# cluster-bin: out/x\n"
        'echo "own build: slots $CLUSTER_SLOTS products $CLUSTER_PRODUCTS"\n'
        f"mkdir -p out/x && echo {MARKER} > out/x/marker && chmod +x out/x/marker\n")
    write_start(home, ("gs", "pdfwrite"))
    md5, log = run(home, tmp_path, serve)
    assert md5 == MARKER, log
    assert "build command from cluster-build, binaries in out/x/" in log, log
    assert "own build: slots 2 products gs,pdfwrite" in log, log


def test_build_cache_without_ccache_is_said_once_and_the_build_goes_on(
        tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    home = make_node_home(tmp_path)
    (home / "src" / "Makefile").write_text(
        f"all:\n\tmkdir -p bin\n\techo {MARKER} > bin/marker\n\tchmod +x bin/marker\n"
        '\techo "CC is $$CC"\n')
    write_start(home, ("gs",))
    cache = tmp_path / "ccache"
    md5, log = run(home, tmp_path, serve, build_cache=str(cache))
    assert md5 == MARKER, log
    if shutil.which("ccache") is None:
        assert log.count("ccache is not installed") == 1, log
        assert "CC is ccache gcc" not in log, log
    else:
        assert f"compiler cache {cache}" in log and "CC is ccache gcc" in log, log
