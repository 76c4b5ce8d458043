"""Starting and watching remediation executions with google-cloud-workflows' ExecutionsClient.

The endpoint is configurable so that the local Workflows runner, which serves the same
gRPC Executions API, is driven by exactly this code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud.workflows import executions_v1
from google.cloud.workflows.executions_v1.services.executions.transports import ExecutionsGrpcTransport

# Execution states that mean it will not call actuate again. NOT_FOUND: Workflows has no such
# execution (never created, or past its retention), which ends it just as surely.
ENDED_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
NOT_FOUND = "NOT_FOUND"


@dataclass(frozen=True)
class ExecutionStatus:
    """What the watchdog needs to know about one execution."""

    name: str
    state: str  # ACTIVE, QUEUED, SUCCEEDED, FAILED, CANCELLED, UNAVAILABLE, ... or NOT_FOUND
    started_at: float | None = None
    ended_at: float | None = None
    error: str | None = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES or self.state == NOT_FOUND


def _epoch(ts: Any) -> float | None:
    """A proto timestamp as proto-plus returns it (a datetime, or None when unset)."""
    return float(ts.timestamp()) if ts else None


def make_client(endpoint: str | None = None) -> executions_v1.ExecutionsClient:
    """The real client; ``endpoint`` (host:port) selects an insecure local server instead of Google."""
    if endpoint:
        channel = grpc.insecure_channel(endpoint)
        transport = ExecutionsGrpcTransport(channel=channel, credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
        return executions_v1.ExecutionsClient(transport=transport)
    return executions_v1.ExecutionsClient()


class WorkflowStarter:
    def __init__(self, project: str, location: str, workflow: str, endpoint: str | None = None) -> None:
        self.client = make_client(endpoint)
        self.parent = self.client.workflow_path(project, location, workflow)

    @staticmethod
    def labels(incident_id: str, step: int) -> dict[str, str]:
        return {"pitstop-incident": incident_id, "pitstop-step": str(step)}

    def find(self, incident_id: str, step: int) -> str | None:
        """An execution already started for this step (a starter that crashed before recording it)."""
        flt = f'labels.pitstop-incident="{incident_id}" AND labels.pitstop-step="{step}"'
        for ex in self.client.list_executions(request={"parent": self.parent, "filter": flt}):
            return str(ex.name)
        return None

    def start(self, incident_id: str, step: int, argument: Mapping[str, object]) -> str:
        execution = executions_v1.Execution(
            argument=json.dumps(argument), labels=self.labels(incident_id, step)
        )
        ex = self.client.create_execution(parent=self.parent, execution=execution)
        return str(ex.name)

    def get(self, name: str) -> ExecutionStatus:
        """The execution's state (``NOT_FOUND`` if Workflows has none by that name)."""
        try:
            ex = self.client.get_execution(name=name)
        except gexc.NotFound:
            return ExecutionStatus(name, NOT_FOUND)
        state = ex.state.name if hasattr(ex.state, "name") else str(ex.state)
        error = (ex.error.payload or ex.error.context or None) if ex.error else None
        return ExecutionStatus(name, state, _epoch(ex.start_time), _epoch(ex.end_time), error)

    def cancel(self, name: str) -> bool:
        """Cancel a running execution; False if it had already ended or does not exist."""
        try:
            ex = self.client.cancel_execution(name=name)
        except (gexc.NotFound, gexc.FailedPrecondition):
            return False
        return bool(ex.state.name == "CANCELLED") if hasattr(ex.state, "name") else True
