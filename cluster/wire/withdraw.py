"""A reply's ``withdraw`` lines, and the ``features`` header by which a node asks for them.

When a job a node holds gets its result from another node (a tail copy won, or the node's
own copy lost: docs/results.md, "Withdrawn copies"), the master's next reply to that node,
whatever its verb, ends with::

    withdraw <test> [<test>...]      at most WITHDRAW_PER_LINE tests a line, lines repeat

after the verb's own lines (after a JOBS reply's counted job lines), before the ``sig``
line, so the signature covers them.  The node stops those jobs at once (a running one's
process tree killed, a queued one dropped) and sends no result for them.

Older nodes take any line after a reply's verb (or after JOBS' counted lines) for a
malformed reply, so the master sends these lines only to a node process whose requests
carry ``features withdraw``: the ``features`` header names, as words, the optional reply
lines a node understands.  Older masters ignore the header (unknown headers are), so a new
node works with them as before.

Pure code: :mod:`cluster.wire.protocol` formats and parses the lines with these.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cluster.errors import ProtocolError
from cluster.records import TEST_ID

#: The feature word of ``withdraw`` lines (``features withdraw``).
WITHDRAW = "withdraw"
#: A feature word; a node's ``features`` header holds at most :data:`MAX_FEATURES`.
FEATURE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
MAX_FEATURES = 16
#: The most tests one ``withdraw`` line names (a test id is at most 401 characters).
WITHDRAW_PER_LINE = 64
_PREFIX = WITHDRAW + " "


def parse_features(value: str) -> tuple[str, ...]:
    """The ``features`` header's words (ValueError for one that is not a feature word, or
    too many); words this side does not know are kept, and mean nothing to it."""
    words = value.split()
    if len(words) > MAX_FEATURES:
        raise ValueError(f"takes at most {MAX_FEATURES} feature words, got {len(words)}")
    for word in words:
        if not FEATURE.fullmatch(word):
            raise ValueError(f"takes feature words of 1-32 [a-z0-9_-] starting with a "
                             f"letter, got {word[:40]!r}")
    return tuple(words)


def format_withdraw(tests: Sequence[str]) -> str:
    """The ``withdraw`` lines of ``tests``, newline-ended ("" for none)."""
    return "".join(_PREFIX + " ".join(tests[at:at + WITHDRAW_PER_LINE]) + "\n"
                   for at in range(0, len(tests), WITHDRAW_PER_LINE))


def parse_withdraw(lines: Sequence[str], first: int) -> tuple[str, ...]:
    """The tests of a reply's ``withdraw`` lines ``lines`` (the reply's lines after its
    verb's own; ``first``: the number of the first, for errors).  ProtocolError for a line
    that is not ``withdraw <test>...``."""
    tests: list[str] = []
    for number, line in enumerate(lines, first):
        words = line.split(" ")
        if (words[0] != WITHDRAW or len(words) < 2 or len(words) > WITHDRAW_PER_LINE + 1
                or not all(TEST_ID.fullmatch(word) for word in words[1:])):
            raise ProtocolError(f"a line after the reply's own must be 'withdraw <test>...' "
                                f"(at most {WITHDRAW_PER_LINE} test ids)", line[:200], number)
        tests.extend(words[1:])
    return tuple(tests)
