"""Starting remediation executions with google-cloud-workflows' ExecutionsClient.

The endpoint is configurable so that the local Workflows runner, which serves the same
gRPC Executions API, is driven by exactly this code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import grpc
from google.auth.credentials import AnonymousCredentials
from google.cloud.workflows import executions_v1
from google.cloud.workflows.executions_v1.services.executions.transports import ExecutionsGrpcTransport


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

    def start(self, incident_id: str, step: int, argument: Mapping[str, Any]) -> str:
        execution = executions_v1.Execution(
            argument=json.dumps(argument), labels=self.labels(incident_id, step)
        )
        ex = self.client.create_execution(parent=self.parent, execution=execution)
        return str(ex.name)
