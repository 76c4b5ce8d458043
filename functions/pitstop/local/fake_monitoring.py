"""Cloud Monitoring's CreateTimeSeries over gRPC, served locally for the real MetricServiceClient."""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
from google.cloud.monitoring_v3.types import metric_service
from google.protobuf import empty_pb2

SERVICE = "google.monitoring.v3.MetricService"


class FakeMonitoring:
    def __init__(self) -> None:
        self.series: list[dict[str, Any]] = []

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
