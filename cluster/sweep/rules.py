"""What a sweep file says about judging and gathering results: the ``[validate]`` and
``[collect]`` tables as plain values, shared by the sweep file's parser (:mod:`.spec`), the
validation (:mod:`.checks`) and the collection (:mod:`.collect`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ValidateRules:
    """A task's result is valid when every rule holds (all optional in the sweep file).

    ``exit_status``: the command's allowed exit statuses; ``nonempty``: result names that
    must not be empty; ``match``: (result name, regular expression) pairs, the result must
    contain a match; ``script``: a path relative to the sweep folder, run on the master with
    the task's result folder as its argument, exit 0 meaning valid ('' for none).
    """

    exit_status: tuple[int, ...] = (0,)
    nonempty: tuple[str, ...] = ()
    match: tuple[tuple[str, str], ...] = ()
    script: str = ""


@dataclass(frozen=True)
class CollectRule:
    """One collected file: ``target`` (a relative path, which may hold ``{column}``
    placeholders: one file per value of those columns, "blockwise") made on the master by
    concatenating the result ``source`` of every valid task, in task order."""

    target: str
    source: str
