"""Commit runs (priority 1): new git commits become queue lines, and a commit's tree is exported.

The master keeps a bare clone of each configured repository (``repositories``, entries
``tree=url``).  Two paths find new commits of the branch ``git_branch``:

* :func:`cluster.triggers.git.poll.poll`, the priority-1 discoverer
  (``cluster.triggers.discovery.DISCOVERERS[1]``), run in phase 1 of every clustermaster1
  invocation: fetch, list the commits since the tip it processed last, oldest first;
* the hook ``etc/git-hook`` (post-receive or post-commit, installed with ``install-hook``),
  which calls :func:`cluster.triggers.git.poll.enqueue_commits` with the commits just
  pushed or made.

Either way each commit is decided once, under a lock, against an append-only ledger: a
commit whose message holds ``CLUSTER_UNTESTED`` is skipped, so is one whose changed paths
need no product (``path_products``, see :func:`cluster.triggers.git.decide.products_for`);
any other is queued as::

    git <40-hex sha> <products> tree=<tree>

Whichever path sees a commit first queues it; it is never queued again, not even after its
run has finished and left the queue (ARTIFEX.md §7; the Perl polled svn and queued only the
newest revision, see docs/deviations.md "Commit runs").

Files in the master home, per tree (:mod:`.ledger`)::

    repos/<tree>.git          bare clone of the url (``git clone --bare``, later ``git fetch``)
    repos/<tree>.seen         the branch tip the last poll processed (40 hex and a newline)
    repos/<tree>.queued       ledger: ``<sha> <decision>`` per decided commit, append-only
    repos/<tree>.lock         flock held while the ledger and the queue are checked and appended
    repos/<tree>.fetch.lock   flock held while the bare clone is cloned or fetched, and by a poll

The master builds a commit run from :func:`.export.export_commit` (exactly the tree of the
commit) and heads its report with :func:`.info.commit_info`.

Every git command is an argv list run without a shell, with a timeout, with the
repository-selecting ``GIT_*`` variables of a calling hook removed (:mod:`.gitcmd`); shas and
tree names are validated before they reach git or a path.

The modules, bottom up: :mod:`.gitcmd` (running git), :mod:`.errors` (CommitError and the
checks of what callers pass), :mod:`.ledger` (the files of a tree), :mod:`.clone` (the bare
clone), :mod:`.info` (reading a commit), :mod:`.decide` (which commits are tested, with which
products), :mod:`.poll` (deciding and queueing), :mod:`.export` (a commit's tree),
:mod:`.hook` (the git hook).  The command line is :mod:`cluster.cli.commits`.
"""
