"""The Workflows Executions gRPC API, served locally for the real ExecutionsClient.

grpcio's generic handlers with the client package's own message types. What runs an
execution is pluggable (``runner``): the local Workflows runner in the stack, or nothing
(executions stay ACTIVE) where a test only needs the API.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import NoReturn, cast

import grpc
from google.cloud.workflows.executions_v1.types import executions as t
from google.protobuf import timestamp_pb2

SERVICE = "google.cloud.workflows.executions.v1.Executions"
_PARENT = re.compile(r"projects/[^/]+/locations/[^/]+/workflows/[^/]+")
_LABEL_TERM = re.compile(r'\s*labels\.([a-z][-_a-z0-9]*)\s*=\s*"([^"]*)"\s*')

Runner = Callable[[str, str, dict[str, str]], tuple[str, str | None, str | None]]
"""(execution name, argument JSON, labels) -> (state, result JSON, error payload)."""


@dataclass
class Record:
    execution: t.Execution
    labels: dict[str, str] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)


def _now() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


def _not_found(ctx: grpc.ServicerContext, name: str) -> NoReturn:
    ctx.abort(grpc.StatusCode.NOT_FOUND, f"Resource '{name}' was not found")
    raise AssertionError("abort returned")


def parse_label_filter(flt: str) -> dict[str, str]:
    """The filter subset Pitstop uses: ``labels.k="v" AND labels.k2="v2"``; anything else is refused."""
    out: dict[str, str] = {}
    for term in flt.split(" AND "):
        m = _LABEL_TERM.fullmatch(term)
        if m is None:
            raise ValueError(f"unsupported filter term {term!r}")
        out[m.group(1)] = m.group(2)
    return out


class ExecutionsService:
    def __init__(self, runner: Runner | None = None, workers: int = 8) -> None:
        self.runner = runner
        self.records: dict[str, Record] = {}
        self._lock = threading.Lock()
        self._pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wf-exec")
        self.created = 0

    # -- RPCs ----------------------------------------------------------------------

    def create(self, req: t.CreateExecutionRequest, ctx: grpc.ServicerContext) -> t.Execution:
        if not _PARENT.fullmatch(req.parent):
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid parent {req.parent!r}")
        name = f"{req.parent}/executions/{uuid.uuid4()}"
        ex = t.Execution(
            name=name,
            argument=req.execution.argument or "{}",
            start_time=_now(),
            state=t.Execution.State.ACTIVE,
            labels=dict(req.execution.labels),
        )
        rec = Record(ex, dict(req.execution.labels))
        with self._lock:
            self.records[name] = rec
            self.created += 1
        if self.runner is not None:
            self._pool.submit(self._run, rec)
        return ex

    def get(self, req: t.GetExecutionRequest, ctx: grpc.ServicerContext) -> t.Execution:
        rec = self.records.get(req.name)
        if rec is None:
            _not_found(ctx, req.name)
        return rec.execution

    def list(self, req: t.ListExecutionsRequest, ctx: grpc.ServicerContext) -> t.ListExecutionsResponse:
        try:
            want = parse_label_filter(req.filter) if req.filter else {}
        except ValueError as exc:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self._lock:
            recs = [r for n, r in self.records.items() if n.startswith(req.parent + "/executions/")]
        hits = [r.execution for r in recs if all(r.labels.get(k) == v for k, v in want.items())]
        return t.ListExecutionsResponse(executions=hits)

    def cancel(self, req: t.CancelExecutionRequest, ctx: grpc.ServicerContext) -> t.Execution:
        rec = self.records.get(req.name)
        if rec is None:
            _not_found(ctx, req.name)
        if rec.execution.state == t.Execution.State.ACTIVE:
            rec.execution.state = t.Execution.State.CANCELLED  # type: ignore[assignment]
            rec.execution.end_time = _now()
            rec.done.set()
        return rec.execution

    # -- running -------------------------------------------------------------------

    def _run(self, rec: Record) -> None:
        assert self.runner is not None
        try:
            state, result, error = self.runner(rec.execution.name, rec.execution.argument, rec.labels)
        except Exception as exc:  # the runner's own failure is an execution failure, not a crash
            state, result, error = "FAILED", None, repr(exc)
        ex = rec.execution
        if ex.state == t.Execution.State.ACTIVE:
            ex.state = cast(t.Execution.State, t.Execution.State.__members__[state])
            if result is not None:
                ex.result = result
            if error is not None:
                ex.error = t.Execution.Error(payload=error, context=error)
            ex.end_time = _now()
        rec.done.set()

    def finish(self, name: str, state: str, error: str | None = None) -> None:
        """End an execution from outside (a crashed runner, a test): what GetExecution then answers."""
        rec = self.records[name]
        rec.execution.state = cast(t.Execution.State, t.Execution.State.__members__[state])
        if error is not None:
            rec.execution.error = t.Execution.Error(payload=error, context=error)
        rec.execution.end_time = _now()
        rec.done.set()

    def wait_all(self, timeout: float) -> bool:
        return all(r.done.wait(timeout) for r in list(self.records.values()))


def serve(service: ExecutionsService, host: str = "127.0.0.1", port: int = 0) -> tuple[grpc.Server, int]:
    handlers: dict[str, grpc.RpcMethodHandler] = {
        "CreateExecution": grpc.unary_unary_rpc_method_handler(
            service.create, t.CreateExecutionRequest.deserialize, t.Execution.serialize
        ),
        "GetExecution": grpc.unary_unary_rpc_method_handler(
            service.get, t.GetExecutionRequest.deserialize, t.Execution.serialize
        ),
        "ListExecutions": grpc.unary_unary_rpc_method_handler(
            service.list, t.ListExecutionsRequest.deserialize, t.ListExecutionsResponse.serialize
        ),
        "CancelExecution": grpc.unary_unary_rpc_method_handler(
            service.cancel, t.CancelExecutionRequest.deserialize, t.Execution.serialize
        ),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, bound
