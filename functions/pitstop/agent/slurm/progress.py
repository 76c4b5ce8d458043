"""A started check's answer now: pending (and why), or done with its tools' outputs.

A part of the agent's checks by responsibility (fenced.py and gang.py answer through it): a fresh
probe under the check's lock. A runner that died is started again while the job runs (up to
RUNNER_RESPAWNS), and a check is done only once its node is as it was (FenceSwap.finish).
"""

from __future__ import annotations

import json
from pathlib import Path

from pitstop.adapters import log
from pitstop.agent.slurm.check_files import CheckFiles, write_result
from pitstop.agent.slurm.fence_swap import FenceSwap
from pitstop.agent.slurm.records import CheckState
from pitstop.agent.slurm.runner import Runners
from pitstop.agent.slurm.text import OUTPUT_MAX, RUNNER_RESPAWNS, CommandRefusedError
from pitstop.core.slurm_wire import GPU_GRANT, CheckProgress


class Progress:
    """What ``check_result`` and ``gang_check_result`` answer."""

    def __init__(self, files: CheckFiles, runners: Runners, swap: FenceSwap) -> None:
        self.files, self.runners, self.swap = files, runners, swap

    def now(self, d: Path, st: CheckState) -> CheckProgress:
        """A started check's answer now (held under its lock): pending, or done with its outputs."""
        name = st["name"]
        if st.get("undone"):
            raise CommandRefusedError(f"check {name} did not start: {st['undone']}")
        if st.get("finished"):
            return self.answer(d, st)
        if not st.get("started"):
            return self.pending(st, "the check is still being started")
        self.runners.reap()
        if self.runners.alive(d):
            return self.pending(st, "running")
        if not (d / "result.json").exists():
            if st["respawns"] < RUNNER_RESPAWNS and not self.swap.job_gone(st["job"], 0.0):
                st["respawns"] += 1
                self.files.save(d, st)
                self.runners.spawn(d)
                log.emit("WARNING", "slurm agent: check runner had stopped; started again", check=name)
                return self.pending(st, "runner started again")
            write_result(
                d,
                {
                    "keys": [],
                    "exit_codes": {},
                    "error": "the check's runner stopped before the tools finished",
                },
            )
        if self.swap.finish(d, st, wait_s=3.0):
            return self.answer(d, st)
        return self.pending(st, "fencing the node again")

    @staticmethod
    def pending(st: CheckState, phase: str) -> CheckProgress:
        return {
            "done": False,
            "name": st["name"],
            "node": st["node"],
            "peer": st.get("peer"),
            "note": st.get("note", ""),
            "job": st.get("job"),
            "phase": phase,
            "outputs": {},
            "error": None,
        }

    @staticmethod
    def answer(d: Path, st: CheckState) -> CheckProgress:
        res = json.loads((d / "result.json").read_text())
        outputs, stderr = {}, {}
        for key in res.get("keys", []):
            out, err = d / f"{key}.out", d / f"{key}.err"
            if out.exists():
                outputs[key] = out.read_text(errors="replace")[:OUTPUT_MAX]
            if err.exists() and err.stat().st_size:
                stderr[key] = err.read_text(errors="replace")[-1000:]
        gres = st["tools"].get("gres") if "tools" in st else None  # none: answered without running
        if st["kind"] == "corroborate" and gres and outputs:
            outputs[GPU_GRANT] = f"{gres}:{int(st['gpus'])}"  # the step's explicit ask
        return {
            "done": True,
            "name": st["name"],
            "node": st["node"],
            "peer": st.get("peer"),
            "note": st.get("note", ""),
            "job": st.get("job"),
            "outputs": outputs,
            "exit_codes": res.get("exit_codes", {}),
            "stderr": stderr,
            "error": res.get("error"),
            "restored": st.get("restored"),
        }
