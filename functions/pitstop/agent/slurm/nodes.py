"""Node fences: drain for an incident, resume only Pitstop's own drain for it, and the node's state.

One of the agent's parts by responsibility (commands.py composes them): everything here changes or
reads one node's state and reason, and nothing else; jobs are jobs.py's, checks are checks'.
"""

from __future__ import annotations

import re

from pitstop.adapters import log
from pitstop.agent.slurm.access import SlurmAccess
from pitstop.agent.slurm.text import _REASON_TEXT, ACTIONS, INCIDENT, Args, CommandRefusedError, _need
from pitstop.core.slurm_wire import (
    DRAIN_REASON_PREFIX,
    DrainAnswer,
    NodeStateAnswer,
    ResumeAnswer,
    drain_reason,
)


class NodeCommands:
    """``drain``, ``resume`` and ``node_state``: a fence someone else set is left as it is."""

    def __init__(self, slurm: SlurmAccess) -> None:
        self.slurm = slurm

    def drain(self, args: Args) -> DrainAnswer:
        node = self.slurm.member(args)
        incident = _need(args, "incident", INCIDENT)
        action = args.get("action")
        if not isinstance(action, str) or action not in ACTIONS:
            raise CommandRefusedError("argument action is missing or invalid")
        # The reason is built here from validated parts only: no log text ever reaches Slurm.
        reason = drain_reason(incident, action)
        before = self.slurm.node_info(node)
        out: DrainAnswer = {
            "node": node,
            "previous_state": before.state,
            "previous_reason": before.reason,
            "already_drained_by_other": False,
            "reason": None,
        }
        ours = before.reason.startswith(f"{DRAIN_REASON_PREFIX}{incident} ")
        if before.drained and not ours:
            # Someone else's drain (a person, or Pitstop for another incident): left as it is.
            log.emit(
                "INFO",
                "slurm agent: node already drained by someone else; left alone",
                node=node,
                state=before.state,
                reason=before.reason,
            )
            return {**out, "reason": None, "already_drained_by_other": True}
        if before.base == "DOWN" and before.reason and not ours:
            # DOWN alone is not a fence: Slurm returns the node to service when its slurmd registers
            # again (ReturnToService), i.e. right after the reboot Pitstop is about to do. Drain it,
            # keeping what was there in the reason.
            kept = _REASON_TEXT.sub("", before.reason)[:80]
            reason = f"{reason} (was {before.base}: {kept})"
        self.slurm.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
        return {**out, "reason": reason}

    def resume(self, args: Args) -> ResumeAnswer:
        node = self.slurm.member(args)
        prefix = DRAIN_REASON_PREFIX
        if args.get("incident") is not None:  # commands from before the incident was sent: any Pitstop drain
            prefix += _need(args, "incident", INCIDENT) + " "
        info = self.slurm.node_info(node)
        out: ResumeAnswer = {"node": node, "state": info.state, "reason": info.reason, "resumed": False}
        if not info.out_of_service:
            return {**out, "resumed": False}
        if not info.reason.startswith(prefix):
            log.emit(
                "INFO",
                "slurm agent: node drained by someone else; left drained",
                node=node,
                state=info.state,
                reason=info.reason,
            )
            return {**out, "resumed": False, "left_drained": info.reason}
        theirs = _down_by_other(info.reason)
        if theirs is not None:  # Pitstop's drain sat on a person's DOWN: leave the node to them
            # kept out of service with their reason: a drain, since a DOWN node whose slurmd registers
            # is returned to service by ReturnToService=2 (slurm.conf(5)), and never runs a job between
            self.slurm.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={theirs}"])
            log.emit("INFO", "slurm agent: node left out of service as set", node=node, reason=theirs)
            return {**out, "resumed": False, "left_drained": f"DOWN: {theirs} (set before Pitstop's fence)"}
        self.slurm.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        return {**out, "resumed": True}

    def node_state(self, args: Args) -> NodeStateAnswer:
        info = self.slurm.node_info(self.slurm.member(args))
        return {"node": info.node, "state": info.state, "reason": info.reason}


# DOWN reasons slurmctld sets itself (a slurmd that stopped answering, or came back after a reboot it
# did not expect): Pitstop's repair is what they wait for. Any other DOWN reason is a person's.
SLURM_DOWN_REASONS = frozenset({"Not responding", "Node unexpectedly rebooted"})
_WAS_DOWN = re.compile(r" \(was DOWN: (?P<reason>.+)\)$")


def _down_by_other(reason: str) -> str | None:
    """The DOWN reason someone else had set before Pitstop's drain (kept in its reason), if any."""
    m = _WAS_DOWN.search(reason)
    if m is None or m["reason"] in SLURM_DOWN_REASONS:
        return None
    return m["reason"]
