"""Unit tests of the jobs of the other Ghostscript languages: pcl (gpcl6), xps (gxps) and
xpswrite (gs writes XPS, gxps rasterises it).

Exact command lines, the log/md5 files, banding, the two stages, which files each product
takes, the binaries a node will look for, and the products in the queue grammar.  No gpcl6
or gxps can run on this machine (see docs/deviations.md); the xpswrite line runs with the real
gs in tests/component/test_jobs_real_gs.py.
"""

from __future__ import annotations

import random
import shlex
from pathlib import Path

import pytest

from cluster.cli import build as build_cli
from cluster.config import Config
from cluster.datatypes import ALONE, MAP_PRODUCTS, PRODUCTS, parse_path_products
from cluster.errors import ConfigError
from cluster.jobs import bmpcmp as bmpcmp_jobgen
from cluster.jobs import generate as jobgen
from cluster.jobs.generate import JobOptions, generate
from cluster.node.nodejobs import BIN_NAME
from cluster.records import Job
from cluster.runspec import RunSpec

CFG = Config()
TIME = '/usr/bin/time -f "%U %S %E %P"'
#: A corpus with a file of every kind: PCL, PCL-XL (three suffixes), XPS, PostScript, PDF.
FILES = ["pcl/one.pcl", "pcl/two.PX", "xl/three.pxl", "xl/four.prn", "xps/five.xps",
         "ps/six.ps", "pdf/seven.pdf", "other/eight.txt"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tests"
    for name in FILES:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x1bE\n")
    return root


def _jobs(tree: Path, products: list[str], **changes: object) -> dict[str, Job]:
    cfg = CFG.with_changes(**changes) if changes else CFG
    return {j.name: j for j in generate(cfg, products, tree, rng=random.Random(0))}


def _steps(command: str) -> list[str]:
    return [part.strip() for part in command.split(" ; ")]


# --- configuration ----------------------------------------------------------------------------

def test_defaults_are_the_artifex_lists() -> None:
    """pcl and xps default to build.pl's device lists (ARTIFEX.md §5.3), PCL and PCL-XL
    files are .pcl .px .pxl .prn, XPS files .xps."""
    assert CFG.pcl_configs == ("pbmraw.75.0", "pbmraw.600.1", "ppmraw.75.0", "ppmraw.600.1",
                               "pdf.ppmraw.75.0", "pdf.ppmraw.600.0")
    assert CFG.xps_configs == ("pbmraw.72.0", "ppmraw.72.0", "bitrgb.72.0", "pdf.ppmraw.72.0")
    assert CFG.xpswrite_configs == ("xps.ppmraw.72.0", "xps.ppmraw.300.0", "xps.pkmraw.300.0")
    assert CFG.pcl_extensions == ("pcl", "px", "pxl", "prn")
    assert CFG.xps_extensions == ("xps",)


def test_each_product_takes_its_own_files(tree: Path) -> None:
    """pcl: the four PCL/PCL-XL suffixes (any case); xps: .xps; xpswrite: gs's files."""
    def files(product: str) -> set[str]:
        names = _jobs(tree, [product])
        return {file_id for file_id in (f.replace("/", "__") for f in FILES)
                if any(name.startswith(f"{file_id}.") for name in names)}

    assert files("pcl") == {"pcl__one.pcl", "pcl__two.PX", "xl__three.pxl", "xl__four.prn"}
    assert files("xps") == {"xps__five.xps"}
    assert files("xpswrite") == {"ps__six.ps", "pdf__seven.pdf"}
    jobs = _jobs(tree, ["pcl", "xps", "xpswrite"])
    assert len(jobs) == 4 * 6 + 1 * 4 + 2 * 3


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("xpswrite_configs", "pdf.ppmraw.72.0", "xps.*"),
    ("xpswrite_configs", "ppmraw.72.0", "xps.*"),
    ("pcl_configs", "ppmraw.75", "device.res.band"),
    ("xps_configs", "svg.ppmraw.72.0", "device.res.band"),
])
def test_bad_configurations_name_their_key(tree: Path, key: str, value: str,
                                           needle: str) -> None:
    """A config a product cannot make is a ConfigError naming the key and what is wanted."""
    with pytest.raises(ConfigError, match=rf"{key}.*{value}.*{needle}"):
        generate(CFG.with_changes(**{key: (value,)}), [key.split("_")[0]], tree)


def test_the_languages_take_every_two_stage_kind(tree: Path) -> None:
    """gpcl6 and gxps may write PDF, PostScript or XPS in stage 1, as gs may."""
    jobs = _jobs(tree, ["pcl", "xps", "gs"], pcl_configs=("ps.ppmraw.75.0", "xps.pbmraw.75.0"),
                 xps_configs=("xps.ppmraw.72.0",), gs_configs=("xps.ppmraw.72.0",))
    assert "echo 'pcl ps2write' >> " in jobs["pcl__one.pcl.ps.ppmraw.75.0"].command
    assert "echo 'pcl xpswrite' >> " in jobs["pcl__one.pcl.xps.pbmraw.75.0"].command
    assert "echo 'xps xpswrite' >> " in jobs["xps__five.xps.xps.ppmraw.72.0"].command
    assert "echo 'gs xpswrite' >> " in jobs["ps__six.ps.xps.ppmraw.72.0"].command


# --- command lines ----------------------------------------------------------------------------

def test_pcl_raster_command_exact(tree: Path) -> None:
    """gpcl6 gets the file as an argument, no gs-only options, and pipes into md5sum."""
    i = "xl__three.pxl.pbmraw.600.1"
    gpcl6 = (f"__bin__/gpcl6 -sOutputFile='|md5sum >> __temp__/{i}.md5' -dMaxBitmap=10000 "
             "-sDEVICE=pbmraw -r600 -dNOPAUSE -dBATCH -K1000000 __tests__/xl/three.pxl")
    assert _jobs(tree, ["pcl"])[i].command == (
        f"touch __temp__/{i}.md5 ; echo pcl >> __temp__/{i}.log ; "
        f"echo {shlex.quote(gpcl6)} >> __temp__/{i}.log ; "
        f"{TIME} {gpcl6} >> __temp__/{i}.log 2>&1")


def test_banding_and_memory(tree: Path) -> None:
    """Band 0 is page mode, band 1 forced banding, -K is gs_memory_kb: for every language."""
    jobs = _jobs(tree, ["pcl", "xps"], gs_memory_kb=4321)
    page = jobs["pcl__one.pcl.pbmraw.75.0"].command
    banded = jobs["pcl__one.pcl.pbmraw.600.1"].command
    assert "-dMaxBitmap=30000000 -sDEVICE=pbmraw -r75 " in page
    assert "-dMaxBitmap=10000 -sDEVICE=pbmraw -r600 " in banded
    assert "-K4321 " in page and "-K4321 " in jobs["xps__five.xps.ppmraw.72.0"].command


def test_xps_raster_command_exact(tree: Path) -> None:
    """gxps reads the XPS file (a zip) as an argument; bitrgb gets -dGrayValues=256."""
    i = "xps__five.xps.bitrgb.72.0"
    gxps = (f"__bin__/gxps -sOutputFile='|md5sum >> __temp__/{i}.md5' -dMaxBitmap=30000000 "
            "-sDEVICE=bitrgb -dGrayValues=256 -r72 -dNOPAUSE -dBATCH -K1000000 "
            "__tests__/xps/five.xps")
    assert _jobs(tree, ["xps"])[i].command == (
        f"touch __temp__/{i}.md5 ; echo xps >> __temp__/{i}.log ; "
        f"echo {shlex.quote(gxps)} >> __temp__/{i}.log ; "
        f"{TIME} {gxps} >> __temp__/{i}.log 2>&1")


def test_pcl_two_stage_command_exact(tree: Path) -> None:
    """gpcl6 writes the PDF, --- divides the stages, gs rasterises the PDF, rm cleans up."""
    i = "pcl__one.pcl.pdf.ppmraw.600.0"
    log, pdf = f"__temp__/{i}.log", f"__temp__/{i}.pdf"
    stage1 = (f"__bin__/gpcl6 -sOutputFile={pdf} -sDEVICE=pdfwrite -r600 -dNOPAUSE -dBATCH "
              "__tests__/pcl/one.pcl")
    stage2 = (f"__bin__/gs -sOutputFile='|md5sum >> __temp__/{i}.md5' -dMaxBitmap=30000000 "
              "-sDEVICE=ppmraw -r600 -sDEFAULTPAPERSIZE=letter -dNOPAUSE -dBATCH -K1000000 "
              f"-dJOBSERVER {pdf}")
    assert _steps(_jobs(tree, ["pcl"])[i].command) == [
        f"touch __temp__/{i}.md5", f"echo 'pcl pdfwrite' >> {log}",
        f"echo {shlex.quote(stage1)} >> {log}", f"{TIME} {stage1} >> {log} 2>&1",
        f"echo --- >> {log}", f"md5sum {pdf} >> {log} 2>&1",
        f"echo {shlex.quote(stage2)} >> {log}", f"{TIME} {stage2} >> {log} 2>&1",
        f"rm -f {pdf}"]


def test_xps_two_stage_command_uses_gxps_then_gs(tree: Path) -> None:
    """xps's pdf.ppmraw.72.0: gxps writes the PDF, gs rasterises it."""
    i = "xps__five.xps.pdf.ppmraw.72.0"
    steps = _steps(_jobs(tree, ["xps"])[i].command)
    assert steps[1] == f"echo 'xps pdfwrite' >> __temp__/{i}.log"
    assert steps[3].startswith(f"{TIME} __bin__/gxps -sOutputFile=__temp__/{i}.pdf "
                               "-sDEVICE=pdfwrite -r72 -dNOPAUSE -dBATCH __tests__/xps/five.xps ")
    assert steps[7].startswith(f"{TIME} __bin__/gs ")


def test_xpswrite_command_exact(tree: Path) -> None:
    """gs writes __temp__/<id>.xps (its input on stdin, as every gs job), --- divides, gxps
    rasterises the XPS into md5sum, the XPS is removed."""
    i = "ps__six.ps.xps.pkmraw.300.0"
    log, xps = f"__temp__/{i}.log", f"__temp__/{i}.xps"
    stage1 = (f"__bin__/gs -sOutputFile={xps} -sDEVICE=xpswrite -r300 "
              "-sDEFAULTPAPERSIZE=letter -dNOPAUSE -dBATCH -dJOBSERVER -")
    stage2 = (f"__bin__/gxps -sOutputFile='|md5sum >> __temp__/{i}.md5' "
              "-dMaxBitmap=30000000 -sDEVICE=pkmraw -r300 -dNOPAUSE -dBATCH -K1000000 "
              f"{xps}")
    assert _steps(_jobs(tree, ["xpswrite"])[i].command) == [
        f"touch __temp__/{i}.md5", f"echo 'gs xpswrite' >> {log}",
        f"echo {shlex.quote(stage1 + ' < __tests__/ps/six.ps')} >> {log}",
        f"{TIME} {stage1} >> {log} 2>&1 < __tests__/ps/six.ps",
        f"echo --- >> {log}", f"md5sum {xps} >> {log} 2>&1",
        f"echo {shlex.quote(stage2)} >> {log}", f"{TIME} {stage2} >> {log} 2>&1",
        f"rm -f {xps}"]


def test_xpswrite_of_a_pdf_passes_it_as_an_argument(tree: Path) -> None:
    """A PDF is a gs argument in stage 1 too."""
    cmd = _jobs(tree, ["xpswrite"])["pdf__seven.pdf.xps.ppmraw.72.0"].command
    assert "-dJOBSERVER __tests__/pdf/seven.pdf >> __temp__/" in cmd


def test_percent_is_doubled_only_where_the_graphics_library_expands_it(tmp_path: Path) -> None:
    """-sOutputFile expands %d in gpcl6 and gxps as in gs; input names are not expanded."""
    root = tmp_path / "t"
    root.mkdir()
    (root / "p%d.pcl").write_bytes(b"\x1bE")
    (root / "q%d.ps").write_bytes(b"%!\n")
    pcl = _jobs(root, ["pcl"])["p%d.pcl.pdf.ppmraw.75.0"].command
    assert "-sOutputFile=__temp__/p%%d.pcl.pdf.ppmraw.75.0.pdf " in pcl
    assert " __tests__/p%d.pcl >> " in pcl
    xps = _jobs(root, ["xpswrite"])["q%d.ps.xps.ppmraw.72.0"].command
    assert "-sOutputFile=__temp__/q%%d.ps.xps.ppmraw.72.0.xps " in xps
    assert "'|md5sum >> __temp__/q%%d.ps.xps.ppmraw.72.0.md5'" in xps
    assert " -K1000000 __temp__/q%d.ps.xps.ppmraw.72.0.xps >> " in xps
    assert xps.endswith("; rm -f __temp__/q%d.ps.xps.ppmraw.72.0.xps")


def test_seeking_devices_write_a_file_for_gxps_too(tree: Path) -> None:
    """A tiff device cannot write to a pipe whichever interpreter drives it."""
    i = "ps__six.ps.xps.tiff24nc.72.0"
    cmd = _jobs(tree, ["xpswrite"], xpswrite_configs=("xps.tiff24nc.72.0",))[i].command
    assert f"__bin__/gxps -sOutputFile=__temp__/{i}.raster " in cmd
    assert (f"test -f __temp__/{i}.raster && md5sum < __temp__/{i}.raster >> "
            f"__temp__/{i}.md5 ; rm -f __temp__/{i}.raster ; rm -f __temp__/{i}.xps") in cmd


def test_lowres_and_highres_select_the_pcl_resolutions(tree: Path) -> None:
    """75 dpi is low resolution, 600 high: build.pl's pcl list splits in two."""
    def configs(options: JobOptions) -> set[str]:
        return {j.name.split(".", 2)[2] for j in generate(CFG, ["pcl"], tree, options)
                if j.name.startswith("pcl__one.pcl.")}

    assert configs(JobOptions(lowres=True)) == {"pbmraw.75.0", "ppmraw.75.0",
                                                "pdf.ppmraw.75.0"}
    assert configs(JobOptions(highres=True)) == {"pbmraw.600.1", "ppmraw.600.1",
                                                 "pdf.ppmraw.600.0"}


# --- what a node needs ------------------------------------------------------------------------

@pytest.mark.parametrize(("product", "binaries"), [
    ("pcl", {"gpcl6", "gs"}),            # gs rasterises pcl's pdf.* tests
    ("xps", {"gxps", "gs"}),
    ("xpswrite", {"gs", "gxps"}),
    ("gs", {"gs"}),
])
def test_the_binaries_a_node_checks(tree: Path, product: str, binaries: set[str]) -> None:
    """The names the node reads out of ``__bin__/<name>`` (nodejobs's own pattern) are the
    programs ghostpdl's ``make gpcl6 gxps gs`` puts in bin/."""
    found = {name for job in _jobs(tree, [product]).values()
             for name in BIN_NAME.findall(job.command)}
    assert found == binaries


@pytest.mark.parametrize("products", [["pcl"], ["xps"], ["xpswrite"], ["gs"], ["mupdf"],
                                      ["shell"], ["gs", "pcl", "xps", "xpswrite"],
                                      ["pdfwrite", "ps2write"]])
def test_required_programs_are_the_binaries_the_jobs_name(tmp_path: Path,
                                                          products: list[str]) -> None:
    """What a build must make for a run equals the ``__bin__/<name>`` its job lines name."""
    root = tmp_path / "t"
    for name in ("a.pcl", "b.xps", "c.ps", "d.pdf", "e.cmds"):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("echo 1\n")
    named = {name for job in generate(CFG, products, root)
             for name in BIN_NAME.findall(job.command)}
    assert jobgen.required_programs(CFG, products) == sorted(named)


def test_required_programs_follow_the_configurations() -> None:
    """A pcl list without two-stage configs needs gpcl6 alone; with xps.* also gxps."""
    assert jobgen.required_programs(CFG, ["pcl"]) == ["gpcl6", "gs"]
    raster_only = CFG.with_changes(pcl_configs=("pbmraw.75.0",))
    assert jobgen.required_programs(raster_only, ["pcl"]) == ["gpcl6"]
    via_xps = CFG.with_changes(pcl_configs=("xps.pbmraw.75.0",))
    assert jobgen.required_programs(via_xps, ["pcl"]) == ["gpcl6", "gxps"]


def test_every_line_parses_back(tree: Path) -> None:
    """Each job line of the new products survives the job-line grammar."""
    for job in _jobs(tree, ["pcl", "xps", "xpswrite"]).values():
        assert Job.parse(job.line) == job
        assert job.logfile == f"__temp__/{job.name}.log"


def test_build_py_prints_the_new_products(tree: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``build.py pcl xps xpswrite lowres`` prints their low-resolution jobs."""
    assert build_cli.main(["--tests", str(tree), "--seed", "1", "pcl", "xps", "xpswrite",
                           "lowres"]) == 0
    names = {Job.parse(line).name for line in capsys.readouterr().out.splitlines()}
    assert len(names) == 4 * 3 + 1 * 4 + 2 * 1
    assert "xl__four.prn.pdf.ppmraw.75.0" in names
    assert "ps__six.ps.xps.ppmraw.72.0" in names


def _bmpcmp_steps(tree: Path, test_id: str, word: str, **changes: object) -> list[str]:
    """The steps of the one bmpcmp job of ``test_id`` listed with product ``word``."""
    cfg = CFG.with_changes(**changes) if changes else CFG
    (job,) = bmpcmp_jobgen.bmpcmp_jobs(cfg, [(test_id, word)], tree)
    assert job.name == test_id and Job.parse(job.line) == job
    return _steps(job.command)


def _ran(steps: list[str]) -> list[str]:
    """The program and first argument of each timed step, in order."""
    return [" ".join(step[len(TIME):].split()[:2]) for step in steps if step.startswith(TIME)]


@pytest.mark.parametrize("word", ["pcl pdfwrite", "pcl"])
def test_bmpcmp_of_a_pcl_two_stage_test_has_gpcl6_write_the_pdf(tree: Path, word: str) -> None:
    """A pcl ``pdf.*`` test, listed by its .tab column or its product: each build's gpcl6
    writes the PDF from the PCL file, each build's gs rasterises it; the log says what the
    test's own log says (``pcl pdfwrite``)."""
    test_id = "xl__four.prn.pdf.ppmraw.75.0"
    steps = _bmpcmp_steps(tree, test_id, word)
    log = f"__temp__/{test_id}.log"
    assert f"echo 'pcl pdfwrite' >> {log}" in steps
    base_pdf, cand_pdf = (f"__temp__/{test_id}.{b}.pdf" for b in ("base", "cand"))
    base_pnm, cand_pnm = (f"__temp__/{test_id}.{b}.pnm" for b in ("base", "cand"))
    assert _ran(steps) == [
        f"__baseline__/gpcl6 -sOutputFile={base_pdf}", f"__bin__/gpcl6 -sOutputFile={cand_pdf}",
        f"__baseline__/gs -sOutputFile={base_pnm}", f"__bin__/gs -sOutputFile={cand_pnm}",
        "__python__ -m"]
    stage1 = next(s for s in steps if s.startswith(f"{TIME} __bin__/gpcl6"))
    assert stage1 == (f"{TIME} __bin__/gpcl6 -sOutputFile={cand_pdf} -sDEVICE=pdfwrite -r75 "
                      f"-dNOPAUSE -dBATCH __tests__/xl/four.prn >> {log} 2>&1")
    assert steps.index(f"echo --- >> {log}") == steps.index(stage1) + 1
    assert steps[-1] == f"rm -f {base_pnm} {cand_pnm} {base_pdf} {cand_pdf}"


def test_bmpcmp_of_one_stage_pcl_and_xps_tests_renders_with_their_program(tree: Path) -> None:
    """``pcl`` and ``xps`` tests are rendered by gpcl6 and gxps of both builds, the file as
    their argument, to a PNM file; no gs."""
    for test_id, word, program, path in (
            ("pcl__one.pcl.ppmraw.75.0", "pcl", "gpcl6", "pcl/one.pcl"),
            ("xps__five.xps.pbmraw.600.1", "xps", "gxps", "xps/five.xps")):
        steps = _bmpcmp_steps(tree, test_id, word)
        assert f"echo {word} >> __temp__/{test_id}.log" in steps
        assert [r.split()[0] for r in _ran(steps)] == [
            f"__baseline__/{program}", f"__bin__/{program}", "__python__"]
        assert all(f"__tests__/{path} >> " in s for s in steps
                   if s.startswith(f"{TIME} __") and program in s)


@pytest.mark.parametrize(("test_id", "word", "writer"), [
    ("ps__six.ps.xps.ppmraw.72.0", "gs xpswrite", "gs"),
    ("ps__six.ps.xps.ppmraw.72.0", "xpswrite", "gs"),
    ("xps__five.xps.pdf.ppmraw.72.0", "xps pdfwrite", "gxps"),
])
def test_bmpcmp_of_other_two_stage_tests_uses_their_writer_and_rasteriser(
        tree: Path, test_id: str, word: str, writer: str) -> None:
    """xpswrite: gs writes the XPS, gxps renders it; gxps's pdfwrite: gxps writes the PDF,
    gs renders it.  Each build uses its own programs for both stages."""
    changes = {"xps_configs": ("pdf.ppmraw.72.0",), "xpswrite_configs": ("xps.ppmraw.72.0",)}
    steps = _bmpcmp_steps(tree, test_id, word, **changes)
    suffix, rasteriser = ("xps", "gxps") if writer == "gs" else ("pdf", "gs")
    assert [r.split()[0] for r in _ran(steps)] == [
        f"__baseline__/{writer}", f"__bin__/{writer}", f"__baseline__/{rasteriser}",
        f"__bin__/{rasteriser}", "__python__"]
    assert f"-sOutputFile=__temp__/{test_id}.base.{suffix}" in _ran(steps)[0]
    assert any(s.endswith(f"__temp__/{test_id}.cand.{suffix} >> __temp__/{test_id}.log 2>&1")
               for s in steps if s.startswith(f"{TIME} __bin__/{rasteriser}"))


def test_the_changed_list_keeps_pcl_and_xps_two_stage_tests_theirs() -> None:
    """The changed list of a run names a test's product by its .tab column: gs's two-stage
    columns are the products pdfwrite/ps2write/xpswrite; gpcl6's and gxps's stay pcl and xps
    (not pdfwrite, which bmpcmp would render with gs); every word is one bmpcmp knows."""
    from cluster.master.end.finish import product_word

    assert [product_word(c) for c in ("gs", "gs pdfwrite", "gs ps2write", "gs xpswrite",
                                      "pcl", "pcl pdfwrite", "xps ps2write", "xps xpswrite",
                                      "mupdf", "shell")] == [
        "gs", "pdfwrite", "ps2write", "xpswrite", "pcl", "pcl", "xps", "xps", "mupdf",
        "shell"]
    for column in ("gs", "gs pdfwrite", "pcl", "pcl pdfwrite", "xps", "xps xpswrite"):
        assert product_word(column) in bmpcmp_jobgen.BMPCMP_PRODUCTS


# --- products in the queue grammar ------------------------------------------------------------

def test_queue_and_path_products_accept_the_new_products() -> None:
    """A push of ``pcl xps`` queues ``user ann pcl,xps``; commit runs may map paths to them."""
    assert {"pcl", "xps", "xpswrite"} <= set(PRODUCTS)
    assert {"pcl", "xps", "xpswrite"} <= set(MAP_PRODUCTS)
    assert not {"pcl", "xps", "xpswrite"} & set(ALONE)
    spec = RunSpec.parse("user ann xps,pcl,gs")
    assert spec.products == ("gs", "pcl", "xps")
    assert spec.line() == "user ann gs,pcl,xps"
    assert RunSpec.parse("git 0123abc xpswrite").products == ("xpswrite",)
    rules = parse_path_products(["pcl/=pcl", "xps/=xps,xpswrite"])
    assert [r.products for r in rules] == [("pcl",), ("xpswrite", "xps")]


def test_clusterpush_words_queue_the_new_products() -> None:
    """``clusterpush.py pcl xps lowres`` queues one run of both products."""
    from argparse import Namespace

    from cluster.cli import clusterpush

    spec = clusterpush._spec(Namespace(words=["pcl", "xps", "lowres"], user="ann"))
    assert spec.line() == "user ann pcl,xps lowres"
