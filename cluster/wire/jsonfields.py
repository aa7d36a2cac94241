"""Checked reading of the JSON files the cluster's programs exchange (the resource file,
the provisioner's status file): one object's fields, each taken with the type and range it
must have, and an error naming the file, the field in full (``priorities.1.jobs_left``)
and what was expected.

The error class is the caller's (each file format has its own ``ValueError`` subclass), so
a reader of one format catches only that format's errors.
"""

from __future__ import annotations

import math
from typing import Any

#: A field the object does not have (shown as "missing").
MISSING = object()


class JsonFields:
    """One JSON object ``values`` of the file ``source``, with its dotted name ``prefix``
    (``master.``; "" at the top) so that an error names the field in full; errors are
    raised as ``error_class``."""

    def __init__(self, values: dict[str, Any], source: str, prefix: str,
                 error_class: type[ValueError]) -> None:
        self.values = values
        self.source = source
        self.prefix = prefix
        self.error_class = error_class

    @classmethod
    def top(cls, document: Any, source: str, error_class: type[ValueError]) -> JsonFields:
        """The file's top object; an error unless ``document`` is a JSON object."""
        if not isinstance(document, dict):
            raise error_class(f"{source}: the file is {type(document).__name__}: expected a "
                              "JSON object")
        return cls(document, source, "", error_class)

    @classmethod
    def of(cls, value: Any, source: str, prefix: str,
           error_class: type[ValueError]) -> JsonFields:
        """``value`` (an element of a list, named ``prefix``) as an object's fields."""
        if not isinstance(value, dict):
            raise error_class(f"{source}: {prefix.rstrip('.')} {value!r}: expected a JSON "
                              "object")
        return cls(value, source, prefix, error_class)

    def error(self, key: str, value: Any, expected: str) -> ValueError:
        shown = "missing" if value is MISSING else repr(value)
        return self.error_class(f"{self.source}: {self.prefix}{key} {shown}: expected "
                                f"{expected}")

    def get(self, key: str) -> Any:
        """The field's raw value, or :data:`MISSING`."""
        return self.values.get(key, MISSING)

    def part(self, key: str) -> JsonFields:
        """The object in field ``key``."""
        value = self.get(key)
        if not isinstance(value, dict):
            raise self.error(key, value, "a JSON object")
        return JsonFields(value, self.source, f"{self.prefix}{key}.", self.error_class)

    def integer(self, key: str, low: int, high: int | None = None) -> int:
        """An integer from ``low`` (to ``high``)."""
        value = self.get(key)
        # JSON true is a Python bool, an int subclass: not a count.
        if isinstance(value, bool) or not isinstance(value, int) or value < low \
                or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"from {low} to {high}"
            raise self.error(key, value, f"an integer {bound}")
        return value

    def count_or_null(self, key: str) -> int | None:
        """An integer >= 0, or None for JSON null."""
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(key, value, "an integer >= 0, or null")
        return value

    def number(self, key: str, low: float = -math.inf, *, positive: bool = False) -> float:
        """A finite number >= ``low`` (> ``low`` when ``positive``)."""
        value = self.get(key)
        ok = not isinstance(value, bool) and isinstance(value, int | float) \
            and math.isfinite(value) and (value > low if positive else value >= low)
        if not ok:
            bound = "" if low == -math.inf else f" {'>' if positive else '>='} {low:g}"
            raise self.error(key, value, f"a finite number{bound}")
        return float(value)

    def text(self, key: str, *, empty: bool = True) -> str:
        """A string (not empty unless ``empty``)."""
        value = self.get(key)
        if not isinstance(value, str) or (not empty and not value):
            raise self.error(key, value, "a string" if empty else "a non-empty string")
        return value
