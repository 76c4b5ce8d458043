"""Cloud Monitoring: Pitstop's custom metrics, one point per series per notification.

The client library is imported on first use, so modules that only name the type (the
notify service) load without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class MetricsWriter:
    """Custom metrics through google-cloud-monitoring (endpoint configurable for a local server)."""

    PREFIX = "custom.googleapis.com/pitstop"

    def __init__(self, project: str, endpoint: str | None = None) -> None:
        from google.cloud import monitoring_v3

        self.mv3 = monitoring_v3
        if endpoint:
            import grpc
            from google.auth.credentials import AnonymousCredentials
            from google.cloud.monitoring_v3.services.metric_service.transports import (
                MetricServiceGrpcTransport,
            )

            anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
            transport = MetricServiceGrpcTransport(
                channel=grpc.insecure_channel(endpoint), credentials=anonymous
            )
            self.client = monitoring_v3.MetricServiceClient(transport=transport)
        else:
            self.client = monitoring_v3.MetricServiceClient()
        self.project = project

    def _series(self, metric: str, labels: Mapping[str, str], value: float | int, now: float) -> Any:
        s = self.mv3.TimeSeries()
        s.metric.type = f"{self.PREFIX}/{metric}"
        for k, v in labels.items():
            s.metric.labels[k] = v
        s.resource.type = "global"
        s.resource.labels["project_id"] = self.project
        sec = int(now)
        val = {"int64_value": value} if isinstance(value, int) else {"double_value": value}
        s.points = [
            self.mv3.Point(
                {"interval": {"end_time": {"seconds": sec, "nanos": int((now - sec) * 1e9)}}, "value": val}
            )
        ]
        return s

    def write(self, n: Mapping[str, Any], now: float) -> int:
        inc = n.get("incident") or {}
        base = {
            "kind": str(inc.get("kind") or "none"),
            "action": str(inc.get("action") or "NONE"),
            "cluster": str(inc.get("cluster") or "none"),
        }
        series = []
        if n.get("kind") == "page":
            series.append(self._series("incidents_held", {"cluster": base["cluster"]}, 1, now))
        elif inc.get("state") == "FAILED":
            series.append(self._series("remediations_failed", base, 1, now))
        elif inc.get("state") == "RESOLVED":
            series.append(self._series("incidents_resolved", base, 1, now))
            resolved = (n.get("durations_s") or {}).get("resolved")
            if resolved is not None:
                series.append(
                    self._series("time_to_remediate_s", {"action": base["action"]}, float(resolved), now)
                )
        if series:  # one request, one point per series: a retry cannot count part of it twice
            self.client.create_time_series(name=f"projects/{self.project}", time_series=series)
        return len(series)
