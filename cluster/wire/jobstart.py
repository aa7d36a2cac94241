"""job.start: what a running run is, written by the master and read by every node (seed 001).

One ``key value`` per line; the first line is ``id <jobid>``.  The file stays on the master for
the whole run (nodes do not delete it) and is removed when the run is over.

Keys: ``id``, ``priority``, ``queue`` (the queue line being run), ``kind``, ``ref``,
``products`` (comma list), ``tree`` (ghostpdl or mupdf), ``source`` (the tree to build,
relative to the master home), ``build`` (the build command of a tree of no known kind),
the optional ``build_ghostpdl`` and ``build_mupdf`` (the build commands of a ghostpdl and
of a MuPDF tree, with ``__targets__`` already replaced by the make targets of the run's
products; absent: ``build`` builds every tree; the node picks by what the tree holds:
:mod:`cluster.node.buildcmd`), ``tests`` (the corpus,
relative to the master home), ``options`` (space list, may be empty), and the optional
``baseline``: the master's clean tree (relative to the master home, e.g. ``ghostpdl``) that
a bmpcmp run renders as its reference.  Nodes fetch and build it besides ``source``, cache
the build between runs, and substitute ``__baseline__`` with its ``bin``.  Empty or absent:
no baseline, and the line is not written, so job.start files of other runs are unchanged.

``secret`` (issue 11): 64 hex digits, fresh for each run, the key of the run's signed node
messages (:mod:`cluster.wire.signing`).  Only job.start itself carries it (written mode
0600, ``format(with_secret=True)``); every other copy of the run's description (the end
record, ``run.info`` in the archive) is written by :meth:`JobStart.format` without it.
Optional when parsing, so a job.start of an older master still parses; a node refuses to
join a run without one.
"""

from __future__ import annotations

from dataclasses import dataclass

KEYS = ("id", "priority", "queue", "kind", "ref", "products", "tree", "source", "build",
        "build_ghostpdl", "build_mupdf", "tests", "options", "baseline", "secret")
#: Keys a job.start may lack.
OPTIONAL = ("options", "build_ghostpdl", "build_mupdf", "baseline", "secret")
#: Optional keys whose line is left out when empty (job.start files without them unchanged).
_OMITTED_WHEN_EMPTY = ("build_ghostpdl", "build_mupdf", "baseline", "secret")


@dataclass(frozen=True)
class JobStart:
    id: str
    priority: int
    queue: str
    kind: str
    ref: str
    products: tuple[str, ...]
    tree: str
    source: str
    build: str
    tests: str
    options: tuple[str, ...] = ()
    baseline: str = ""
    secret: str = ""
    build_ghostpdl: str = ""
    build_mupdf: str = ""

    def format(self, *, with_secret: bool = False) -> str:
        """The file's text; the ``secret`` line only ``with_secret`` (job.start itself)."""
        values = {
            "id": self.id, "priority": str(self.priority), "queue": self.queue,
            "kind": self.kind, "ref": self.ref, "products": ",".join(self.products),
            "tree": self.tree, "source": self.source, "build": self.build,
            "build_ghostpdl": self.build_ghostpdl, "build_mupdf": self.build_mupdf,
            "tests": self.tests, "options": " ".join(self.options),
            "baseline": self.baseline,
            "secret": self.secret if with_secret else "",
        }
        return "".join(f"{k} {values[k]}".rstrip() + "\n" for k in KEYS
                       if k not in _OMITTED_WHEN_EMPTY or values[k])

    @classmethod
    def parse(cls, text: str) -> JobStart:
        """Parse job.start text; ValueError names a missing or bad key."""
        values: dict[str, str] = {}
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key in KEYS:
                values[key] = value
        missing = [k for k in KEYS if k not in values and k not in OPTIONAL]
        if missing:
            raise ValueError("job.start lacks " + ", ".join(missing))
        try:
            priority = int(values["priority"])
        except ValueError:
            raise ValueError(f"job.start priority {values['priority']!r} is not an integer"
                             ) from None
        return cls(id=values["id"], priority=priority, queue=values["queue"],
                   kind=values["kind"], ref=values["ref"],
                   products=tuple(p for p in values["products"].split(",") if p),
                   tree=values["tree"], source=values["source"], build=values["build"],
                   tests=values["tests"], options=tuple(values.get("options", "").split()),
                   baseline=values.get("baseline", "").strip(),
                   secret=values.get("secret", "").strip(),
                   build_ghostpdl=values.get("build_ghostpdl", "").strip(),
                   build_mupdf=values.get("build_mupdf", "").strip())
