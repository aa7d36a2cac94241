"""Commit runs without git: the path -> products map, the config grammar, the hook template."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cluster import configfile, datatypes
from cluster.config import Config
from cluster.datatypes import PathRule
from cluster.errors import ConfigError
from cluster.triggers.git import hook as git_hook
from cluster.triggers.git.decide import products_for
from cluster.triggers.git.errors import CommitError

ALL = ("gs", "pdfwrite", "ps2write")


def rules(*entries: str) -> tuple[PathRule, ...]:
    return datatypes.parse_path_products(entries)


def test_the_default_map_skips_docs_and_tests_the_rest() -> None:
    default = datatypes.parse_path_products(Config().path_products)
    assert products_for("ghostpdl", ["doc/Use.htm", "examples/tiger.eps"], default) == ()
    assert products_for("ghostpdl", ["base/gxfill.c"], default) == ALL
    assert products_for("ghostpdl", ["doc/Use.htm", "psi/zfile.c"], default) == ALL
    assert products_for("ghostpdl", [], default) == ()  # an empty commit needs no test


def test_the_default_map_sends_pcl_and_xps_sources_to_their_languages() -> None:
    """ghostpdl's pcl/ and xps/ test gpcl6 and gxps, as the Artifex hook's table did (pcl,
    pxl -> pcl; xps -> xps; pl -> both), not gs; gxps rasterises xpswrite's XPS, so a
    change to it tests xpswrite too; their examples and tools need no test."""
    default = datatypes.parse_path_products(Config().path_products)
    assert products_for("ghostpdl", ["pcl/pcl/pcjob.c"], default) == ("pcl",)
    assert products_for("ghostpdl", ["pcl/pxl/pxink.c"], default) == ("pcl",)
    assert products_for("ghostpdl", ["xps/xpsfont.c"], default) == ("xpswrite", "xps")
    assert products_for("ghostpdl", ["pcl/pl/plmain.c"], default) == ("xpswrite", "pcl", "xps")
    assert products_for("ghostpdl", ["pcl/examples/owl.pcl", "pcl/tools/x.py"], default) == ()
    assert products_for("ghostpdl", ["pcl/pcl/pcjob.c", "base/gxfill.c"], default) \
        == (*ALL, "pcl")


def test_the_longest_prefix_wins() -> None:
    r = rules("doc/=", "doc/api/=gs", "=pdfwrite", "base/=gs,ps2write")
    assert products_for("ghostpdl", ["doc/api/x.h"], r) == ("gs",)
    assert products_for("ghostpdl", ["doc/x.htm"], r) == ()
    assert products_for("ghostpdl", ["base/x.c"], r) == ("gs", "ps2write")
    assert products_for("ghostpdl", ["Makefile"], r) == ("pdfwrite",)  # the fallback


def test_the_products_are_the_union_over_the_paths_in_canonical_order() -> None:
    r = rules("a/=ps2write", "b/=gs", "c/=")
    assert products_for("ghostpdl", ["a/1", "b/2", "c/3"], r) == ("gs", "ps2write")


def test_without_a_fallback_an_unmatched_path_needs_no_test() -> None:
    r = rules("base/=gs")
    assert products_for("ghostpdl", ["other/x.c"], r) == ()
    assert products_for("ghostpdl", ["other/x.c", "base/y.c"], r) == ("gs",)


def test_a_prefix_is_plain_text_not_a_directory() -> None:
    r = rules("doc=", "=gs")
    assert products_for("ghostpdl", ["docs/x", "doc.txt"], r) == ()


def test_tree_qualified_entries_apply_to_their_tree_and_win_at_equal_prefix() -> None:
    r = rules("=gs,pdfwrite,ps2write", "ghostpdl:doc/=", "pcl/=gs", "ghostpdl:pcl/=pdfwrite",
              "other:=ps2write", "ghostpdl:base/=gs")
    assert products_for("ghostpdl", ["doc/x"], r) == ()
    assert products_for("fork", ["doc/x"], r) == ALL  # not qualified for fork
    assert products_for("ghostpdl", ["pcl/x"], r) == ("pdfwrite",)
    assert products_for("fork", ["pcl/x"], r) == ("gs",)
    assert products_for("other", ["anything"], r) == ("ps2write",)
    # A longer unqualified prefix still beats a shorter qualified one.
    r2 = rules("ghostpdl:base/=gs", "base/fonts/=")
    assert products_for("ghostpdl", ["base/fonts/f.pfb"], r2) == ()


def test_a_leading_colon_writes_an_unqualified_prefix_that_holds_a_colon() -> None:
    assert rules(":odd:name=gs") == (PathRule(None, "odd:name", ("gs",)),)
    assert rules("ghostpdl:odd:name=gs") == (PathRule("ghostpdl", "odd:name", ("gs",)),)


@pytest.mark.parametrize("tree", ["mupdf", "shell"])
def test_a_tree_named_like_an_alone_product_tests_only_that_product(tree: str) -> None:
    default = datatypes.parse_path_products(Config().path_products)
    assert products_for(tree, ["source/fitz/draw.c"], default) == (tree,)
    assert products_for(tree, ["doc/manual.md"], default) == ()  # still skipped


@pytest.mark.parametrize(("entry", "message"), [
    ("doc", "'[<tree>:]<path prefix>=<products>'"),
    ("doc/=mupdf", "'mupdf' follows from the tree's name and is tested alone"),
    ("doc/=shell", "tested alone"),
    ("doc/=gs,gs", "each product once"),
    ("doc/=gs,", "unknown product ''"),
    ("doc/=svg", "unknown product 'svg'"),
    ("/abs/=gs", "no leading '/'"),
    ("../x:doc/=gs", "a tree qualifier that is a plain name"),
])
def test_bad_path_products_entries_name_the_entry_and_the_form(entry: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        datatypes.parse_path_products([entry])
    text = str(exc.value)
    assert "'path_products'" in text and repr(entry) in text and message in text


def test_a_prefix_given_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match="each \\[tree:\\]prefix once"):
        datatypes.parse_path_products(["doc/=", "doc/=gs"])
    assert len(datatypes.parse_path_products(["doc/=", "ghostpdl:doc/=gs"])) == 2


def test_good_repositories_parse_in_order() -> None:
    entries = ["ghostpdl=https://git.ghostscript.com/ghostpdl.git",
               "mupdf=git@github.com:ArtifexSoftware/mupdf.git", "fork=/srv/git/fork.git",
               "local=file:///srv/git/x.git", "g2=ssh://host/path=with=equals"]
    assert datatypes.parse_repositories(entries) == {
        "ghostpdl": "https://git.ghostscript.com/ghostpdl.git",
        "mupdf": "git@github.com:ArtifexSoftware/mupdf.git", "fork": "/srv/git/fork.git",
        "local": "file:///srv/git/x.git", "g2": "ssh://host/path=with=equals"}


@pytest.mark.parametrize(("entry", "message"), [
    ("ghostpdl", "'<tree>=<url>'"),
    ("ghostpdl=", "'<tree>=<url>'"),
    ("=/srv/x.git", "'<tree>=<url>'"),
    ("../up=/srv/x.git", "'<tree>=<url>'"),
    ("queue=/srv/x.git", "a file or directory of the master home"),
    ("runs=/srv/x.git", "a file or directory of the master home"),
    ("ghostpdl=relative/dir", "an absolute local path"),
    ("ghostpdl=-uoops", "not starting with '-'"),
])
def test_bad_repositories_name_the_entry_and_the_form(entry: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        datatypes.parse_repositories([entry])
    text = str(exc.value)
    assert "'repositories'" in text and repr(entry) in text and message in text


def test_a_tree_given_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match="each tree once"):
        datatypes.parse_repositories(["ghostpdl=/a.git", "ghostpdl=/b.git"])


@pytest.mark.parametrize("branch", ["-x", "a..b", "x.lock", "a//b", "a/", ".hidden", "a b"])
def test_a_bad_branch_is_refused(branch: str) -> None:
    with pytest.raises(ConfigError, match="'git_branch'"):
        datatypes.check_branch(branch)


@pytest.mark.parametrize("branch", ["master", "main", "release/9.56", "ghostpdl-9.20"])
def test_plain_branches_are_accepted(branch: str) -> None:
    assert datatypes.check_branch(branch) == branch


@pytest.mark.parametrize(("text", "message"), [
    ("repositories = ghostpdl", "'<tree>=<url>'"),
    ("repositories = ghostpdl=/a.git mupdf=rel", "an absolute local path"),
    ("path_products = doc/=mupdf", "tested alone"),
    ("git_branch = a..b", "a branch name"),
])
def test_the_config_is_checked_at_load(tmp_path: Path, text: str, message: str) -> None:
    conf = tmp_path / "c.conf"
    conf.write_text(f"[master]\n{text}\n")
    with pytest.raises(ConfigError, match=message):
        configfile.load(conf)


def test_a_good_config_loads(tmp_path: Path) -> None:
    conf = tmp_path / "c.conf"
    conf.write_text("[master]\nrepositories = ghostpdl=/srv/ghostpdl.git "
                    "mupdf=https://example.org/mupdf.git\ngit_branch = main\n"
                    "path_products = doc/= mupdf:docs/= =gs\n")
    cfg = configfile.load(conf)
    assert cfg.repositories == ("ghostpdl=/srv/ghostpdl.git", "mupdf=https://example.org/mupdf.git")
    assert cfg.git_branch == "main" and cfg.path_products == ("doc/=", "mupdf:docs/=", "=gs")


def test_the_hook_template_is_rendered_with_quoted_absolute_settings(tmp_path: Path) -> None:
    template = git_hook.HOOK_TEMPLATE.read_text()
    assert template.startswith("#!/bin/sh\n") and git_hook.HOOK_MARKER in template
    text = git_hook.render_hook(template, {"CLUSTER_PYTHON": "/opt/py thon/bin/python3",
                                          "CLUSTER_PROJECT": "/src/it's here",
                                          "CLUSTER_CONFIG": "/etc/c.conf",
                                          "CLUSTER_TREE": "ghostpdl",
                                          "CLUSTER_HOOK_KIND": "post-receive"})
    assert "CLUSTER_PYTHON='/opt/py thon/bin/python3'\n" in text
    assert "CLUSTER_PROJECT='/src/it'\"'\"'s here'\n" in text
    assert "CLUSTER_TREE=ghostpdl\n" in text
    hook = tmp_path / "post-receive"
    hook.write_text(text)
    subprocess.run(["sh", "-n", str(hook)], check=True)
    with pytest.raises(CommitError, match="line break"):
        git_hook.render_hook(template, {"CLUSTER_CONFIG": "/a\n/b"})
