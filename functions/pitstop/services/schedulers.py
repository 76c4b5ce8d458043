"""The registry of schedulers: which adapter serves a cluster, built from its policy entry.

actuate and ``pitstop incidents --close`` hold one :class:`~pitstop.core.scheduling.Scheduler` per
cluster and never ask which kind it is. A scheduler is one folder of plugins/schedulers/ (its
``build``, its policy block, its deploy fragment): the registry finds the folders, keyed by the
policy's ``scheduler:`` value; there is no table here to edit.
"""

from __future__ import annotations

from pitstop.core.domain import CheckSpec
from pitstop.core.policy import Policy
from pitstop.core.scheduling import (
    Capacity,
    CheckResult,
    CheckStart,
    JobInfo,
    JobRun,
    JobState,
    NoNodes,
    RequeueOutcome,
    Scheduler,
    StepRef,
)
from pitstop.plugins import modules
from pitstop.plugins.schedulers import Factory, Wiring

__all__ = ["Factory", "NoScheduler", "Wiring", "factories", "schedulers_for"]


class NoScheduler(NoNodes):
    """Nodes outside any scheduler: nothing to fence, no jobs, healthy when the VM is."""

    name = "none"

    def checkpoint(self, job: str, ref: StepRef) -> str:
        return "nothing: no scheduler"

    def job_info(self, job: str, ref: StepRef) -> JobInfo:
        return JobInfo(job, JobState.UNKNOWN)

    def requeue(self, job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        return RequeueOutcome(job, False, "no scheduler: nothing to requeue")

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        return Capacity(False, "no scheduler: nothing to requeue")

    def start_check(self, node: str, check: CheckSpec, ref: StepRef) -> CheckStart:
        from pitstop.adapters.errors import ActuatorError

        raise ActuatorError(409, "no scheduler to run a check on the node through", False)

    def check_result(self, node: str, check: CheckSpec, ref: StepRef) -> CheckResult:
        from pitstop.adapters.errors import ActuatorError

        raise ActuatorError(409, "no scheduler to run a check on the node through", False)


def factories() -> dict[str, Factory]:
    """policy ``scheduler:`` -> how its adapter is built: each folder's ``build``."""
    out: dict[str, Factory] = {}
    for plugin, module in modules("schedulers"):
        out[plugin.name] = module.build
    return out


def schedulers_for(policy: Policy, wiring: Wiring) -> dict[str, Scheduler]:
    """The scheduler of each cluster in the policy (clusters with ``scheduler: none`` have none)."""
    found = factories()
    return {c.name: found[c.scheduler](c, wiring) for c in policy.clusters if c.scheduler in found}
