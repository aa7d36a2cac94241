"""The provisioner's decisions (cluster.provision.scaler) against a scripted engine.

Pure logic: the engine is a fake that keeps its jobs in a dict and places them as the test
says (at once, or never: a Slurm that keeps them pending), and time is a FakeClock.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import pytest

from cluster.provision.engine import EngineError, EngineJob
from cluster.provision.scaler import Demand, Provisioner, ScaleSettings, Step
from cluster.runtime.clock import FakeClock

COMMAND = ("clusterpull.py", "--ephemeral", "--config", "node.conf")
INTERVAL = 10.0
LINE = re.compile(r"wanted \d+ pending \d+ running \d+: \S.*")


class ScriptedEngine:
    """A batch system in a dict.  ``place``: a submitted job runs at once (True) or stays
    pending forever with ``reason`` (False).  Records every call."""

    label = "Slurm"
    job_id_shell = "$SLURM_JOB_ID"

    def __init__(self, place: bool = True, reason: str = "Resources") -> None:
        self.place = place
        self.reason = reason
        self.table: dict[str, EngineJob] = {}
        self.next_id = 1000
        self.submits: list[tuple[str, list[str], int]] = []
        self.cancels: list[str] = []
        self.fail_list: str = ""
        self.fail_submit: str = ""
        self.excludes: list[list[str]] = []

    def add(self, name: str, state: str, reason: str = "") -> str:
        self.next_id += 1
        job_id = str(self.next_id)
        self.table[job_id] = EngineJob(job_id, name, state, reason)
        return job_id

    def submit(self, name: str, argv: list[str], slots: int, *,
               exclude: Sequence[str] = ()) -> str:
        self.excludes.append(list(exclude))
        if self.fail_submit:
            raise EngineError(f"sbatch: {self.fail_submit}")
        self.submits.append((name, argv, slots))
        return self.add(name, "running" if self.place else "pending",
                        "" if self.place else self.reason)

    def cancel(self, job_id: str) -> None:
        self.cancels.append(job_id)
        self.table.pop(job_id)

    def jobs(self, prefix: str) -> list[EngineJob]:
        if self.fail_list:
            raise EngineError(f"squeue: {self.fail_list}")
        # Like a real engine it lists by name; the foreign jobs a test adds are kept in
        # so that the provisioner's own filter is tested too.
        return list(self.table.values())

    def states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for job in self.table.values():
            if job.name.startswith("slurm-"):
                counts[job.state] = counts.get(job.state, 0) + 1
        return counts


def settings(max_nodes: int = 10, rate: float = 1000.0) -> ScaleSettings:
    return ScaleSettings(max_nodes=max_nodes, submit_rate=rate, prefix="slurm", slots=2)


def alive(wanted: int) -> Demand:
    return Demand(wanted, True, COMMAND)


def looks(provisioner: Provisioner, clock: FakeClock, wanted: list[int]) -> Iterator[Step]:
    """One look per number wanted, ``INTERVAL`` seconds apart; each step's line checked."""
    for count in wanted:
        step = provisioner.step(alive(count))
        assert LINE.fullmatch(step.line), step.line
        yield step
        clock.advance(INTERVAL)


def test_a_thousand_nodes_ramp_at_the_rate_and_never_beyond_max_nodes() -> None:
    clock = FakeClock()
    engine = ScriptedEngine()
    provisioner = Provisioner(engine, settings(max_nodes=1000, rate=30), clock)
    submit_times: list[float] = []
    for step in looks(provisioner, clock, [1000] * 6 * 40):  # 40 minutes of looks
        submit_times += [clock.monotonic()] * len(step.submitted)
        jobs = sum(engine.states().values())
        assert jobs <= 1000
        minute = int(clock.monotonic() // 60)
        # The ramp: 30 at once, 30 more each minute after, until 1,000.
        assert jobs == min(1000, 30 * (minute + 1)), (clock.monotonic(), jobs)
    assert len(engine.submits) == 1000 and engine.cancels == []
    for i, start in enumerate(submit_times):  # in any minute, at most 30 submits
        assert sum(1 for t in submit_times[i:] if t < start + 60) <= 30
    assert engine.submits[0] == ("slurm-node", list(COMMAND), 2)


def test_the_line_says_what_held_the_submits_back() -> None:
    clock = FakeClock()
    engine = ScriptedEngine()
    provisioner = Provisioner(engine, settings(max_nodes=1000, rate=30), clock)
    first = provisioner.step(alive(1000))
    assert first.line.startswith("wanted 1000 pending 0 running 0: submitted 30 (1000 wanted")
    assert "at most 30 submits a minute" in first.line
    clock.advance(INTERVAL)
    second = provisioner.step(alive(1000))
    assert second.submitted == ()
    assert second.line == ("wanted 1000 pending 0 running 30: submitted 0 (970 wanted beyond "
                           "pending + running, held back by at most 30 submits a minute, "
                           "the next in 50 s)")


def test_a_rate_below_one_a_minute_submits_one_per_its_period() -> None:
    clock = FakeClock()
    engine = ScriptedEngine()
    provisioner = Provisioner(engine, settings(rate=0.5), clock)  # one per two minutes
    steps = list(looks(provisioner, clock, [5] * 30))  # five minutes
    assert [i for i, s in enumerate(steps) if s.submitted] == [0, 12, 24]


@pytest.mark.parametrize("wobble", [[10, 9], [10, 11], [10, 8, 10, 9, 10]])
@pytest.mark.parametrize("place", [True, False])
def test_a_wobbling_count_never_flaps(wobble: list[int], place: bool) -> None:
    """A count that dips for one look at a time cancels nothing, so nothing is submitted
    again: the submits are the highest count, once; no cancel at all."""
    clock = FakeClock()
    engine = ScriptedEngine(place=place)
    provisioner = Provisioner(engine, settings(max_nodes=20), clock)
    list(looks(provisioner, clock, wobble * 30))
    assert engine.cancels == []
    assert len(engine.submits) == max(wobble)


def test_a_lasting_drop_cancels_the_excess_pending_jobs_after_two_looks_newest_first() -> None:
    clock = FakeClock()
    engine = ScriptedEngine(place=False)
    provisioner = Provisioner(engine, settings(), clock)
    first, *_ = looks(provisioner, clock, [10])
    ids = list(first.submitted)
    one, two, three = looks(provisioner, clock, [4, 4, 4])
    assert one.cancelled == () and "nothing yet: wanted below the count for 1 look" in one.line
    assert two.cancelled == tuple(reversed(ids))[:6]  # the newest six
    assert two.line.startswith("wanted 4 pending 10 running 0: cancelled 6 pending (jobs ")
    assert "wanted below the count for 2 looks in a row" in two.line
    assert three.cancelled == () and "nothing to do" in three.line
    assert len(engine.submits) == 10 and len(engine.cancels) == 6


def test_a_drop_cancels_only_what_both_looks_saw_in_excess() -> None:
    clock = FakeClock()
    engine = ScriptedEngine(place=False)
    provisioner = Provisioner(engine, settings(), clock)
    list(looks(provisioner, clock, [10, 8, 4]))
    assert len(engine.cancels) == 2  # 8 was the excess both looks agreed on: 10 - 8


def test_running_nodes_are_left_to_leave_by_themselves_while_the_master_lives() -> None:
    clock = FakeClock()
    engine = ScriptedEngine(place=True)
    provisioner = Provisioner(engine, settings(), clock)
    list(looks(provisioner, clock, [6]))
    engine.add("slurm-node", "pending", "Priority")
    steps = list(looks(provisioner, clock, [0, 0, 0, 0]))
    assert engine.states() == {"running": 6}  # only the pending one was cancelled
    assert len(engine.cancels) == 1
    assert "6 running beyond the count leave by themselves" in steps[-1].line


def test_a_slurm_that_keeps_jobs_pending_gets_max_nodes_jobs_and_its_reason_reported() -> None:
    clock = FakeClock()
    engine = ScriptedEngine(place=False, reason="PartitionDown")
    provisioner = Provisioner(engine, settings(max_nodes=8), clock)
    steps = list(looks(provisioner, clock, [50] * 100))
    assert len(engine.submits) == 8 and engine.states() == {"pending": 8}
    assert engine.cancels == []
    last = steps[-1].line
    assert last.startswith("wanted 8 pending 8 running 0: nothing to do")
    assert last.endswith("pending: 8 PartitionDown")


def test_max_nodes_counts_ending_jobs_too() -> None:
    clock = FakeClock()
    engine = ScriptedEngine()
    for _ in range(3):
        engine.add("slurm-node", "ending")
    provisioner = Provisioner(engine, settings(max_nodes=5), clock)
    step, = looks(provisioner, clock, [5])
    assert len(step.submitted) == 2
    assert "held back by max_nodes 5 jobs in all (3 there)" in step.line


def test_a_restarted_provisioner_adopts_the_jobs_it_finds_and_submits_nothing_twice() -> None:
    clock = FakeClock()
    engine = ScriptedEngine(place=False)
    first = Provisioner(engine, settings(), clock)
    list(looks(first, clock, [7]))
    for job_id in list(engine.table)[:5]:  # Slurm started five of them meanwhile
        engine.table[job_id] = EngineJob(job_id, "slurm-node", "running", "")
    restarted = Provisioner(engine, settings(), clock)
    step, = looks(restarted, clock, [7])
    assert step.line.startswith("wanted 7 pending 2 running 5: nothing to do")
    assert len(engine.submits) == 7
    step, = looks(restarted, clock, [9])
    assert len(step.submitted) == 2 and len(engine.submits) == 9


def test_jobs_of_other_names_are_neither_counted_nor_touched() -> None:
    clock = FakeClock()
    engine = ScriptedEngine(place=False)
    foreign = [engine.add("other-node", "pending", "Priority"),
               engine.add("slurmish", "running")]
    provisioner = Provisioner(engine, settings(), clock)
    list(looks(provisioner, clock, [2, 0, 0, 0]))
    assert len(engine.submits) == 2
    assert set(foreign) <= set(engine.table) and len(engine.cancels) == 2


def test_max_nodes_zero_submits_nothing_and_cancels_what_is_there() -> None:
    clock = FakeClock()
    engine = ScriptedEngine()
    left = engine.add("slurm-node", "pending", "Priority")
    provisioner = Provisioner(engine, settings(max_nodes=0), clock)
    steps = list(looks(provisioner, clock, [5, 5, 5]))
    assert engine.submits == [] and engine.cancels == [left]
    assert steps[0].line.startswith("wanted 0 pending 1 running 0: nothing yet")


def test_a_stale_resource_file_shrinks_everything_after_two_looks_pending_first() -> None:
    clock = FakeClock()
    engine = ScriptedEngine()
    running = [engine.add("slurm-node", "running") for _ in range(3)]
    pending = [engine.add("slurm-node", "pending", "Resources") for _ in range(2)]
    provisioner = Provisioner(engine, settings(), clock)
    gone = Demand(0, False, COMMAND, "resource file r.json written 45 s ago")
    first = provisioner.step(gone)
    assert first.cancelled == () and "the master is gone (resource file r.json" in first.line
    second = provisioner.step(gone)
    assert list(second.cancelled) == pending[::-1] + running[::-1]
    assert second.line.startswith("wanted 0 pending 2 running 3: cancelled 2 pending and "
                                  "3 running (jobs ")
    assert engine.states() == {} and engine.submits == []


def test_a_failing_engine_is_a_warning_and_the_next_look_tries_again() -> None:
    clock = FakeClock()
    engine = ScriptedEngine()
    provisioner = Provisioner(engine, settings(), clock)
    engine.fail_list = "slurm_load_jobs error: Unable to contact slurm controller"
    step = provisioner.step(alive(3))
    assert step.trouble and engine.submits == []
    assert step.line == ("wanted 3 pending ? running ?: did nothing, the jobs cannot be "
                         "listed: squeue: slurm_load_jobs error: Unable to contact slurm "
                         "controller")
    engine.fail_list = ""
    engine.fail_submit = "Batch job submission failed: Invalid partition name specified"
    step = provisioner.step(alive(3))
    assert step.trouble and step.line.startswith("wanted 3 pending 0 running 0: submitted 0 of 3")
    assert "submit failed: sbatch: Batch job submission failed: Invalid partition" in step.line
    engine.fail_submit = ""
    step = provisioner.step(alive(3))  # the failed submits did not use up the rate
    assert not step.trouble and len(step.submitted) == 3


def test_no_command_to_start_a_node_submits_nothing_and_says_so() -> None:
    provisioner = Provisioner(ScriptedEngine(), settings(), FakeClock())
    step = provisioner.step(Demand(2, True, ()))
    assert step.submitted == ()
    assert step.line == ("wanted 2 pending 0 running 0: submitted 0 of 2 wanted: the resource "
                         "file gives no command to start a node")
