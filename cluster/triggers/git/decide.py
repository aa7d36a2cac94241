"""Which commits are tested, and with which products: pure rules, no git, no files.

A commit whose message holds :data:`UNTESTED_MARK` is never tested (the Artifex
convention); otherwise its changed paths pick its products through the ``path_products``
rules (:func:`products_for`), and a commit whose paths need no product is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cluster.datatypes import ALONE, PRODUCTS, PathRule
from cluster.runspec import RunSpec
from cluster.triggers.git.info import CommitInfo

#: A commit whose message contains this is never tested (the Artifex convention).
UNTESTED_MARK = "CLUSTER_UNTESTED"
#: The ledger's word for a commit skipped because of :data:`UNTESTED_MARK`.
UNTESTED = "untested"
#: The ledger's word for a commit skipped because its paths need no product.
NO_PRODUCTS = "no-products"


def products_for(tree: str, paths: Iterable[str], rules: Sequence[PathRule]) -> tuple[str, ...]:
    """The products a commit of ``tree`` changing ``paths`` must test (canonical order).

    For each path the applicable rule (unqualified, or qualified with ``tree``) with the
    longest prefix the path starts with decides; at equal prefix the tree-qualified one
    wins.  A path no rule matches needs no test.  The result is the union over the paths,
    empty when no path needs a test; for a tree named like an alone product (mupdf, shell)
    a non-empty result is just that product.
    """
    applicable = [r for r in rules if r.tree is None or r.tree == tree]
    wanted: set[str] = set()
    for path in paths:
        best: PathRule | None = None
        for rule in applicable:
            if path.startswith(rule.prefix) and (
                    best is None or (len(rule.prefix), rule.tree is not None)
                    > (len(best.prefix), best.tree is not None)):
                best = rule
        if best is not None:
            wanted.update(best.products)
    if wanted and tree in ALONE:
        return (tree,)
    return tuple(p for p in PRODUCTS if p in wanted)


def decide(tree: str, info: CommitInfo, rules: Sequence[PathRule]) -> RunSpec | str:
    """The run of a commit, or why it is skipped (:data:`UNTESTED` or :data:`NO_PRODUCTS`)."""
    if UNTESTED_MARK in info.message:
        return UNTESTED
    products = products_for(tree, info.changed_paths, rules)
    if not products:
        return NO_PRODUCTS
    return RunSpec(kind="git", ref=info.sha, products=products, options=(f"tree={tree}",))
