"""A real Slurm cluster on one machine: munge, slurmctld, one slurmd per node (reference/local-slurm.md)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pitstop.local.procs import Proc, free_port


def topology_conf(nodes: list[str], places: dict[str, tuple[str, str]]) -> str:
    """topology.conf for topology/tree: a leaf switch per sub-block (its nodes), a switch per block
    (its sub-blocks' switches), a root over the blocks; a node without a place sits in block-1/sub-1.
    Switch names are ``<block>`` and ``<block>-<sub-block>``: a sub-block id is only unique in its block."""
    blocks: dict[str, dict[str, list[str]]] = {}
    for n in nodes:
        block, sub = places.get(n, ("block-1", "sub-1"))
        blocks.setdefault(block, {}).setdefault(sub, []).append(n)
    lines = []
    for block, subs in sorted(blocks.items()):
        for sub, members in sorted(subs.items()):
            lines.append(f"SwitchName={block}-{sub} Nodes={','.join(members)}")
        lines.append(f"SwitchName={block} Switches={','.join(f'{block}-{s}' for s in sorted(subs))}")
    lines.append(f"SwitchName=root Switches={','.join(sorted(blocks))}")
    return "\n".join(lines) + "\n"


def ensure_munge() -> None:
    """Create the key once and start munged as user munge (idempotent, and safe when several test
    processes start clusters at once: they take turns on a lock file)."""
    with open("/run/pitstop-munge.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True, check=False).returncode != 0:
            _start_munge()


def _start_munge() -> None:
    for d in ("/etc/munge", "/run/munge", "/var/lib/munge", "/var/log/munge"):
        os.makedirs(d, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    if not os.path.exists("/etc/munge/munge.key"):
        subprocess.run(["/usr/sbin/mungekey", "--create"], check=True, capture_output=True)
    shutil.chown("/etc/munge/munge.key", "munge", "munge")
    os.chmod("/etc/munge/munge.key", 0o400)
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True, capture_output=True)


@dataclass
class SlurmCluster:
    """``places``: node -> (block, sub-block), as the fake Compute places the VMs; given, the cluster
    runs ``topology/tree`` with a topology.conf written from them, the way Cluster Toolkit writes one
    from Compute's physicalHostTopology: a leaf switch per sub-block, a switch per block above its
    sub-blocks, and one root above the blocks (https://slurm.schedmd.com/topology.conf.html)."""

    workdir: Path
    nodes: list[str]
    cluster: str = "pitstop"
    procs: list[Proc] = field(default_factory=list)
    daemons: dict[str, Proc] = field(default_factory=dict)
    places: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Partitions of their own (name -> nodes), as Cluster Toolkit gives each machine type's nodeset:
    # their nodes are not in the default partition ``gpu``.
    partitions: dict[str, list[str]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.workdir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_conf(self) -> None:
        ctld = free_port()
        d = self.workdir
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        node_lines = [
            f"NodeName={n} NodeHostname=localhost Port={free_port()} CPUs=1 RealMemory=1000 State=UNKNOWN"
            for n in self.nodes
        ]
        self.conf.write_text(
            "\n".join(
                [
                    f"ClusterName={self.cluster}",
                    "SlurmctldHost=localhost",
                    f"SlurmctldPort={ctld}",
                    "SlurmdPort=6818",
                    "AuthType=auth/munge",
                    "CryptoType=crypto/munge",
                    "SlurmUser=root",
                    f"StateSaveLocation={d}/state",
                    f"SlurmdSpoolDir={d}/spool/%n",
                    f"SlurmctldPidFile={d}/ctld.pid",
                    f"SlurmdPidFile={d}/d-%n.pid",
                    f"SlurmctldLogFile={d}/log/ctld.log",
                    f"SlurmdLogFile={d}/log/d-%n.log",
                    "ProctrackType=proctrack/pgid",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "ReturnToService=2",
                    "SchedulerType=sched/backfill",
                    "MpiDefault=none",
                    "JobRequeue=1",
                    "SlurmdTimeout=30",
                    "InactiveLimit=0",
                    "KillWait=2",
                    "MinJobAge=300",
                    "SchedulerParameters=sched_interval=1,bf_interval=1",
                    *node_lines,
                    *self._partition_lines(),
                    *(["TopologyPlugin=topology/tree"] if self.places else []),
                ]
            )
            + "\n"
        )
        if self.places:
            (d / "topology.conf").write_text(topology_conf(self.nodes, self.places))

    def _partition_lines(self) -> list[str]:
        own = {n for members in self.partitions.values() for n in members}
        default = [n for n in self.nodes if n not in own]
        return [
            f"PartitionName=gpu Nodes={','.join(default)} Default=YES MaxTime=INFINITE State=UP",
            *(
                f"PartitionName={name} Nodes={','.join(members)} MaxTime=INFINITE State=UP"
                for name, members in sorted(self.partitions.items())
            ),
        ]

    def start_controller(self, timeout: float = 60.0) -> None:
        ensure_munge()
        self.write_conf()
        ctld = Proc(
            "slurmctld",
            ["slurmctld", "-D", "-c", "-f", str(self.conf)],
            self.workdir / "slurmctld.out",
            self.env,
        ).start()
        self.procs.append(ctld)
        self._wait(
            lambda: self._ok(["scontrol", "ping"]) and "UP" in self._out(["scontrol", "ping"]),
            timeout,
            "slurmctld",
        )

    def wait_idle(self, count: int, timeout: float = 60.0) -> None:
        self._wait(lambda: self.idle_count() >= count, timeout, f"{count} slurmd nodes idle")

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        self.start_controller(timeout)
        for n in self.nodes:
            self.start_node(n)
        self.wait_idle(len(self.nodes), timeout)
        return self

    def start_node(self, node: str) -> None:
        (self.workdir / "spool" / node).mkdir(parents=True, exist_ok=True)
        p = Proc(
            f"slurmd-{node}",
            ["slurmd", "-D", "-f", str(self.conf), "-N", node],
            self.workdir / f"slurmd-{node}.out",
            self.env,
        ).start()
        self.daemons[node] = p
        self.procs.append(p)

    def stop_node(self, node: str) -> None:
        """A node whose slurmd is gone: it cannot register, so slurmctld cannot return it to service."""
        p = self.daemons.pop(node)
        p.stop()
        self.procs.remove(p)

    def _ok(self, argv: list[str]) -> bool:
        return subprocess.run(argv, env=self.env, capture_output=True, check=False).returncode == 0

    def _out(self, argv: list[str]) -> str:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=False).stdout

    def idle_count(self) -> int:
        out = self._out(["sinfo", "-h", "-N", "-o", "%N %t"])
        return sum(1 for line in out.splitlines() if line.split()[1:2] == ["idle"])

    def node_states(self) -> dict[str, str]:
        out = self._out(["sinfo", "-h", "-N", "-o", "%N|%T|%E"])
        return {
            p[0]: f"{p[1]}{' (' + p[2] + ')' if p[2] and p[2] != 'none' else ''}"
            for p in (line.split("|") for line in out.splitlines())
            if len(p) == 3
        }

    def jobs(self) -> list[dict[str, str]]:
        out = self._out(["squeue", "-h", "-o", "%i|%T|%N|%j|%r"])
        return [
            dict(zip(("id", "state", "nodes", "name", "reason"), line.split("|", 4), strict=False))
            for line in out.splitlines()
        ]

    def submit(
        self,
        nodes: int,
        name: str = "train",
        seconds: int = 3600,
        command: str | None = None,
        exclude: list[str] | None = None,
        comment: str | None = None,
        partition: str | None = None,
    ) -> str:
        """A batch job on ``nodes`` nodes, requeueable; it sleeps ``seconds`` unless given a ``command``;
        never placed on ``exclude`` (a requeue may move it to any other node, as a training job);
        ``comment``: its ``--comment`` (a training job's opt-in to hang remediation); ``partition``:
        one of ``partitions`` (else the default)."""
        out = subprocess.run(
            [
                "sbatch",
                *(["-p", partition] if partition else []),
                *(["-x", ",".join(exclude)] if exclude else []),
                *([f"--comment={comment}"] if comment else []),
                "--parsable",
                "-N",
                str(nodes),
                "--requeue",
                "-J",
                name,
                "-o",
                "/dev/null",
                "--wrap",
                command or f"sleep {seconds}",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
            cwd=self.workdir,
        ).stdout
        return out.strip().split(";")[0]

    def submit_on(self, nodes: list[str], command: str = "sleep 3600", name: str = "train") -> str:
        """A requeueable gang pinned to exactly ``nodes`` (``-w``)."""
        argv = ["sbatch", "--parsable", "--requeue", "-J", name, "-o", "/dev/null"]
        argv += ["-w", ",".join(nodes), "-N", str(len(nodes)), "--wrap", command]
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, check=True, cwd=self.workdir
        )
        return done.stdout.strip().split(";")[0]

    def job_nodes(self, job: str) -> list[str]:
        """The nodes a running job holds (empty while it is not running)."""
        listed = self._out(["squeue", "-h", "-j", job, "-t", "RUNNING", "-o", "%N"]).strip()
        return self._out(["scontrol", "show", "hostnames", listed]).split() if listed else []

    def restarts(self, job: str) -> int:
        """How often Slurm restarted the job (-1: it does not know the job)."""
        fields = self._out(["scontrol", "show", "job", "-o", job]).split()
        return next((int(t.split("=", 1)[1]) for t in fields if t.startswith("Restarts=")), -1)

    def cancel(self, job: str) -> None:
        self._ok(["scancel", job])

    @staticmethod
    def _wait(cond: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if cond():  # type: ignore[operator]
                    return
            time.sleep(0.3)
        raise TimeoutError(f"{what} not ready after {timeout}s")

    def cancel_jobs(self) -> None:
        """Cancel this cluster's jobs and let them finish while the slurmds still run.

        A job whose slurmd is gone leaves a slurmstepd waiting forever, so this comes first.
        """
        if not (self.procs and self.procs[0].alive()):
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["scancel", "--full", "--quiet", "-u", "root"],
                env=self.env,
                timeout=10,
                capture_output=True,
                check=False,
            )
            deadline = time.monotonic() + 15
            while self._out(["squeue", "-h"]).strip() and time.monotonic() < deadline:
                time.sleep(0.3)

    def stop(self) -> None:
        self.cancel_jobs()
        subprocess.run(["pkill", "-f", f"{self.workdir}/spool/"], capture_output=True, check=False)
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()
        self.daemons.clear()
        self._end_strays()

    def _end_strays(self) -> None:
        """Job steps (slurmstepd and the job's own processes) can outlive their slurmd: end the ones
        of this cluster, known by the SLURM_CONF in their environment and by being a step (a
        slurmstepd) or a job's process (SLURM_JOB_ID). Anything else that merely inherited
        SLURM_CONF from a caller (an emulator a test started meanwhile) is not Slurm's to end."""
        mine = f"SLURM_CONF={self.conf}".encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                env = (proc / "environ").read_bytes().split(b"\0")
                step = (proc / "comm").read_text().strip() == "slurmstepd"
                if mine in env and (step or any(v.startswith(b"SLURM_JOB_ID=") for v in env)):
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue  # gone meanwhile, or not ours to read
