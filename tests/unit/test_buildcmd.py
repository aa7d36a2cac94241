"""buildcmd: tree kinds by their top files, the command and binaries' folder of each kind,
the fallback for a job.start without per-kind commands, and a tree's own cluster-build."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.config import Config
from cluster.jobs.generate import required_programs
from cluster.node import buildcmd
from cluster.wire.jobstart import JobStart

START = JobStart(id="r", priority=0, queue="q", kind="user", ref="u", products=("gs", "pcl"),
                 tree="ghostpdl", source="s", build="make", tests="tests",
                 build_ghostpdl="make -j__slots__ gs gpcl6",
                 build_mupdf="make -j__slots__ build=release tools")


def ghostpdl(root: Path, marker: str = "configure.ac") -> Path:
    for d in ("base", "psi"):
        (root / d).mkdir(parents=True)
    (root / marker).write_text("")
    return root


def mupdf(root: Path) -> Path:
    (root / "source" / "fitz").mkdir(parents=True)
    (root / "Makefile").write_text("")
    return root


def test_tree_kinds(tmp_path: Path) -> None:
    assert buildcmd.tree_kind(ghostpdl(tmp_path / "g")) == buildcmd.GHOSTPDL
    assert buildcmd.tree_kind(ghostpdl(tmp_path / "h", "autogen.sh")) == buildcmd.GHOSTPDL
    assert buildcmd.tree_kind(mupdf(tmp_path / "m")) == buildcmd.MUPDF
    (tmp_path / "d" / "base").mkdir(parents=True)  # base/ alone is no ghostpdl
    assert buildcmd.tree_kind(tmp_path / "d") == buildcmd.OTHER


def test_each_kind_gets_its_command_with_the_slots_and_its_binaries_folder(
        tmp_path: Path) -> None:
    g = buildcmd.plan(ghostpdl(tmp_path / "g"), START, 3)
    assert (g.command, g.bin_dir, g.origin) == ("make -j3 gs gpcl6", "bin",
                                                "job.start build_ghostpdl")
    m = buildcmd.plan(mupdf(tmp_path / "m"), START, 2)
    assert (m.command, m.bin_dir) == ("make -j2 build=release tools", "build/release")
    (tmp_path / "o").mkdir()
    assert buildcmd.plan(tmp_path / "o", START, 2).command == "make"


def test_a_job_start_without_per_kind_commands_builds_every_tree_with_build(
        tmp_path: Path) -> None:
    old = JobStart.parse(JobStart(**{**START.__dict__, "build_ghostpdl": "",
                                     "build_mupdf": ""}).format())
    plan = buildcmd.plan(mupdf(tmp_path / "m"), old, 2)
    assert (plan.command, plan.origin, plan.bin_dir) == ("make", "job.start build",
                                                         "build/release")


def test_the_per_kind_commands_survive_job_start_and_are_left_out_when_empty() -> None:
    assert JobStart.parse(START.format()) == START
    text = JobStart(**{**START.__dict__, "build_ghostpdl": "", "build_mupdf": ""}).format()
    assert "build_ghostpdl" not in text and "build_mupdf" not in text


def test_the_masters_targets_are_the_ghostpdl_programs_the_products_need() -> None:
    cfg = Config()
    assert buildcmd.ghostpdl_targets(required_programs(cfg, ["pdfwrite", "ps2write"])) == "gs"
    assert buildcmd.ghostpdl_targets(required_programs(cfg, ["pcl", "xps", "mupdf"])) \
        == "gs gpcl6 gxps"  # pcl's pdf.* configurations need gs too
    assert buildcmd.ghostpdl_targets(["mutool"]) == ""


def test_a_cluster_build_script_overrides(tmp_path: Path) -> None:
    tree = mupdf(tmp_path / "m")
    (tree / "cluster-build").write_text("# cluster-bin: out/rel\nmake\n")
    plan = buildcmd.plan(tree, START, 4)
    assert (plan.command, plan.bin_dir, plan.origin) == ("sh ./cluster-build", "out/rel",
                                                         "cluster-build")
    assert dict(plan.env) == {"CLUSTER_SLOTS": "4", "CLUSTER_PRODUCTS": "gs,pcl"}
    (tree / "cluster-build").write_text("# cluster-bin: ../elsewhere\n")
    with pytest.raises(ValueError, match="cluster-bin '../elsewhere' must be a folder inside"):
        buildcmd.plan(tree, START, 4)
