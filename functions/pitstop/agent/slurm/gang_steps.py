"""The job steps of a check on every node of a running job (a hung job's localisation).

Each tool is a step of the hung job itself (``srun --jobid --overlap``, no GRES: read-only tools
beside whatever the job's processes hold), pinned to one node, or for the link test to one ring
pair; all of them run at once, so a 16-node sweep takes as long as its slowest node.
"""

from __future__ import annotations

from pitstop.agent.slurm.records import CheckState

SWEEP, LINKS = "sweep", "links"
GANG_KINDS = frozenset({SWEEP, LINKS})
GANG_PARALLEL = 32  # srun steps started at once (slurmctld takes step creations in its stride)


def gang_steps(st: CheckState) -> list[tuple[str, list[str], float]]:
    """(output key, argv, timeout s) of every step: ``tool@node`` or ``nccl@a+b``."""
    tools, job, timeout = st["tools"], str(st["job"]), float(st["timeout_s"])
    base = ["srun", f"--jobid={job}", "--overlap", "--chdir=/tmp", "--quiet"]
    if st["kind"] == SWEEP:
        out: list[tuple[str, list[str], float]] = []
        for n in st["nodes"]:
            one = [*base, "--nodes=1", "--ntasks=1", f"--nodelist={n}", "--"]
            out.append((f"dmesg@{n}", [*one, *tools.get("dmesg", ["dmesg"]), "--raw"], timeout))
            out.append((f"nvidia_smi_q@{n}", [*one, *tools["nvidia_smi"], "-q"], timeout))
        return out
    mpi = [f"--mpi={tools['srun_mpi']}"] if tools.get("srun_mpi") else []
    top = int(st["message_bytes"])
    test = [*tools["all_gather_perf"], "-b", str(max(1 << 20, top // 8)), "-e", str(top), "-f", "2"]
    steps = []
    for a, b in st["pairs"]:
        two = [*base, *mpi, "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", f"--nodelist={a},{b}", "--"]
        steps.append((f"nccl@{a}+{b}", [*two, *test, "-g", str(int(st["gpus"]))], timeout))
    return steps
