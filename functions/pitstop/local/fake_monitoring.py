"""Cloud Monitoring's CreateTimeSeries and ListTimeSeries over gRPC, served locally for the real
MetricServiceClient.

Points of the job heartbeat metric also go to ``on_heartbeat`` (the stand-in's alerting,
local/telemetry.py, which publishes the heartbeat policy's notifications). The jobs' own series
(heartbeat, checkpoint) are listed back as written. ListTimeSeries answers
the Ops Agent's DCGM metrics from the GPU stand-ins' state (what the alerting evaluates too), one
aligned point per VM named in the filter's ``metadata.system_labels.name=one_of(...)``: the share of
the time throttled (throttle_duration, ALIGN_RATE) or the correctable ECC errors in the window
(ecc_errors, ALIGN_DELTA). Only what actuate asks (adapters/monitoring.TelemetryReader).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import TypedDict

import grpc
from google.cloud.monitoring_v3.types import metric, metric_service
from google.protobuf import empty_pb2

from pitstop.local.gpu_tools.state import GpuEntry, node_state

SERVICE = "google.monitoring.v3.MetricService"
HEARTBEAT = "custom.googleapis.com/pitstop/job/heartbeat"
CHECKPOINT = "custom.googleapis.com/pitstop/job/checkpoint"
RAW = (HEARTBEAT, CHECKPOINT)  # the jobs' own series: listed as written
THROTTLE = "workload.googleapis.com/gpu.dcgm.clock.throttle_duration.time"
ECC = "workload.googleapis.com/gpu.dcgm.ecc_errors"
_TYPE = re.compile(r'metric\.type\s*=\s*"([^"]+)"')
_NAMES = re.compile(r"metadata\.system_labels\.name\s*=\s*one_of\(([^)]*)\)")
_LABEL = re.compile(r'metric\.labels\.([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"]*)"')
GpuState = Callable[[], Mapping[str, GpuEntry]]  # instance name -> its GPU state entry


class Point(TypedDict):
    """One point written (createTimeSeries), as the stand-in keeps it."""

    type: str
    labels: dict[str, str]
    value: float
    resource: str
    at: float  # the point's end_time, epoch s


class FakeMonitoring:
    def __init__(
        self,
        on_heartbeat: Callable[[Mapping[str, str]], None] | None = None,
        gpu_state: GpuState | None = None,
    ) -> None:
        self.series: list[Point] = []
        self.on_heartbeat = on_heartbeat
        self.gpu_state = gpu_state or dict

    def list(
        self, req: metric_service.ListTimeSeriesRequest, ctx: grpc.ServicerContext
    ) -> metric_service.ListTimeSeriesResponse:
        """One aligned point per named VM of a DCGM metric; anything else is refused as unsupported."""
        kind = _TYPE.search(req.filter)
        names = _NAMES.search(req.filter)
        if kind is not None and kind.group(1) in RAW and req.name.startswith("projects/"):
            return self._raw(req, kind.group(1))
        if not req.name.startswith("projects/") or kind is None or names is None:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "filter needs metric.type and a name one_of(...)")
            raise AssertionError("unreachable: abort raises")
        metric_type = kind.group(1)
        if metric_type not in (THROTTLE, ECC):
            ctx.abort(grpc.StatusCode.UNIMPLEMENTED, f"the stand-in serves no {metric_type}")
        period = float(req.aggregation.alignment_period.total_seconds() or 60)
        states = self.gpu_state()
        out = metric_service.ListTimeSeriesResponse()
        for name in re.findall(r'"([^"]+)"', names.group(1)):
            st = node_state(name, states.get(name) or {})
            value = st.throttle if metric_type == THROTTLE else float(st.sbe_rate) * period / 3600
            ts = metric.TimeSeries()
            ts.metric.type = metric_type
            ts.resource.type = "gce_instance"
            ts.metadata.system_labels.update({"name": name})
            point = metric.Point(
                {"interval": {"end_time": req.interval.end_time}, "value": {"double_value": value}}
            )
            ts.points = [point]
            out.time_series.append(ts)
        return out

    def _raw(
        self, req: metric_service.ListTimeSeriesRequest, kind: str
    ) -> metric_service.ListTimeSeriesResponse:
        """The points of a job's series written for the filter's ``metric.labels`` within its
        interval (a FULL view), one time series per set of labels, as Cloud Monitoring returns raw
        series (cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.timeSeries/list)."""
        want = dict(_LABEL.findall(req.filter))
        start, end = req.interval.start_time.timestamp(), req.interval.end_time.timestamp()
        groups: dict[tuple[tuple[str, str], ...], list[Point]] = {}
        for p in self.series:
            if (
                p["type"] == kind
                and all(p["labels"].get(k) == v for k, v in want.items())
                and start <= p["at"] <= end
            ):
                groups.setdefault(tuple(sorted(p["labels"].items())), []).append(p)
        out = metric_service.ListTimeSeriesResponse()
        for labels, got in sorted(groups.items()):
            ts = metric.TimeSeries()
            ts.metric.type = kind
            ts.metric.labels.update(dict(labels))
            ts.resource.type = "global"
            ts.points = [
                _point(p) for p in sorted(got, key=lambda p: -p["at"])
            ]  # newest first, as Monitoring
            out.time_series.append(ts)
        return out

    def create(
        self, req: metric_service.CreateTimeSeriesRequest, ctx: grpc.ServicerContext
    ) -> empty_pb2.Empty:
        if not req.name.startswith("projects/"):
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "name must be projects/P")
        for ts in req.time_series:
            if len(ts.points) != 1:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "exactly one point per time series")
            p = ts.points[0]
            value = p.value.int64_value if "int64_value" in p.value else p.value.double_value
            self.series.append(
                {
                    "type": ts.metric.type,
                    "labels": dict(ts.metric.labels),
                    "value": value,
                    "resource": ts.resource.type,
                    "at": p.interval.end_time.timestamp(),
                }
            )
            if ts.metric.type == HEARTBEAT and self.on_heartbeat is not None:
                self.on_heartbeat(dict(ts.metric.labels))
        return empty_pb2.Empty()


def _point(p: Point) -> metric.Point:
    end = {"seconds": int(p["at"]), "nanos": int(p["at"] % 1 * 1e9)}
    v = p["value"]  # the kind it was written as: a heartbeat's INT64 step, a checkpoint's DOUBLE seconds
    value = {"int64_value": v} if isinstance(v, int) else {"double_value": v}
    return metric.Point({"interval": {"end_time": end}, "value": value})


def serve(fake: FakeMonitoring, host: str = "127.0.0.1", port: int = 0) -> tuple[grpc.Server, str]:
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "CreateTimeSeries": grpc.unary_unary_rpc_method_handler(
                fake.create,
                metric_service.CreateTimeSeriesRequest.deserialize,
                empty_pb2.Empty.SerializeToString,
            ),
            "ListTimeSeries": grpc.unary_unary_rpc_method_handler(
                fake.list,
                metric_service.ListTimeSeriesRequest.deserialize,
                metric_service.ListTimeSeriesResponse.serialize,
            ),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, f"{host}:{port}"
