"""A run's results as journal lines by job index (cluster.master.model.results)."""

from __future__ import annotations

from cluster.master.files.journal import line_prefix
from cluster.master.model.joblist import MemoryJobList
from cluster.master.model.results import Results
from cluster.records import Job

MD5 = "0123456789abcdef0123456789abcdef"


def results(n: int) -> Results:
    return Results(MemoryJobList(Job(f"t{i}", f"t{i}.log", "true") for i in range(n)))


def text(i: int, product: str = "gs") -> str:
    return f"t{i} 0 0.10 0.00 0.00 {MD5} {product}"


def test_add_keeps_each_line_with_its_prefix_in_any_order_and_any_script() -> None:
    got = results(8)
    prefix = line_prefix("node-a")
    data = got.add([2, 3, 4], [text(2), text(3), text(4)], prefix)  # consecutive
    assert data == "".join(f"{prefix}{text(i)}\n" for i in (2, 3, 4)).encode()
    got.add([7, 0], [text(7, "gs é"), text(0)], line_prefix("nœud"))  # neither
    got.add([5], [text(5)])  # whole journal lines, no prefix
    assert [got.line(i) for i in (2, 3, 4)] == [prefix + text(i) for i in (2, 3, 4)]
    assert got.line(7) == line_prefix("nœud") + text(7, "gs é")
    assert got.line(0) == line_prefix("nœud") + text(0) and got.line(5) == text(5)
    assert got.count == 6 and not got.has(1) and not got.has(6)
    assert got["t7"].product == "gs é" and got["t7"].machine == "nœud"


def test_add_of_nothing_records_nothing() -> None:
    got = results(2)
    assert got.add([], [], line_prefix("n")) == b"" and got.count == 0 and not got.text
