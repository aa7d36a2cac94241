"""Unit tests of cluster.jobs (build.pl's job list) and the build.py CLI."""

from __future__ import annotations

import logging
import random
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.cli import build as build_cli
from cluster.config import Config
from cluster.errors import ConfigError
from cluster.jobs import bmpcmp as bmpcmp_jobgen
from cluster.jobs import generate as jobgen
from cluster.jobs.commands import JobConfig
from cluster.jobs.corpus import find_test_files
from cluster.jobs.generate import JobOptions, generate
from cluster.records import TEST_ID, Job
from tests.helpers import REPO

CORPUS = REPO / "corpus"  # the repository's corpus (never a path outside the checkout)
CFG = Config()


def make_tree(root: Path, names: list[str]) -> Path:
    """Create empty files (parents included) under root; return root."""
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"%!PS\nshowpage\n")
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "tests", ["a/one.ps", "a/two.pdf", "b/three.eps"])


# --- ids and counts ---------------------------------------------------------------------------

def test_real_corpus_counts_are_files_times_configs() -> None:
    """Every corpus file gets every configuration of every product."""
    files = find_test_files(CORPUS, CFG.gs_extensions)
    assert len(files) == 15
    jobs = generate(CFG, ["gs", "pdfwrite", "ps2write"], CORPUS, rng=random.Random(0))
    per_file = len(CFG.gs_configs) + len(CFG.pdfwrite_configs) + len(CFG.ps2write_configs)
    assert len(jobs) == 15 * per_file == 15 * 21
    names = {j.name for j in jobs}
    assert "ghostpdl-examples__golfer.eps.ppmraw.300.1" in names
    assert "ghostpdl-examples__tiger.eps.pdf.ppmraw.72.0" in names
    assert "ghostpdl-examples__tiger.eps.ps.pkmraw.300.0" in names
    mupdf = generate(CFG, ["mupdf"], CORPUS)
    assert len(mupdf) == 2 * len(CFG.mupdf_configs)  # spots2.pdf, text_graphic_image.pdf


def test_job_fields_and_line_round_trip(tree: Path) -> None:
    """A job is named by its test id, logs to __temp__/<id>.log and its line parses back."""
    jobs = generate(CFG, ["gs", "pdfwrite", "ps2write", ], tree, rng=random.Random(1))
    for job in jobs:
        assert TEST_ID.fullmatch(job.name)
        assert job.logfile == f"__temp__/{job.name}.log"
        assert Job.parse(job.line) == job
        assert job.line.startswith(f"{job.name} {job.logfile} true ; touch __temp__/")
    assert {j.name.split(".")[0] for j in jobs} == {"a__one", "a__two", "b__three"}


def test_ids_are_unique(tree: Path) -> None:
    """No test id repeats across products and configurations."""
    jobs = generate(CFG, ["gs", "pdfwrite", "ps2write"], tree)
    assert len({j.name for j in jobs}) == len(jobs)


def test_duplicate_products_are_ignored(tree: Path) -> None:
    """Naming a product twice builds it once."""
    assert len(generate(CFG, ["gs", "gs"], tree)) == len(generate(CFG, ["gs"], tree))


def test_unknown_product_is_an_error(tree: Path) -> None:
    """An unknown product raises ValueError naming it and the known ones."""
    with pytest.raises(ValueError, match=r"'svg'.*gs, pdfwrite, ps2write, xpswrite, pcl, xps, "
                       "mupdf"):
        generate(CFG, ["gs", "svg"], tree)


def test_gs_and_mupdf_on_the_same_pdf_collide(tree: Path) -> None:
    """Two products making the same id is refused rather than producing duplicate ids."""
    with pytest.raises(ValueError, match=r"a__two\.pdf\.ppmraw\.72\.0.*gs.*mupdf"):
        generate(CFG, ["gs", "mupdf"], tree)


def test_gs_configs_may_hold_two_stage_configs(tree: Path) -> None:
    """Like build.pl's gs list, a pdf. config in gs_configs makes a two-stage test."""
    cfg = CFG.with_changes(gs_configs=("ppmraw.72.0", "pdf.pgmraw.72.0"))
    jobs = {j.name: j for j in generate(cfg, ["gs"], tree)}
    assert "echo 'gs pdfwrite'" in jobs["a__one.ps.pdf.pgmraw.72.0"].command


@pytest.mark.parametrize(("key", "value"), [
    ("gs_configs", ("ppmraw.72",)),
    ("gs_configs", ("ppmraw.72.2",)),
    ("gs_configs", ("ppm raw.72.0",)),
    ("pdfwrite_configs", ("ppmraw.72.0",)),
    ("ps2write_configs", ("pdf.ppmraw.72.0",)),
    ("mupdf_configs", ("pdf.ppmraw.72.0",)),
    ("mupdf_configs", ("psdcmyk.72.0",)),
])
def test_bad_configurations_are_config_errors(tree: Path, key: str,
                                              value: tuple[str, ...]) -> None:
    """A malformed or unsupported configuration names its key and the expected form."""
    product = {"gs_configs": "gs", "pdfwrite_configs": "pdfwrite",
               "ps2write_configs": "ps2write", "mupdf_configs": "mupdf"}[key]
    with pytest.raises(ConfigError) as info:
        generate(CFG.with_changes(**{key: value}), [product], tree)
    assert info.value.key == key
    assert info.value.value == value[0]


def test_config_parse() -> None:
    """Configs parse into device, resolution, band and stage-1 kind."""
    assert JobConfig.parse("pdf.pkmraw.300.1") == JobConfig("pdf.pkmraw.300.1", "pkmraw",
                                                              300, 1, "pdf")
    assert JobConfig.parse("cups.300.1").two_stage is None


# --- selection --------------------------------------------------------------------------------

def _resolutions(jobs: list[Job]) -> set[int]:
    return {int(j.name.split(".")[-2]) for j in jobs}


def test_lowres_and_highres(tree: Path) -> None:
    """lowres keeps 72/75 dpi, highres 150-600 dpi, both keep either, neither keeps all."""
    products = ["gs", "pdfwrite", "ps2write"]
    assert _resolutions(generate(CFG, products, tree, JobOptions(lowres=True))) == {72}
    assert _resolutions(generate(CFG, products, tree, JobOptions(highres=True))) == {300}
    both = generate(CFG, products, tree, JobOptions(lowres=True, highres=True))
    assert len(both) == len(generate(CFG, products, tree))
    cfg = CFG.with_changes(gs_configs=("ppmraw.75.0", "ppmraw.150.0", "ppmraw.200.0",
                                       "ppmraw.600.1", "ppmraw.100.0"))
    assert _resolutions(generate(cfg, ["gs"], tree, JobOptions(lowres=True))) == {75}
    assert _resolutions(generate(cfg, ["gs"], tree, JobOptions(highres=True))) == {150, 200,
                                                                                   600}


def test_filters_and_within_or_across(tree: Path) -> None:
    """filter=a,b needs a and b in the id; two filter= words keep either."""
    opts = JobOptions(filters=("one,pgmraw",))
    names = {j.name for j in generate(CFG, ["gs"], tree, opts)}
    assert names and all("one" in n and "pgmraw" in n for n in names)
    opts = JobOptions(filters=("one,pgmraw.72", "three.eps.pam"))
    names = {j.name for j in generate(CFG, ["gs"], tree, opts)}
    assert names == {"a__one.ps.pgmraw.72.0", "b__three.eps.pam.72.0"}
    assert generate(CFG, ["gs"], tree, JobOptions(filters=("nothing-matches",))) == []


def test_find_test_files_skips(tmp_path: Path) -> None:
    """Dot files and dirs, *.disabled, other extensions and nightly-only files are skipped."""
    root = make_tree(tmp_path / "t", [
        "d/keep.ps", "d/UPPER.PDF", "d/.hidden.ps", "d/off.ps.disabled", "d/notes.txt",
        ".svn/x.ps", "d/night.pdf", "d/sub/deep.eps", "noext", "d/nightly_only.lst"])
    (root / "d" / "dir.ps").mkdir()
    (root / "d" / "nightly_only.lst").write_text("night.pdf\n")
    (root / "d" / "dangling.ps").symlink_to(root / "missing")
    exts = ("ps", "eps", "pdf")
    assert find_test_files(root, exts) == ["d/UPPER.PDF", "d/keep.ps", "d/sub/deep.eps"]
    assert "d/night.pdf" in find_test_files(root, exts, nightly=True)
    assert find_test_files(root, ("pdf",)) == ["d/UPPER.PDF"]


def test_missing_tests_root(tmp_path: Path) -> None:
    """A corpus that is not a directory is a FileNotFoundError naming it."""
    with pytest.raises(FileNotFoundError) as info:
        find_test_files(tmp_path / "nope", ("ps",))
    assert info.value.filename == str(tmp_path / "nope")


HOSTILE = ["has space.ps", "quote'.ps", 'dq".ps', "$(touch pwned).ps", "back`tick`.ps",
           "semi;colon.ps", "new\nline.ps", "tab\there.ps", "amp&.ps", "pipe|.ps",
           "star*.ps", "glob?.ps", "x/__temp__y.ps",
           "temp__/z.ps", "caf\u00e9.ps", "a" * 200 + "/" + "b" * 210 + ".ps"]


def test_hostile_names_are_skipped_with_a_warning(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Names that would not make a safe test id are skipped and logged, never run."""
    # At the top, a leading - or _ would start the id (gs would take "-dash.ps" as a switch).
    root = make_tree(tmp_path / "t", ["ok/fine.ps", "-dash.ps", "_under.ps",
                                      *[f"ok/{n}" for n in HOSTILE]])
    caplog.set_level(logging.WARNING, logger="cluster.build")
    assert find_test_files(root, ("ps",)) == ["ok/fine.ps"]
    text = caplog.text
    for name in ("ok/has space.ps", "ok/$(touch pwned).ps", "ok/semi;colon.ps", "-dash.ps"):
        assert repr(name) in text
    assert "new\\nline.ps" in text
    assert "may only contain letters, digits" in text
    assert "placeholder __temp__" in text
    assert all(r.name == "cluster.build" for r in caplog.records)
    jobs = generate(CFG, ["gs", "pdfwrite"], root)
    assert {j.name.split(".ps.")[0] for j in jobs} == {"ok__fine"}
    assert not (tmp_path / "pwned").exists()


def test_colliding_ids_keep_the_first_file(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """a/b__c.ps and a__b/c.ps share an id: the second (sorted) is skipped with a warning."""
    root = make_tree(tmp_path / "t", ["a/b__c.ps", "a__b/c.ps"])
    caplog.set_level(logging.WARNING, logger="cluster.build")
    assert find_test_files(root, ("ps",)) == ["a/b__c.ps"]
    assert "'a__b/c.ps'" in caplog.text and "already used" in caplog.text


# --- ordering ---------------------------------------------------------------------------------

def test_slow_first_quick_last(tree: Path) -> None:
    """slowfiles.lst jobs come first and quickfiles.lst jobs last, each group shuffled."""
    (tree / "slowfiles.lst").write_text("# slow ones\nb/three.eps\na__two.pdf.ppmraw.72.0\n")
    (tree / "quickfiles.lst").write_text("a__one.ps\n\n")
    jobs = generate(CFG, ["gs"], tree, rng=random.Random(5))
    n = len(CFG.gs_configs)
    kinds = ["slow" if j.name.startswith("b__three") or j.name == "a__two.pdf.ppmraw.72.0"
             else "quick" if j.name.startswith("a__one") else "normal" for j in jobs]
    assert kinds == ["slow"] * (n + 1) + ["normal"] * (n - 1) + ["quick"] * n
    again = generate(CFG, ["gs"], tree, rng=random.Random(5))
    assert [j.name for j in again] == [j.name for j in jobs]
    other = generate(CFG, ["gs"], tree, rng=random.Random(6))
    assert [j.name for j in other] != [j.name for j in jobs]
    assert sorted(j.name for j in other) == sorted(j.name for j in jobs)


# --- commands ---------------------------------------------------------------------------------

def _jobs(tree: Path, products: list[str], **changes: object) -> dict[str, Job]:
    cfg = CFG.with_changes(**changes) if changes else CFG
    return {j.name: j for j in generate(cfg, products, tree)}


def test_gs_raster_command_exact(tree: Path) -> None:
    """A PS raster job feeds the file on stdin and pipes the raster into md5sum."""
    job = _jobs(tree, ["gs"])["b__three.eps.ppmraw.300.0"]
    i = "b__three.eps.ppmraw.300.0"
    gs = (f"__bin__/gs -sOutputFile='|md5sum >> __temp__/{i}.md5' -dMaxBitmap=30000000 "
          "-sDEVICE=ppmraw -r300 -sDEFAULTPAPERSIZE=letter -dNOPAUSE -dBATCH -K1000000 "
          "-dJOBSERVER -")
    assert job.command == (
        f"touch __temp__/{i}.md5 ; echo gs >> __temp__/{i}.log ; "
        f"echo {shlex.quote(gs + ' < __tests__/b/three.eps')} >> __temp__/{i}.log ; "
        f'/usr/bin/time -f "%U %S %E %P" {gs} >> __temp__/{i}.log 2>&1 '
        "< __tests__/b/three.eps")


def test_gs_command_variants(tmp_path: Path) -> None:
    """PDF/AI are arguments, banding sets MaxBitmap, bitrgb/cups get their extras, .PS CET."""
    root = make_tree(tmp_path / "t", ["x.pdf", "y.AI", "z.PS", "w.ps"])
    jobs = _jobs(root, ["gs"], gs_memory_kb=12345,
                 gs_configs=("ppmraw.72.1", "bitrgb.72.0", "cups.300.1"))
    pdf = jobs["x.pdf.ppmraw.72.1"].command
    assert pdf.endswith(" -dJOBSERVER __tests__/x.pdf >> __temp__/x.pdf.ppmraw.72.1.log 2>&1")
    assert "-dMaxBitmap=10000 " in pdf and "-K12345 " in pdf
    assert jobs["y.AI.ppmraw.72.1"].command.endswith("__tests__/y.AI >> "
                                                     "__temp__/y.AI.ppmraw.72.1.log 2>&1")
    assert "-sDEVICE=bitrgb -dGrayValues=256 -r72" in jobs["w.ps.bitrgb.72.0"].command
    assert "-sDEVICE=cups -dcupsColorSpace=0 -r300" in jobs["w.ps.cups.300.1"].command
    assert "-dGrayValues" not in jobs["w.ps.cups.300.1"].command
    assert "-dJOBSERVER -dCETMODE - >> " in jobs["z.PS.ppmraw.72.1"].command
    assert "CETMODE" not in jobs["w.ps.ppmraw.72.1"].command
    assert " nice " not in pdf


def test_seeking_devices_write_a_file(tree: Path) -> None:
    """psd/tiff devices cannot write to a pipe: their file is md5summed, then removed."""
    jobs = _jobs(tree, ["gs", "pdfwrite"], pdfwrite_configs=("pdf.psdcmyk.72.0",),
                 gs_configs=("psdcmyk.72.0", "tiffg4.72.0"))
    for i in ("a__one.ps.psdcmyk.72.0", "a__one.ps.tiffg4.72.0", "a__one.ps.pdf.psdcmyk.72.0"):
        cmd = jobs[i].command
        assert f"-sOutputFile=__temp__/{i}.raster " in cmd
        assert "|md5sum" not in cmd
        assert (f" ; test -f __temp__/{i}.raster && md5sum < __temp__/{i}.raster >> "
                f"__temp__/{i}.md5 ; rm -f __temp__/{i}.raster") in cmd


def test_percent_in_name_is_escaped_for_gs(tmp_path: Path) -> None:
    """gs expands %d in output names, so a % in a test id is doubled there only."""
    root = make_tree(tmp_path / "t", ["p%d.ps"])
    job = _jobs(root, ["pdfwrite"])["p%d.ps.pdf.ppmraw.72.0"]
    assert "-sOutputFile=__temp__/p%%d.ps.pdf.ppmraw.72.0.pdf " in job.command
    assert "'|md5sum >> __temp__/p%%d.ps.pdf.ppmraw.72.0.md5'" in job.command
    assert "touch __temp__/p%d.ps.pdf.ppmraw.72.0.md5 ;" in job.command
    assert job.command.endswith("; rm -f __temp__/p%d.ps.pdf.ppmraw.72.0.pdf")


@pytest.mark.parametrize(("product", "prefix", "suffix", "device"),
                         [("pdfwrite", "pdf", "pdf", "pdfwrite"),
                          ("ps2write", "ps", "ps", "ps2write")])
def test_two_stage_command(tree: Path, product: str, prefix: str, suffix: str,
                           device: str) -> None:
    """Stage 1 writes the intermediate, --- divides, stage 2 gs rasterises it, rm cleans."""
    i = f"a__one.ps.{prefix}.pkmraw.300.0"
    cmd = _jobs(tree, [product])[i].command
    log, mid = f"__temp__/{i}.log", f"__temp__/{i}.{suffix}"
    parts = [p.strip() for p in cmd.split(" ; ")]
    assert parts[0] == f"touch __temp__/{i}.md5"
    assert parts[1] == f"echo 'gs {device}' >> {log}"
    assert parts[3].startswith(f'/usr/bin/time -f "%U %S %E %P" __bin__/gs '
                               f"-sOutputFile={mid} -sDEVICE={device} -r300 ")
    assert parts[3].endswith(f"- >> {log} 2>&1 < __tests__/a/one.ps")
    assert "-K" not in parts[3] and "MaxBitmap" not in parts[3]
    assert parts[4] == f"echo --- >> {log}"
    assert parts[5] == f"md5sum {mid} >> {log} 2>&1"
    assert parts[7].startswith(f"/usr/bin/time -f \"%U %S %E %P\" __bin__/gs "
                               f"-sOutputFile='|md5sum >> __temp__/{i}.md5' "
                               "-dMaxBitmap=30000000 -sDEVICE=pkmraw -r300 ")
    assert parts[7].endswith(f"-K1000000 -dJOBSERVER {mid} >> {log} 2>&1")
    assert parts[8] == f"rm -f {mid}"


def test_mupdf_command(tree: Path) -> None:
    """mupdf runs mutool draw into md5sum with its stderr (and time's) in the log."""
    jobs = _jobs(tree, ["mupdf"], mupdf_configs=("ppmraw.72.0", "pgmraw.300.1", "pam.72.0"))
    assert set(jobs) == {"a__two.pdf.ppmraw.72.0", "a__two.pdf.pgmraw.300.1",
                         "a__two.pdf.pam.72.0"}
    i = "a__two.pdf.pgmraw.300.1"
    draw = "__bin__/mutool draw -q -r300 -B 64 -F pgm -o - __tests__/a/two.pdf"
    assert jobs[i].command == (
        f"touch __temp__/{i}.md5 ; echo mupdf >> __temp__/{i}.log ; "
        f"echo '{draw}' >> __temp__/{i}.log ; "
        f'/usr/bin/time -f "%U %S %E %P" {draw} 2>> __temp__/{i}.log '
        f"| md5sum >> __temp__/{i}.md5")
    assert "-B" not in jobs["a__two.pdf.ppmraw.72.0"].command
    assert "-F ppm " in jobs["a__two.pdf.ppmraw.72.0"].command
    assert "-F pam " in jobs["a__two.pdf.pam.72.0"].command


# --- CLI --------------------------------------------------------------------------------------

def test_cli_prints_job_lines(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """build.py prints one parseable job line per job, repeatably with --seed."""
    argv = ["--tests", str(tree), "--seed", "7", "gs", "pdfwrite", "lowres", "filter=one"]
    assert build_cli.main(argv) == 0
    first = capsys.readouterr().out.splitlines()
    jobs = [Job.parse(line) for line in first]
    assert jobs and all(j.name.startswith("a__one.ps.") and ".72." in j.name for j in jobs)
    assert len(jobs) == 6 + 1  # 6 gs 72 dpi configs + pdf.ppmraw.72.0
    assert build_cli.main(argv) == 0
    assert capsys.readouterr().out.splitlines() == first


def test_cli_only_keeps_the_listed_tests(tree: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """--only FILE (a bisection run's tests) keeps exactly the jobs of the ids it lists."""
    assert build_cli.main(["--tests", str(tree), "gs", "lowres"]) == 0
    every = [Job.parse(line).name for line in capsys.readouterr().out.splitlines()]
    wanted = sorted(every[::5])
    listing = tmp_path / "culprit.lst"
    listing.write_text("".join(n + "\n" for n in [*wanted, "not__a.ps.test"]))
    assert build_cli.main(["--tests", str(tree), "--only", str(listing), "gs", "lowres"]) == 0
    kept = [Job.parse(line).name for line in capsys.readouterr().out.splitlines()]
    assert sorted(kept) == wanted and len(wanted) < len(every)


def test_cli_defaults_to_the_non_mupdf_products(tree: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """With no product, build.py builds gs, pdfwrite and ps2write as build.pl did."""
    assert build_cli.main(["--tests", str(tree)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3 * 21


def test_cli_home_and_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--home picks <home>/tests; --set overrides configuration keys."""
    make_tree(tmp_path / "home" / "tests", ["f.pdf"])
    argv = ["--home", str(tmp_path / "home"), "--set", "mupdf_configs=pbmraw.72.0", "mupdf"]
    assert build_cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert [Job.parse(line).name for line in out] == ["f.pdf.pbmraw.72.0"]


@pytest.mark.parametrize(("argv", "needle"), [
    (["gs", "bogus"], "'bogus'"),
    (["svg"], "gs, pdfwrite, ps2write, xpswrite, pcl, xps, mupdf"),
    (["filter=", "gs"], "empty filter"),
    (["--set", "nokey", "gs"], "key=value"),
    (["--set", "gs_configs=ppmraw", "gs"], "device.res.band"),
    (["--set", "no_such_key=1", "gs"], "no_such_key"),
    (["--seed", "x", "gs"], "--seed"),
    (["--frobnicate"], "--frobnicate"),
    (["gs", "mupdf"], "separate runs"),
])
def test_cli_bad_arguments_exit_2(tree: Path, capsys: pytest.CaptureFixture[str],
                                  argv: list[str], needle: str) -> None:
    """Bad words and options print a message naming them on stderr and exit 2."""
    assert build_cli.main(["--tests", str(tree), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert needle in captured.err


def test_cli_missing_corpus_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unreadable corpus is reported with its path and exit status 1."""
    assert build_cli.main(["--tests", str(tmp_path / "none"), "gs"]) == 1
    assert str(tmp_path / "none") in capsys.readouterr().err


def test_product_list_matches_specs() -> None:
    """Every advertised product can be generated (sweep's jobs: cluster.jobs.sweepjobs)."""
    assert set(jobgen.PRODUCTS) == set(jobgen.PRODUCT_SPECS) | {"shell", "sweep"}
    assert set(jobgen.DEFAULT_PRODUCTS) < set(jobgen.PRODUCT_SPECS)


def test_shell_product_makes_one_job_per_command_line(tmp_path: Path) -> None:
    """Each non-blank, non-comment line of a .cmds file is a job, in file order."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "small.cmds").write_text("# comment\necho 17 | md5sum\n\nfalse\n")
    (tmp_path / "ignored.ps").write_text("%!\n")
    jobs = jobgen.generate(Config(), ["shell"], tmp_path)
    assert [j.name for j in jobs] == ["bench__small.cmds.2", "bench__small.cmds.4"]
    assert "{ echo 17 | md5sum ; } > __temp__/bench__small.cmds.2.out" in jobs[0].command
    with pytest.raises(ValueError, match="alone"):
        jobgen.generate(Config(), ["shell", "gs"], tmp_path)


def test_shell_jobs_report_output_md5_and_failures(tmp_path: Path) -> None:
    """Run for real: stdout is the result; a failing command is an error."""
    import hashlib
    import subprocess

    from cluster.node import readlog

    (tmp_path / "t.cmds").write_text("echo 17 | md5sum\nexit 3\n")
    for job in jobgen.generate(Config(), ["shell"], tmp_path):
        status = subprocess.run(["sh", "-c", job.command.replace("__temp__", str(tmp_path))],
                                check=False).returncode
        log = (tmp_path / f"{job.name}.log").read_text()
        out = (tmp_path / f"{job.name}.out").read_bytes()
        md5 = hashlib.md5(out).hexdigest()
        result = readlog.classify(job.name, log, f"{md5}  -\n", False, exit_status=status)
        if job.name.endswith(".1"):
            assert out == subprocess.run("echo 17 | md5sum", shell=True,
                                         capture_output=True).stdout
            assert (result.error, result.md5, result.product) == (0, md5, "shell")
        else:
            assert status == 3 and result.error == 1 and result.md5 == "0"


def test_shell_job_ids_past_the_length_limit_are_skipped(tmp_path: Path) -> None:
    """Ids are checked without a regex per line, but as strictly: 401 characters at most."""
    (tmp_path / ("d" * 190)).mkdir()
    for base, last in ((201, 12), (202, 9)):  # stems of 398 and 399 characters
        path = tmp_path / ("d" * 190) / f"{'b' * base}.cmds"
        path.write_text("true\n" * 12)
        stem = f"{'d' * 190}__{'b' * base}.cmds"
        names = [j.name for j in jobgen.generate(Config(), ["shell"], tmp_path)]
        assert names == [f"{stem}.{n}" for n in range(1, last + 1)]
        assert all(TEST_ID.fullmatch(n) for n in names)
        path.unlink()


# --- bmpcmp jobs ------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def test_bmpcmp_device_mapping() -> None:
    """PNM devices are kept; grey -> pgmraw, mono -> pbmraw, any other colour -> ppmraw."""
    assert [bmpcmp_jobgen.bmpcmp_device(d) for d in ("pbmraw", "pgmraw", "ppmraw", "pkmraw")] == \
        ["pbmraw", "pgmraw", "ppmraw", "pkmraw"]
    assert bmpcmp_jobgen.bmpcmp_device("tiffgray") == "pgmraw"
    assert bmpcmp_jobgen.bmpcmp_device("pngmono") == "pbmraw"
    assert bmpcmp_jobgen.bmpcmp_device("tiffg4") == "pbmraw"
    for colour in ("pam", "psdcmyk", "cups", "bitrgb", "tiff24nc"):
        assert bmpcmp_jobgen.bmpcmp_device(colour) == "ppmraw"
    assert [bmpcmp_jobgen.bmpcmp_mupdf_format(d)
            for d in ("ppmraw", "pgmraw", "pbmraw", "pkmraw", "pam")] == \
        ["ppm", "pgm", "pbm", "ppm", "ppm"]


def test_bmpcmp_jobs_parse_ids_and_skip_what_cannot_be_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_tree(tmp_path / "tests", ["a/one.ps", "a/two.pdf", "x.pdf.pdf"])
    tests = [
        ("a__one.ps.ppmraw.300.1", "gs"),
        ("a__one.ps.pdf.ppmraw.72.0", "pdfwrite"),
        ("a__one.ps.ps.pkmraw.300.0", "gs ps2write"),    # a .tab product column
        ("a__two.pdf.pgmraw.72.0", "mupdf"),
        ("x.pdf.pdf.ppmraw.72.0", "gs"),                # file x.pdf.pdf, not x.pdf + pdf.*
        ("a__one.ps.ppmraw.300.1", "gs"),               # repeated
        ("a__gone.ps.ppmraw.72.0", "gs"),               # file removed since
        ("a__one.ps", "gs"),                            # no config
        ("a__one.ps.ppmraw.72.0", "svg"),               # unknown product
        ("a__one.ps.ppmraw.72.0", "pcl"),               # no PCL file: not pcl's test
        ("a__one.ps.ppmraw.72.0", "pdfwrite"),          # not a pdfwrite config
    ]
    with caplog.at_level(logging.WARNING, logger="cluster.build"):
        jobs = bmpcmp_jobgen.bmpcmp_jobs(CFG, tests, root)
    assert [j.name for j in jobs] == ["a__one.ps.ppmraw.300.1", "a__one.ps.pdf.ppmraw.72.0",
                                      "a__one.ps.ps.pkmraw.300.0", "a__two.pdf.pgmraw.72.0",
                                      "x.pdf.pdf.ppmraw.72.0"]
    text = caplog.text
    for needle in ("listed twice", "a/gone.ps is no longer in the corpus",
                   "skipping a__one.ps: not <file id>.<config>", "unknown product 'svg'",
                   "a/one.ps is no longer in the corpus",
                   "a__one.ps.ppmraw.72.0: not <file id>.<config> of product pdfwrite"):
        assert needle in text
    by = {j.name: j for j in jobs}
    for job in jobs:
        assert Job.parse(job.line) == job and job.logfile == f"__temp__/{job.name}.log"
        cmd = job.command
        assert "__baseline__/" in cmd and "__bin__/" in cmd
        assert (f"__python__ -m cluster.bmpcmp __temp__/{job.name}.base.pnm "
                f"__temp__/{job.name}.cand.pnm __temp__/bmpcmp/{job.name} 100") in cmd
        assert f"| md5sum >> __temp__/{job.name}.md5" in cmd
        assert cmd.startswith(f"touch __temp__/{job.name}.md5 ; ")
        # The renderings (and intermediates) are removed at the end.
        last = cmd.rsplit(" ; ", 1)[1]
        assert last.startswith(f"rm -f __temp__/{job.name}.base.pnm __temp__/{job.name}.cand")
    raster = by["a__one.ps.ppmraw.300.1"].command
    assert "echo gs >> " in raster and "-dMaxBitmap=10000 -sDEVICE=ppmraw -r300" in raster
    assert "---" not in raster
    two = by["a__one.ps.pdf.ppmraw.72.0"].command
    assert "echo 'gs pdfwrite' >> " in two
    # Stage 1 with each binary, the divider, then stage 2 with each binary.
    order = [two.index(s) for s in (
        "__baseline__/gs -sOutputFile=__temp__/a__one.ps.pdf.ppmraw.72.0.base.pdf",
        "__bin__/gs -sOutputFile=__temp__/a__one.ps.pdf.ppmraw.72.0.cand.pdf",
        "echo --- >>",
        "__baseline__/gs -sOutputFile=__temp__/a__one.ps.pdf.ppmraw.72.0.base.pnm",
        "__bin__/gs -sOutputFile=__temp__/a__one.ps.pdf.ppmraw.72.0.cand.pnm")]
    assert order == sorted(order)
    assert "-sDEVICE=pkmraw" in by["a__one.ps.ps.pkmraw.300.0"].command
    mu = by["a__two.pdf.pgmraw.72.0"].command
    assert "echo mupdf >> " in mu and "__baseline__/mutool draw -q -r72 -F pgm -o - " in mu
    assert "-sDEVICE" not in mu


def test_bmpcmp_jobs_are_capped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_tree(tmp_path / "tests", ["f.ps"])
    tests = [(f"f.ps.ppmraw.{r}.0", "gs") for r in range(1, 13)]
    with caplog.at_level(logging.WARNING, logger="cluster.build"):
        jobs = bmpcmp_jobgen.bmpcmp_jobs(CFG, tests, root, max_jobs=10)
    assert len(jobs) == 10 and "2 more test(s) left out" in caplog.text
    assert bmpcmp_jobgen.BMPCMP_MAX_JOBS == 1000


def test_read_bmpcmp_list(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "bmpcmp.lst"
    path.write_text("# differences\n\na.ps.ppmraw.72.0 gs\nb.ps.pdf.ppmraw.72.0 gs  pdfwrite\n"
                    "lonely\n")
    with caplog.at_level(logging.WARNING, logger="cluster.build"):
        assert bmpcmp_jobgen.read_bmpcmp_list(path) == [("a.ps.ppmraw.72.0", "gs"),
                                                 ("b.ps.pdf.ppmraw.72.0", "gs pdfwrite")]
    assert "line 5" in caplog.text


def run_build_py(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "build.py"), *argv], capture_output=True,
                          text=True, cwd=REPO, check=False)


def test_build_py_bmpcmp_from_file(tmp_path: Path) -> None:
    """build.py --home H bmpcmp --from FILE prints the jobs; other forms are unchanged."""
    home = tmp_path / "home"
    make_tree(home / "tests", ["d/f.ps", "d/g.pdf"])
    listing = tmp_path / "bmpcmp.lst"
    listing.write_text("d__f.ps.ppmraw.72.0 gs\nd__g.pdf.ppmraw.72.0 mupdf\n"
                       "d__h.ps.pbmraw.72.0 gs\n")
    done = run_build_py("--home", str(home), "bmpcmp", "--from", str(listing))
    assert done.returncode == 0, done.stderr
    assert [Job.parse(line).name for line in done.stdout.splitlines()] == \
        ["d__f.ps.ppmraw.72.0", "d__g.pdf.ppmraw.72.0"]
    assert "d__h.ps.pbmraw.72.0" in done.stderr  # skipped with a warning naming it
    normal = run_build_py("--home", str(home), "--seed", "1", "gs", "filter=d__f.ps", "lowres")
    names = [Job.parse(line).name for line in normal.stdout.splitlines()]
    assert normal.returncode == 0 and names
    assert all(n.startswith("d__f.ps.") and ".72." in n for n in names)
    assert all("__baseline__" not in line for line in normal.stdout.splitlines())
    for argv, code, needle in (
            (["bmpcmp"], 2, "--from FILE"),
            (["bmpcmp", "gs", "--from", str(listing)], 2, "unexpected word"),
            (["bmpcmp", "--from", str(tmp_path / "none")], 1, "cannot read the bmpcmp list"),
            (["bogus"], 2, "'bogus'")):
        bad = run_build_py("--home", str(home), *argv)
        assert bad.returncode == code and needle in bad.stderr and bad.stdout == ""


def test_cli_bmpcmp_form_and_from_without_it(tree: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """cluster.cli.build holds the bmpcmp form too; --from without it is a usage error."""
    listing = tmp_path / "bmpcmp.lst"
    listing.write_text("a__one.ps.ppmraw.72.0 gs\nb__three.eps.ppmraw.72.0 gs\n")
    assert build_cli.main(["--tests", str(tree), "bmpcmp", "--from", str(listing)]) == 0
    out = capsys.readouterr().out
    assert [Job.parse(line).name for line in out.splitlines()] == \
        ["a__one.ps.ppmraw.72.0", "b__three.eps.ppmraw.72.0"]
    assert build_cli.main(["--tests", str(tree), "gs", "--from", str(listing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--from is for the bmpcmp form only" in captured.err


def test_bmpcmp_job_uses_the_tool_image_limit_and_the_shared_folder(tree: Path) -> None:
    """The job line passes cluster.bmpcmp's MAX_IMAGES and writes under defaults.BMPCMP_DIR."""
    from cluster import bmpcmp, defaults

    (job,) = bmpcmp_jobgen.bmpcmp_jobs(CFG, [("a__one.ps.ppmraw.72.0", "gs")], tree)
    assert (f"__temp__/{defaults.BMPCMP_DIR}/a__one.ps.ppmraw.72.0 {bmpcmp.MAX_IMAGES}"
            in job.command)
