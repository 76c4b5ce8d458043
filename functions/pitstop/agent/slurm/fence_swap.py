"""The swap of a fence for a reservation and back, around a check on a fenced node.

A part of the agent's checks by responsibility (fenced.py starts it, runner.py and progress.py
end it): the Slurm side of step 1, 3 and 4 of the package docstring's check: the check's MAINT
reservation (and an idle peer for a validation), the holder job, and, afterwards, the drain put
back with the reason it had, the job cancelled and the reservation deleted. The command lines of
the holder job are checks.py's (holder_argv), with every other line a check runs.
"""

from __future__ import annotations

import time
from pathlib import Path

from pitstop.adapters import log
from pitstop.agent.slurm.access import SlurmAccess
from pitstop.agent.slurm.check_files import CheckFiles
from pitstop.agent.slurm.checks import holder_argv
from pitstop.agent.slurm.records import CheckState
from pitstop.agent.slurm.text import ACTIVE_JOB_STATES, JOB, VALIDATE_KINDS, SlurmOutputError


class FenceSwap:
    """Reserve, hold, and put back: each step idempotent, its progress saved in the check's state."""

    def __init__(self, slurm: SlurmAccess, files: CheckFiles) -> None:
        self.slurm, self.files = slurm, files

    def reserve(self, d: Path, st: CheckState) -> None:
        """The check's reservation: the node (and for validate one idle peer), for the agent's user."""
        name, node = st["name"], st["node"]
        existing = self.slurm.reservations().get(name)
        if existing is not None:
            want = {node} | ({st["peer"]} if st["peer"] else set())
            if self.slurm.hostnames([existing.nodes]) != want:
                raise SlurmOutputError(f"reservation {name} holds {existing.nodes}, not {sorted(want)}")
            self.files.save(d, st)
            return
        candidates: list[str] = []
        if st["kind"] in VALIDATE_KINDS and st.get("want_peer", True):
            st["partition"], candidates = self.peers(st)
            if not candidates:
                st["note"] = f"no idle unreserved peer in partition {st['partition']}: no NCCL test"
        for peer in [*candidates[:4], None]:
            nodes = node if peer is None else f"{node},{peer}"
            st["peer"] = peer
            try:
                self.slurm.run(
                    [
                        "scontrol",
                        "create",
                        "reservation",
                        f"ReservationName={name}",
                        f"Users={st['user']}",
                        f"Nodes={nodes}",
                        "StartTime=now",
                        "Duration=UNLIMITED",
                        "Flags=MAINT",
                    ]
                )
            except RuntimeError as exc:
                if peer is not None and "nodes are busy" in str(exc).lower():
                    continue  # the peer took a job since it was picked: the next one
                if "duplicate reservation name" in str(exc).lower():
                    return self.reserve(d, st)  # an answer lost on its way: made after all
                raise
            if peer is None and candidates:
                st["note"] = f"every idle peer in partition {st['partition']} got busy: no NCCL test"
            self.files.save(d, st)
            return

    def peers(self, st: CheckState) -> tuple[str, list[str]]:
        """A partition of the node with idle healthy unreserved peers, and those peers (fresh)."""
        nodes = self.slurm.nodes()
        reserved = self.slurm.reserved(self.slurm.reservations())
        for part in st["partitions"]:
            found = sorted(
                n
                for n, (info, parts) in nodes.items()
                if part in parts
                and n != st["node"]
                and n not in st.get("exclude_peers", ())
                and info.free_idle
                and n not in reserved
                and n.lower() != "all"
            )
            if found:
                return part, found
        return st["partitions"][0], []

    def find_job(self, name: str, user: str) -> str | None:
        """The check's holder job if an earlier attempt submitted it (found by name)."""
        out = self.slurm.run(["squeue", "-h", "-n", name, "-u", user, "-o", "%i|%T"])
        for line in out.splitlines():
            job, _, state = line.partition("|")
            if JOB.fullmatch(job) and state in ACTIVE_JOB_STATES:
                return job
        return None

    def submit(self, st: CheckState) -> str:
        """The holder job (checks.holder_argv); its id."""
        out = self.slurm.run(holder_argv(st))
        job = out.strip().split(";", 1)[0]
        if JOB.fullmatch(job) is None:
            raise SlurmOutputError(f"unexpected sbatch answer {out[:100]!r}")
        return job

    def job_gone(self, job: str | None, wait_s: float) -> bool:
        """Whether the job has left its nodes, waiting up to ``wait_s``."""
        if job is None:
            return True
        deadline = time.monotonic() + wait_s
        while True:
            try:
                states = self.slurm.run(["squeue", "-h", "-j", job, "-o", "%T"]).split()
            except RuntimeError as exc:
                if "Invalid job id" in str(exc):
                    return True
                raise
            if not set(states) & ACTIVE_JOB_STATES:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def finish(self, d: Path, st: CheckState, wait_s: float) -> bool:
        """Put the node back as it was: drained with its reason first, then the job cancelled, then
        (once the job has left) the reservation deleted. True when all of it is done. Idempotent."""
        if st.get("finished"):
            return True
        if st.get("borrowed"):  # nothing of the node's was changed: the job is not the check's
            st["finished"], st["finished_at"] = True, time.time()
            self.files.save(d, st)
            return True
        node, name = st["node"], st["name"]
        job = st.get("job") or self.find_job(name, st["user"])  # submitted, its answer lost
        info = self.slurm.node_info(node)
        if not info.drained:
            drain = ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={st['reason']}"]
            self.slurm.run(drain)
            info = self.slurm.node_info(node)
            if not info.drained:
                raise SlurmOutputError(f"node {node} is {info.state} after the drain")
        elif info.reason != st["reason"] and "restored" not in st:
            st["note"] = f"{st['note']}; " if st["note"] else ""
            st["note"] += f"node drained meanwhile by someone else ({info.reason[:80]}): left so"
        st["restored"] = {"state": info.state, "reason": info.reason}
        if job is not None:
            self.slurm.run(["scancel", job])  # a job that already ended: nothing to do, exit 0
        self.files.save(d, st)
        if not self.job_gone(job, wait_s):
            return False
        try:
            self.slurm.run(["scontrol", "delete", f"ReservationName={name}"])
        except RuntimeError as exc:
            if "in use" in str(exc):
                return False  # the job is still leaving: next time
            if "reservation is invalid" not in str(exc):
                raise
        info = self.slurm.node_info(node)  # as the check leaves it
        if not info.drained:
            raise SlurmOutputError(f"node {node} is {info.state} after the check; expected it drained")
        st["restored"] = {"state": info.state, "reason": info.reason}
        st["finished"], st["finished_at"] = True, time.time()
        self.files.save(d, st)
        log.emit(
            "INFO", "slurm agent: check finished; node fenced again", check=name, node=node, state=info.state
        )
        return True
