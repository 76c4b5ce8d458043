"""Cloud Monitoring: Pitstop's custom metrics (one point per series per notification), the
DCGM readings of a degraded node's peers, and the series training jobs write (heartbeats and
checkpoints, docs/telemetry.md).

The client library is imported on first use, so modules that only name the type (the
notify service) load without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict


class MetricsWriter:
    """Custom metrics through google-cloud-monitoring (endpoint configurable for a local server)."""

    PREFIX = "custom.googleapis.com/pitstop"

    def __init__(self, project: str, endpoint: str | None = None) -> None:
        from google.cloud import monitoring_v3

        self.mv3 = monitoring_v3
        self.client = _client(endpoint)
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

    def write(self, n: Mapping[str, object], now: float) -> int:
        """The points one notification counts (a notification as published: read, its types checked)."""
        got = n.get("incident")
        inc: Mapping[str, object] = got if isinstance(got, Mapping) else {}
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
            durations = n.get("durations_s")
            resolved = durations.get("resolved") if isinstance(durations, Mapping) else None
            if isinstance(resolved, int | float) and not isinstance(resolved, bool):
                series.append(
                    self._series("time_to_remediate_s", {"action": base["action"]}, float(resolved), now)
                )
        if series:  # one request, one point per series: a retry cannot count part of it twice
            self.client.create_time_series(name=f"projects/{self.project}", time_series=series)
        return len(series)


def _client(endpoint: str | None) -> Any:
    """A MetricServiceClient, over an insecure channel to a local server when ``endpoint`` is set."""
    from google.cloud import monitoring_v3

    if not endpoint:
        return monitoring_v3.MetricServiceClient()
    import grpc
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.monitoring_v3.services.metric_service.transports import MetricServiceGrpcTransport

    anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
    transport = MetricServiceGrpcTransport(channel=grpc.insecure_channel(endpoint), credentials=anonymous)
    return monitoring_v3.MetricServiceClient(transport=transport)


READ_TIMEOUT_S, READ_DEADLINE_S = 5.0, 15.0  # one attempt, and all of them (actuate answers within 120 s)


def _read_retry() -> Any:
    from google.api_core import exceptions, retry

    transient = retry.if_exception_type(exceptions.ServiceUnavailable, exceptions.DeadlineExceeded)
    return retry.Retry(predicate=transient, initial=0.5, maximum=4.0, timeout=READ_DEADLINE_S)


ONE_OF_MAX = 100  # names per filter's one_of(...): a job's nodes are read in chunks of this many


class TelemetryReader:
    """The DCGM metrics a degraded alert fired on, read for a job's nodes (timeSeries.list).

    The same metric, filter and window as the alert policy (schemas/xid-policy.yaml ``degraded``),
    aligned over the whole window and grouped by the VM's name, so each node gets one value: the
    share of the time it was throttled (ALIGN_RATE of throttled seconds) or the errors it counted
    (ALIGN_DELTA). Needs roles/monitoring.viewer on the project. The client is made on first use:
    only a degraded incident's comparison needs it (and its ~40 MiB).
    """

    def __init__(self, endpoint: str | None = None) -> None:
        self.endpoint = endpoint
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = _client(self.endpoint)
        return self._client

    def node_values(
        self, project: str, rule: Any, nodes: Sequence[str], now: float
    ) -> dict[str, float | None]:
        out: dict[str, float | None] = dict.fromkeys(nodes)
        window = max(60, int(rule.hold_s))
        for i in range(0, len(nodes), ONE_OF_MAX):
            names = ", ".join(f'"{n}"' for n in nodes[i : i + ONE_OF_MAX])
            request = {
                "name": f"projects/{project}",
                "filter": (
                    f'metric.type="{rule.metric}" AND resource.type="gce_instance" AND {rule.filter}'
                    f" AND metadata.system_labels.name=one_of({names})"
                ),
                "interval": {"end_time": {"seconds": int(now)}, "start_time": {"seconds": int(now) - window}},
                "aggregation": {
                    "alignment_period": {"seconds": window},
                    "per_series_aligner": rule.aligner,
                    "cross_series_reducer": "REDUCE_MAX",
                    "group_by_fields": ["metadata.system_labels.name"],
                },
            }
            # bounded: a comparison that cannot read in READ_DEADLINE_S goes on the alert alone
            pages = self.client.list_time_series(request=request, retry=_read_retry(), timeout=READ_TIMEOUT_S)
            for ts in pages:
                name = dict(ts.metadata.system_labels).get("name")
                if name in out and ts.points:
                    v = ts.points[0].value
                    out[str(name)] = float(v.double_value if "double_value" in v else v.int64_value)
        return out

    def heartbeat_points(self, project: str, cluster: str, job: str, start: float, end: float) -> list[float]:
        """When each point of the job's heartbeat series was written (its ``end_time``, epoch s),
        from ``start`` to ``end``, as Cloud Monitoring holds it: Pitstop's own reading of the series,
        not the alert's word (core/localise.heartbeat_gate). At most MAX_POINTS, oldest first."""
        request = {
            "name": f"projects/{project}",
            "filter": (
                f'metric.type="{HEARTBEAT_METRIC}" AND resource.type="global"'
                f' AND metric.labels.cluster="{_quoted(cluster)}" AND metric.labels.job="{_quoted(job)}"'
            ),
            "interval": {"end_time": {"seconds": int(end)}, "start_time": {"seconds": int(start)}},
            "view": "FULL",
        }
        pages = self.client.list_time_series(request=request, retry=_read_retry(), timeout=READ_TIMEOUT_S)
        out: list[float] = []
        for ts in pages:
            for p in ts.points:
                t = p.interval.end_time
                out.append(t.timestamp() if hasattr(t, "timestamp") else float(t.seconds))
                if len(out) >= MAX_POINTS:
                    return sorted(out)
        return sorted(out)

    def checkpoint_series(self, project: str, start: float, end: float) -> list[CheckpointSeries]:
        """Every job's checkpoint series from ``start`` to ``end`` (docs/telemetry.md): one point per
        checkpoint the job wrote, at its end, valued the seconds the write took; labels ``cluster``,
        ``job`` and ``nodes``. At most MAX_POINTS points in all."""
        request = {
            "name": f"projects/{project}",
            "filter": f'metric.type="{CHECKPOINT_METRIC}" AND resource.type="global"',
            "interval": {"end_time": {"seconds": int(end)}, "start_time": {"seconds": int(start)}},
            "view": "FULL",
        }
        pages = self.client.list_time_series(request=request, retry=_read_retry(), timeout=READ_TIMEOUT_S)
        out: list[CheckpointSeries] = []
        left = MAX_POINTS
        for ts in pages:
            points = [(_end(p), _number(p.value)) for p in list(ts.points)[:left]]
            left -= len(points)
            out.append({"labels": dict(ts.metric.labels), "points": sorted(points)})
            if left <= 0:
                break
        return out


HEARTBEAT_METRIC = (
    "custom.googleapis.com/pitstop/job/heartbeat"  # infra/monitoring/telemetry/job-heartbeat.json
)
CHECKPOINT_METRIC = "custom.googleapis.com/pitstop/job/checkpoint"  # docs/telemetry.md
MAX_POINTS = 10_000  # a job beating every second for close to three hours


def _quoted(value: str) -> str:
    """A label value inside a filter's double quotes (job ids are validated names; escaped anyway)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


class CheckpointSeries(TypedDict):
    """One job's checkpoint series as read: its labels, and (end time epoch s, write seconds) points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


def _end(p: Any) -> float:
    t = p.interval.end_time
    return float(t.timestamp() if hasattr(t, "timestamp") else t.seconds)


def _number(v: Any) -> float:
    return float(v.double_value if "double_value" in v else v.int64_value)


MONITORING_API = "https://monitoring.googleapis.com/"  # v3 paths under it


class AlertConfig:
    """Alert policies and notification channels through Monitoring's v3 REST API, for deploy.

    gcloud has commands for them only in alpha and beta, and google-cloud-monitoring (2.32) speaks
    only gRPC; JSON over HTTPS reads the same files deploy keeps (infra/monitoring) and reaches a
    local fake the way gcloud does (its API endpoint override).
    """

    def __init__(self, token: str, endpoint: str | None = None) -> None:
        self.token = token
        self.base = (endpoint or MONITORING_API).rstrip("/") + "/v3/"

    def call(self, method: str, path: str, body: Mapping[str, object] | None = None) -> dict[str, Any]:
        """One request (``path`` under v3/); an HTTP error raises urllib's HTTPError."""
        import json
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        url = self.base + path  # https, or the http of a local fake that gcloud's override names
        req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310
            raw = resp.read()
        got: dict[str, Any] = json.loads(raw) if raw else {}
        return got

    def names(self, collection: str, display_name: str) -> list[str]:
        """The names of a collection's members with this display name, every page read
        (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies/list)."""
        from urllib.parse import quote

        key, out, page = collection.rsplit("/", 1)[-1], list[str](), ""
        while True:
            got = self.call("GET", collection + (f"?pageToken={quote(page)}" if page else ""))
            out += [x["name"] for x in got.get(key, []) if x.get("displayName") == display_name]
            page = got.get("nextPageToken", "")
            if not page:
                return out
