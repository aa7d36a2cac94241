"""The first step of a node request: is this node, its process and this request let in?

:meth:`Admission._admit` refuses, with ABORT and nothing of the request taken:

* a wrong job id (the node runs an old job, or none): nothing is remembered of the node;
* a node culled for this run (unsuitable caps, or refused by the run's placement:
  ``groups=``, ``exclude=``, ``every_node``'s pins), and a new one that is so culled now;
* a disabled node (``nodes/<name>.down``) that is not in the run;
* a second *live* process of another instance under a name in use (:meth:`Admission._same_name`);
  a known name calling from a new session otherwise is a new node (its old process leaves
  the run, its jobs go back, it is told BUILD);
* ``failure <0`` from a node that is not this run's, building, in the session told BUILD
  (a known node of that session past its build is taken as failure 1 instead).

A node let in is the run's (a new one joins it, BUILDING) and its facts are refreshed from
the request (last seen, address, caps, slots, status).  Recording its results
(:mod:`cluster.master.state.recording`) and choosing its reply
(:mod:`cluster.master.state.handout`) follow.
"""

from __future__ import annotations

import dataclasses

from cluster.master.state.nodeinfo import NodeInfo, NodeState
from cluster.master.state.runcore import Outcome, RunCore
from cluster.wire import protocol
from cluster.wire.protocol import Reply, Request

#: A request let in: its node, the request as taken (a refused ``failure <0`` becomes
#: failure 1) and whether the node joined the run with it.
Admitted = tuple[NodeInfo, Request, bool]


def disabled_reason(name: str) -> str:
    """The ABORT reason a disabled node is given."""
    return f"node {name} is disabled"


class Admission(RunCore):
    """Which requests the run takes, and from which node processes."""

    def _admit(self, req: Request, now: float, session: str, peer: str,
               notes: list[str]) -> Admitted | Outcome:
        """``req`` from the process ``session`` at ``peer``, let in (:data:`Admitted`), or
        refused: the Outcome to send, nothing of the request taken.  ``notes`` gets the
        log lines of what was done to let it in (an old process of the name dropped)."""
        if req.job_id != self.run_id:
            # Wrong id: the node runs an old job (or none).  Remember nothing.
            return Outcome(Reply(protocol.ABORT,
                                 reason=f"{protocol.ABORT_WRONG_JOB_ID}, running {self.run_id}"))
        name = req.node
        if name in self.culled:
            return Outcome(Reply(protocol.ABORT,
                                 reason=f"{protocol.ABORT_UNSUITABLE}: {self.culled[name]}"))
        node = self.nodes.get(name)
        if (node is not None and session and node.session and session != node.session
                and node.state is not NodeState.GONE):
            refusal = self._same_name(node, req, now, session, peer, notes)
            if refusal is not None:
                return refusal
        if name in self.disabled and (node is None or node.state is NodeState.GONE):
            return Outcome(Reply(protocol.ABORT, reason=disabled_reason(name)))
        if (req.failure < 0 and (node is None or node.state is not NodeState.BUILDING
                                 or node.session != session)):
            taken = self._fatal_refused(node, req, session, notes)
            if isinstance(taken, Outcome):
                return taken
            req = taken
        if node is None or node.state is NodeState.GONE:
            joined = self._join(node, req, now, session, notes)
            if isinstance(joined, Outcome):
                return joined
            node, fresh = joined, True
        else:
            fresh = False
        node.last_seen = now
        node.peer = peer or node.peer
        node.caps = req.caps or node.caps
        slots = max(req.slots, 1)
        if slots != node.slots:
            self.slots_known += slots - node.slots
            node.slots = slots
        node.status = req.status
        return node, req, fresh

    def _fatal_refused(self, node: NodeInfo | None, req: Request, session: str,
                       notes: list[str]) -> Outcome | Request:
        """``req`` says ``failure <0`` but ``node`` is not this run's node building in the
        session told BUILD: refused (the Outcome), or, from this session's node past its
        build, taken as failure 1 (the request so changed)."""
        # Failure -1 ends everyone's run: taken only from this run's node that was told
        # BUILD and is building, in the session that was told so.
        why = (f"failure {req.failure} refused: node {req.node} is not building in run "
               f"{self.run_id}")
        if node is None or node.state is NodeState.GONE or node.session != session:
            return Outcome(Reply(protocol.ABORT, reason=why), notes=(why,))
        # A known node of this session past its build: a node fault, not the source's.
        notes.append(why + "; dropped as failure 1")
        return dataclasses.replace(req, failure=1,
                                   failure_reason=f"failure {req.failure} after its build: "
                                                  f"{req.failure_reason}".rstrip(": "))

    def _join(self, old: NodeInfo | None, req: Request, now: float, session: str,
              notes: list[str]) -> NodeInfo | Outcome:
        """Node ``req.node`` (``old``: its process that left the run, if any) joins the run
        as the process ``session``, BUILDING; or, its caps unsuitable or the run's placement
        refusing it, it is culled for this run (the Outcome)."""
        name = req.node
        ok, why = self.suitable(req.caps)
        if ok:
            # Placement (groups=, exclude=, every_node's pins): a refused node is not a
            # failed one; "unsuitable" makes its clusterpull leave this run for good.
            why = self.policy.refusal(name)
            ok = not why
        if not ok:
            self.culled[name] = why
            notes.append(f"node {name} culled for this run: {why}")
            return Outcome(Reply(protocol.ABORT, reason=f"{protocol.ABORT_UNSUITABLE}: {why}"),
                           notes=tuple(notes))
        if old is not None:
            notes.append(f"node {name} rejoined the run")
            self.slots_known -= old.slots
        node = NodeInfo(name, NodeState.BUILDING, now, session=session, instance=req.instance,
                        withdraws=protocol.FEATURE_WITHDRAW in req.features)
        self.slots_known += node.slots
        self.nodes[name] = node
        return node

    def _same_name(self, node: NodeInfo, req: Request, now: float, session: str, peer: str,
                   notes: list[str]) -> Outcome | None:
        """A request under ``node``'s name from another process (``session``).

        A live node (heard from within ``heartbeat_timeout``, not told ABORT) of another
        instance keeps the name: this one is refused, and nothing of it is remembered (the
        ABORT reason names the name and both peers).  Otherwise the old process is gone
        (the node restarted, or the old one fell silent): it leaves the run, its unfinished
        jobs go back to the front of the list, and None lets this request join as a new
        node (BUILD).
        """
        live = (not node.told_abort
                and now - node.last_seen <= self.settings.heartbeat_timeout)
        if live and req.instance and node.instance and req.instance != node.instance:
            why = (f"node name {node.name} is in use by another live process (at "
                   f"{node.peer or '?'}, instance {node.instance}); this one (at "
                   f"{peer or '?'}, instance {req.instance}) is refused")
            return Outcome(Reply(protocol.ABORT, reason=why), notes=(why,))
        self._drop(node, f"restarted: a new process (session {session[:8]}) from "
                         f"{peer or '?'}", notes, lost=False)
        return None

    def takes_results_from(self, name: str) -> bool:
        """Whether :meth:`~cluster.master.state.runstate.RunState.handle` would look at the
        results of a request from node ``name`` now: not from a node culled for this run,
        nor from a disabled one not in it."""
        if name in self.culled:
            return False
        node = self.nodes.get(name)
        return not (name in self.disabled and (node is None or node.state is NodeState.GONE))
