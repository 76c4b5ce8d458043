"""Checks on every node of a running job at once: a hung job's localisation (core/localise.py).

Unlike a check on a fenced node, nothing of the nodes is changed: the tools run as steps of the
hung job itself (``srun --jobid --overlap``), the job keeps its nodes, no reservation, no drain.
The job must be running; its nodes are Slurm's own answer (``scontrol show job``), and a link
test's pairs must be among them. Started once per check name (the state under the check's lock,
as for every check); the runner and the answer are the checks' own.

A part of the agent's checks by responsibility (commands.SlurmCommands composes them): it holds
the parts it shares with the checks on a fenced node (files, runners, progress) and adds only
what is a gang check's: its arguments, the job's nodes, its start.
"""

from __future__ import annotations

import time
from typing import cast

from pitstop.adapters import log
from pitstop.agent.slurm.access import CheckTools, SlurmAccess
from pitstop.agent.slurm.check_files import CheckFiles
from pitstop.agent.slurm.checks import _agent_user, _int_arg, _started
from pitstop.agent.slurm.gang_steps import GANG_KINDS, LINKS, SWEEP
from pitstop.agent.slurm.progress import Progress
from pitstop.agent.slurm.records import CheckKind, CheckState
from pitstop.agent.slurm.runner import Runners
from pitstop.agent.slurm.text import (
    CHECK_NAME,
    INCIDENT,
    JOB,
    NODE,
    Args,
    CheckNotReadyError,
    CommandRefusedError,
    _need,
)
from pitstop.core.slurm_wire import CheckProgress, CheckStarted

GANG_KEYS = frozenset({"name", "kind", "incident", "job", "pairs", "message_bytes", "gpus", "timeout_s"})
MAX_GANG_NODES = 512  # core/localise.MAX_NODES


class GangChecks:
    """``start_gang_check`` / ``gang_check_result``: a sweep or a link test across a running job."""

    def __init__(
        self, slurm: SlurmAccess, tools: CheckTools, files: CheckFiles, runners: Runners, progress: Progress
    ) -> None:
        self.slurm, self.tools, self.files = slurm, tools, files
        self.runners, self.progress = runners, progress

    def _gang_spec(self, args: Args) -> CheckState:
        unknown = sorted(str(k) for k in args if k not in GANG_KEYS)
        if unknown:
            raise CommandRefusedError(f"unknown check arguments: {', '.join(unknown)[:120]}")
        name, incident = _need(args, "name", CHECK_NAME), _need(args, "incident", INCIDENT)
        m = CHECK_NAME.fullmatch(name)
        kind = args.get("kind")
        if (
            not isinstance(kind, str)
            or kind not in GANG_KINDS
            or m is None
            or (m.group(1), m.group(3)) != (incident, kind)
        ):
            raise CommandRefusedError("check name, incident and kind do not agree")
        spec: CheckState = {
            "name": name,
            "incident": incident,
            "kind": cast(CheckKind, kind),
            "job": _need(args, "job", JOB),
        }
        spec["timeout_s"] = _int_arg(args, "timeout_s", 1, 1800)
        if kind == LINKS:
            spec["message_bytes"] = _int_arg(args, "message_bytes", 1 << 20, 64 << 30)
            spec["gpus"] = _int_arg(args, "gpus", 1, 16)
            spec["pairs"] = _pairs(args.get("pairs"))
        return spec

    def _job_nodes(self, job: str) -> list[str]:
        """The nodes the job runs on now (refused unless it runs)."""
        kv = self.slurm.show_job(job)
        if kv is None:
            raise CommandRefusedError(f"job {job} is not known to Slurm")
        state = kv.get("JobState", "UNKNOWN")
        if state in ("PENDING", "CONFIGURING"):
            raise CheckNotReadyError(f"job {job} is {state}: not on its nodes yet")
        if state != "RUNNING":
            raise CommandRefusedError(f"job {job} is {state}: a gang check runs beside a running job")
        nodes = sorted(self.slurm.hostnames([kv.get("NodeList", "")]))
        if not nodes or len(nodes) > MAX_GANG_NODES:
            raise CommandRefusedError(f"job {job} holds {len(nodes)} nodes: nothing a gang check can run on")
        return nodes

    def start_gang_check(self, args: Args) -> CheckStarted:
        """Start the tools on every node of the job (or its pairs); returns at once with its nodes.

        ``{"started": name, "job": id, "nodes": [...]}``; a start delivered again answers the same.
        """
        spec = self._gang_spec(args)
        with self.files.lock(spec["name"]) as d:
            st = self.files.load(d)
            if st is not None and st.get("started"):
                if st.get("job") != spec["job"]:
                    raise CommandRefusedError(f"check {spec['name']} runs beside job {st.get('job')}")
                return _started(st)
            st = self._new_gang_check(spec)
            self.files.save(d, st)
            self.runners.begin_beside(d, st)
            st["started"] = {**_started(st), "nodes": st["nodes"]}
            self.files.save(d, st)
            return _started(st)

    def _new_gang_check(self, spec: CheckState) -> CheckState:
        nodes = self._job_nodes(str(spec["job"]))  # a gang check names its job
        stray = sorted({n for p in spec.get("pairs", []) for n in p} - set(nodes))
        if stray:
            raise CommandRefusedError(f"pairs name nodes outside job {spec['job']}: {', '.join(stray[:4])}")
        tools = self.tools
        return {
            **spec,
            "node": nodes[0],
            "nodes": nodes,
            "peer": None,
            "note": "",
            "user": _agent_user(),
            "borrowed": True,
            "tools": {
                "nvidia_smi": list(tools.nvidia_smi),
                "dmesg": list(tools.dmesg),
                "all_gather_perf": list(tools.all_gather_perf),
                "srun_mpi": tools.srun_mpi,
            },
            "started": None,
            "finished": False,
            "respawns": 0,
            "created_at": time.time(),
        }

    def gang_check_result(self, args: Args) -> CheckProgress:
        """The check's state now (a fresh probe): ``done`` once every step ran (or timed out)."""
        name, job = _need(args, "name", CHECK_NAME), _need(args, "job", JOB)
        if not (self.files.path(name) / "state.json").exists():
            raise CommandRefusedError(f"no check {name} was started")
        with self.files.lock(name) as d:
            st = self.files.load(d)
            if st is None or st.get("kind") not in GANG_KINDS or st.get("job") != job:
                raise CommandRefusedError(f"no gang check {name} was started beside job {job}")
            out = self.progress.now(d, st)
            if out.get("done"):
                log.emit("INFO", "slurm agent: gang check done", check=name, job=job, nodes=len(st["nodes"]))
            return {**out, "nodes": st["nodes"]}


def _pairs(v: object) -> list[list[str]]:
    """``["a+b", ...]``: each two distinct node names (``+`` is in no node name)."""
    if not isinstance(v, list) or not 0 < len(v) <= MAX_GANG_NODES:
        raise CommandRefusedError("argument pairs is missing or invalid")
    out = []
    for p in v:
        a, _, b = p.partition("+") if isinstance(p, str) else ("", "", "")
        if not all(NODE.fullmatch(n) and n.lower() != "all" for n in (a, b)) or a == b:
            raise CommandRefusedError("each pair is two distinct node names, a+b")
        out.append([a, b])
    return out


__all__ = ["SWEEP", "GangChecks"]
