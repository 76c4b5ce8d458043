"""Where a requeued gang goes: Slurm's own topology (read), the nodes Pitstop pins it to (written),
and which native restart Slurm offers the job.

A part of the agent by responsibility (commands.py composes the parts): it reads
``scontrol show topology`` and ``scontrol --version``, and remembers on the controller the node
lists it pinned jobs to.

- Topology: topology/tree prints ``SwitchName=S Level=L ... Nodes=hostlist [Switches=list]`` per
  switch (leaf switches at Level=0); topology/block (23.11+) prints ``BlockName=B ... Nodes=...``.
  A node's path is its leaf switch, then each parent (https://slurm.schedmd.com/topology.conf.html;
  observed on the local 22.05). Without a topology plugin scontrol prints nothing on stdout.
- Placement: a pending job's required nodes are set with ``scontrol update JobId=J
  ReqNodeList=<nodes>`` (scontrol(1): "Set the job's list of required node"), possible only while it
  is pending (22.05 refuses it for a running job: observed). So the pin outlives the run, and a
  later fault on one of those nodes would find the job "pinned" to it: the agent remembers the
  lists it set (``<check dir>/placements/<job>``) so its capacity count tells its own pin from a
  user's, and a later requeue replaces or clears it.
- Native restart: Slurm 25.11 "Added new 'Expedited Requeue' mode for batch jobs. Batch jobs with
  --requeue=expedite will automatically requeue on node failure ... are treated as the highest
  priority job in the system, and their previously allocated set of nodes will be prevented from
  launching other work" (https://slurm.schedmd.com/news.html, Slurm 25.11). The agent reports it
  for a job whose ``scontrol show job`` says ``Requeue=expedite`` on a Slurm of 25.11 or later
  (that spelling is assumed from the option's: no 25.11 here to observe it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pitstop.agent.slurm.access import SlurmAccess
from pitstop.agent.slurm.text import JOB, _kv
from pitstop.core.slurm_wire import expand_hostlist

EXPEDITE_SINCE = (25, 11)
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_topology(text: str) -> dict[str, list[str]]:
    """Each node's switch path, leaf first, from ``scontrol show topology`` ({} when none)."""
    parent: dict[str, str] = {}
    leaf: dict[str, str] = {}
    for line in text.splitlines():
        kv = _kv(line.strip())
        name = kv.get("SwitchName") or kv.get("BlockName")
        if not name:
            continue
        for child in expand_hostlist(kv.get("Switches", "")):
            parent[child] = name
        is_leaf = "BlockName" in kv or kv.get("Level", "0") == "0"
        if is_leaf:
            for node in expand_hostlist(kv.get("Nodes", "")):
                leaf.setdefault(node, name)
    out: dict[str, list[str]] = {}
    for node, switch in leaf.items():
        path = [switch]
        while path[-1] in parent and len(path) < 8:
            path.append(parent[path[-1]])
        out[node] = path
    return out


def version_of(text: str) -> tuple[int, int] | None:
    """(major, minor) from ``scontrol --version`` (``slurm 25.11.0``, ``slurm-wlm 22.05.8``)."""
    m = _VERSION.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


class Placement:
    """Slurm's topology, the job pins Pitstop set (remembered under ``directory``), the version."""

    def __init__(self, slurm: SlurmAccess, directory: str) -> None:
        self.slurm = slurm
        self.dir = Path(directory) / "placements"
        self._version: str | None = None

    def paths(self) -> dict[str, list[str]]:
        return parse_topology(self.slurm.run(["scontrol", "show", "topology"]))

    def version(self) -> str:
        if self._version is None:
            self._version = self.slurm.run(["scontrol", "--version"]).strip()[:64]
        return self._version

    def native(self, kv: dict[str, str]) -> str | None:
        """The restart Slurm itself gives this job on a node failure (None: Pitstop's own)."""
        v = version_of(self.version())
        if v is not None and v >= EXPEDITE_SINCE and kv.get("Requeue", "").lower() == "expedite":
            return "slurm-expedite"
        return None

    # -- the pins Pitstop set ------------------------------------------------------------------

    def _file(self, job: str) -> Path:
        if JOB.fullmatch(job) is None:
            raise ValueError(f"not a job id: {job!r}")
        return self.dir / job

    def pinned(self, job: str) -> list[str] | None:
        """The node list Pitstop last pinned the job to (None: it never did)."""
        try:
            nodes = json.loads(self._file(job).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return [str(n) for n in nodes] if isinstance(nodes, list) else None

    def remember(self, job: str, nodes: list[str] | None) -> None:
        """Record (or, with None, forget) the pin Pitstop set on the job."""
        path = self._file(job)
        if nodes is None:
            path.unlink(missing_ok=True)
            return
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(sorted(nodes)))
        os.replace(tmp, path)

    def ours(self, job: str, required: set[str]) -> bool:
        """Whether the job's required nodes are the pin Pitstop set (not its owner's)."""
        mine = self.pinned(job)
        return bool(required) and mine is not None and set(mine) == required


def doctor(slurm: SlurmAccess) -> list[str]:
    """``pitstop doctor --slurm`` on the controller: Slurm's version and what it offers of its own
    (expedited requeue from 25.11), and whether its topology lets Pitstop tell sub-blocks apart."""
    place = Placement(slurm, "/nonexistent")  # reads only: no pin is remembered or read
    text = place.version()
    v = version_of(text)
    if v is not None and v >= EXPEDITE_SINCE:
        lines = [
            f"slurm: {text}: expedited requeue available: a job submitted with --requeue=expedite is"
            " requeued by Slurm itself at top priority on a node failure; Pitstop's requeue of the same"
            " run is then skipped (it moved on)"
        ]
    else:
        lines = [
            f"slurm: {text}: no expedited requeue (Slurm 25.11 or later): Pitstop requeues the gang itself,"
            " once per run"
        ]
    paths = place.paths()
    if not paths:
        lines.append(
            "slurm: no topology plugin (scontrol show topology is empty): Pitstop cannot tell sub-blocks"
            " apart and takes spares in the scheduler's order"
        )
    else:
        leaves = sorted({p[0] for p in paths.values()})
        lines.append(
            f"slurm: topology of {len(paths)} nodes under {len(leaves)} leaf switches (or blocks):"
            " Pitstop takes a spare under the gang's leaf first, then its parent, then anywhere"
        )
    return lines
