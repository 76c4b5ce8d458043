"""A check's runner: the process that runs its tools as job steps (CheckRun, in the runner process)
and the agent's side of it (Runners: spawn, see alive, reap).

A part of the agent's checks by responsibility: the tools run outside the agent's own process, so
a long DCGM level never holds a command; the runner holds the check's runner lock for as long as
it lives, which is how the agent tells a live runner from a dead one. After the tools, the runner
puts the node back (fence_swap.FenceSwap.finish) under the check's lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pitstop.adapters import log
from pitstop.agent.slurm.access import SlurmAccess
from pitstop.agent.slurm.check_files import CheckFiles, write_result
from pitstop.agent.slurm.checks import _srun, check_steps
from pitstop.agent.slurm.fence_swap import FenceSwap
from pitstop.agent.slurm.gang_steps import GANG_KINDS, GANG_PARALLEL
from pitstop.agent.slurm.records import CheckState
from pitstop.agent.slurm.text import LEAVE_WAIT_S, START_WAIT_S


class Runners:
    """The runner processes this agent started (``children``, reaped as they exit)."""

    def __init__(self, files: CheckFiles) -> None:
        self.files = files
        self.children: list[subprocess.Popen[bytes]] = []

    def reap(self) -> None:
        self.children = [p for p in self.children if p.poll() is None]

    @staticmethod
    def alive(d: Path) -> bool:
        """Whether a runner holds the check's runner lock (it holds it for as long as it lives)."""
        fd = os.open(d / "runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def spawn(self, d: Path) -> None:
        """Start the runner in a session of its own, handing it the runner lock already taken, so
        there is no moment at which a started check has no runner to be seen."""
        fd = os.open(d / "runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with open(d / "runner.log", "ab") as out:
                argv = [
                    sys.executable,
                    "-m",
                    "pitstop.agent.slurm",
                    "--run-check",
                    str(d),
                    "--lock-fd",
                    str(fd),
                ]
                proc = subprocess.Popen(  # a fixed argv; the directory is a check name
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(fd,),
                    start_new_session=True,
                )
            self.children.append(proc)
        finally:
            os.close(fd)  # the runner keeps the lock through its inherited descriptor

    def begin_beside(self, d: Path, st: CheckState) -> None:
        """Steps in the job already on the node (``--overlap``): no reservation, the drain untouched."""
        self.reap()
        if not self.alive(d):
            self.spawn(d)
        st["started"] = {"started": st["name"], "peer": None, "note": st["note"], "job": st["job"]}
        self.files.save(d, st)
        log.emit("INFO", "slurm agent: check started beside a job", check=st["name"], job=st["job"])


class CheckRun:
    """The runner's work (``--run-check DIR``): the tools as job steps, then the fence back."""

    def __init__(self, slurm: SlurmAccess, files: CheckFiles, swap: FenceSwap) -> None:
        self.slurm, self.files, self.swap = slurm, files, swap

    def _wait_running(self, job: str, wait_s: float) -> str:
        """The holder job's state once it runs (or has ended, or ``wait_s`` passed)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                state = self.slurm.run(["squeue", "-h", "-j", job, "-o", "%T"]).strip()
            except RuntimeError as exc:
                if "Invalid job id" not in str(exc):
                    raise
                state = ""
            if state not in ("PENDING", "CONFIGURING") or time.monotonic() >= deadline:
                return state
            time.sleep(1.0)

    def run_check(self, d: Path) -> int:
        """Run the check recorded in ``d`` (called in the runner process, holding the runner lock)."""
        st = self.files.load(d)
        if st is None or not st.get("job") or st.get("finished"):
            return 0
        job = str(st["job"])
        codes: dict[str, int] = {}
        errors: list[str] = []
        keys: list[str] = []
        state = self._wait_running(job, START_WAIT_S)
        if state != "RUNNING":
            errors.append(f"the check job {job} did not run ({state or 'gone'})")
        else:
            steps = check_steps(st)
            gang = st["kind"] in GANG_KINDS  # every node of a job: all at once, each may fail alone
            with ThreadPoolExecutor(max_workers=GANG_PARALLEL if gang else 1) as pool:
                ran = list(pool.map(lambda step: _srun(step[1], step[2]), steps))
            if st.get("fabric") and any(key == "nccl" for key, _, _ in steps):
                (d / "nccl_setup.out").write_text(json.dumps(st["fabric"]))  # what the test ran with
                keys.append("nccl_setup")
            for (key, _, _), (rc, out, err) in zip(steps, ran, strict=True):
                (d / f"{key}.out").write_text(out)
                (d / f"{key}.err").write_text(err[-4000:])
                codes[key], keys = rc, [*keys, key]
                if rc != 0 and not out.strip() and not gang:
                    errors.append(f"{key}: exited {rc} without output: {err.strip()[-200:]}")
        write_result(d, {"keys": keys, "exit_codes": codes, "error": "; ".join(errors) or None})
        for _ in range(10):
            with self.files.lock(d.name):
                st = self.files.load(d) or st
                if self.swap.finish(d, st, wait_s=0.0):
                    return 0
            self.swap.job_gone(job, LEAVE_WAIT_S)
        return 1
