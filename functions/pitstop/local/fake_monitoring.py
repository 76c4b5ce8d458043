"""Cloud Monitoring's CreateTimeSeries over gRPC, served locally for the real MetricServiceClient.

Points of the job heartbeat metric also go to ``on_heartbeat`` (the stand-in's alerting,
local/telemetry.py, which publishes the heartbeat policy's notifications).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

import grpc
from google.cloud.monitoring_v3.types import metric_service
from google.protobuf import empty_pb2

SERVICE = "google.monitoring.v3.MetricService"
HEARTBEAT = "custom.googleapis.com/pitstop/job/heartbeat"


class FakeMonitoring:
    def __init__(self, on_heartbeat: Callable[[Mapping[str, str]], None] | None = None) -> None:
        self.series: list[dict[str, Any]] = []
        self.on_heartbeat = on_heartbeat

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
                }
            )
            if ts.metric.type == HEARTBEAT and self.on_heartbeat is not None:
                self.on_heartbeat(dict(ts.metric.labels))
        return empty_pb2.Empty()


def serve(fake: FakeMonitoring, host: str = "127.0.0.1", port: int = 0) -> tuple[grpc.Server, str]:
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "CreateTimeSeries": grpc.unary_unary_rpc_method_handler(
                fake.create,
                metric_service.CreateTimeSeriesRequest.deserialize,
                empty_pb2.Empty.SerializeToString,
            ),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, f"{host}:{port}"
