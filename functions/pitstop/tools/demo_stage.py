"""What a demo scenario module sees of the running Slurm stack, and what it reports.

Scenario modules (``demo_planned``) take the stage as this Protocol rather than the demo's own
class, so the demo can list their scenarios without the two modules importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pitstop.local.slurm import SlurmCluster


@dataclass
class Result:
    name: str
    passed: bool
    detail: str
    timeline: dict[str, float | None] = field(default_factory=dict)
    incident: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # what was observed, for tests to assert one by one
    resume_s: float | None = None  # detected -> the gang running again, real-time equivalent
    repair_s: float | None = None  # acted -> the node healthy (validated), real-time equivalent


class SlurmStage(Protocol):
    """The Slurm demo's helpers a scenario module uses (tools.demo.Scenarios provides them)."""

    nodes: list[str]
    slurm: SlurmCluster

    def incidents(self, node: str) -> list[dict[str, Any]]: ...
    def wait(self, cond: Callable[[], Any], timeout: float, what: str) -> Any: ...
    def finished(self, node: str, timeout: float = 90.0) -> dict[str, Any]: ...
    def calls(self, method: str, node: str) -> list[dict[str, Any]]: ...
    def notes_for(self, iid: str) -> list[dict[str, Any]]: ...
    def timed(self, r: Result, inc: Mapping[str, Any]) -> Result: ...
    def restarts(self, job: str) -> int: ...
    def job_among(
        self, size: int, candidates: list[str], script: str = "sleep 3600"
    ) -> tuple[str, list[str]]: ...
    def job_nodes(self, job: str) -> list[str]: ...
    def cancel(self, job: str) -> None: ...
    def gpu_state(self, node: str, state: dict[str, Any] | None) -> None: ...
