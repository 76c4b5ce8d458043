"""How long a remediation step may legitimately run: the watchdog's deadline, derived from the
workflow's own waits so the watchdog never fails a step the workflow is still rightly waiting on.

workflows/remediate.yaml waits, at most, for each of: the corroboration check, the checkpoint
(drain), the diagnostic (REPLACE_NODE), the Compute operation, verify, the validation, its
second peer's NCCL test, and the gang's resume; every mutating call may also spend its retry
rounds once. The waits are the workflow's deployed environment (infra/resources.yaml, workflow
pitstop-remediate); a test keeps WORKFLOW_WAITS equal to it.
"""

from __future__ import annotations

from collections.abc import Mapping

from pitstop.core.actions import Action

WORKFLOW_WAITS: Mapping[str, float] = {
    "PITSTOP_OP_TIMEOUT_S": 1800.0,
    "PITSTOP_VERIFY_TIMEOUT_S": 2700.0,
    "PITSTOP_CHECK_TIMEOUT_S": 1800.0,
    "PITSTOP_RESUME_WAIT_S": 600.0,
}
CHECKPOINT_WAIT_S = 600.0  # the longest checkpoint wait (services/actuate/fence.py)
MUTATE_ROUNDS_S = 660.0  # mutate's 4 rounds of retries (workflows/remediate.yaml), spent once
MARGIN = 1.1


def step_bound_s(action: str, waits: Mapping[str, float] = WORKFLOW_WAITS) -> float:
    """The longest one step of ``action`` can run while the workflow still waits as designed."""
    check, op = waits["PITSTOP_CHECK_TIMEOUT_S"], waits["PITSTOP_OP_TIMEOUT_S"]
    total = check + waits["PITSTOP_RESUME_WAIT_S"] + MUTATE_ROUNDS_S  # corroboration, resume
    if action == Action.DRAIN_NODE:
        total += CHECKPOINT_WAIT_S
    if action == Action.REPLACE_NODE:
        total += check  # the diagnostic
    total += op + waits["PITSTOP_VERIFY_TIMEOUT_S"] + 2 * check  # act, verify, validation, second peer
    return total * MARGIN


def deadline_s(action: str, configured: float) -> float:
    """The policy's deadline, never shorter than what the workflow itself may wait."""
    return max(configured, step_bound_s(action))


def platform_until(acted: Mapping[str, object] | None) -> float | None:
    """When the platform's maintenance window that the act step waits out ends, by Compute's own
    word: the act record's time plus the ``verify_wait_s`` it derived from the VM's
    ``upcomingMaintenance`` (services/actuate/repair.py). None without such a record.

    Never the incident's ``maintenance.window_end``: that is the log entry's ``windowEndTime``, and
    anyone who may publish to the events topic can set it a year ahead (issue 35, low)."""
    if not isinstance(acted, Mapping) or acted.get("state") != "done":
        return None
    result, at = acted.get("result"), acted.get("at")
    wait = result.get("verify_wait_s") if isinstance(result, Mapping) else None
    if not isinstance(at, int | float) or not isinstance(wait, int | float) or isinstance(wait, bool):
        return None
    return float(at) + float(wait)


def with_platform_wait(deadline: float, started: float, until: float | None) -> float:
    """The deadline, stretched to cover a platform window the step waits out (and its own time after)."""
    return deadline if until is None else max(deadline, until - started + deadline)
