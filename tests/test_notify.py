"""The notify service: metrics before the webhook, neither sink blocking the other, one post per notification.

Real sinks where they can be: the ledger on the Firestore emulator, metrics through the real
MetricServiceClient to the local CreateTimeSeries server; the webhook is a recording function.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.cloud import firestore
from google.cloud.monitoring_v3.types import metric_service
from google.protobuf import empty_pb2

from pitstop.adapters.monitoring import MetricsWriter
from pitstop.local.fake_monitoring import FakeMonitoring, serve
from pitstop.services.notify import SINK_CLAIM_S, Notify, SinkBusyError

pytestmark = pytest.mark.emulator

T0 = 1_800_000_000.0
FAILED = {
    "id": "incident-ifailed123-0123456789abcdef",
    "kind": "incident",
    "severity": "critical",
    "summary": "Remediation of a3-node-007 FAILED at act",
    "incident": {
        "id": "ifailed123",
        "node": {"instance": "a3-node-007"},
        "cluster": "train",
        "kind": "gpu_xid",
        "action": "REBOOT_NODE",
        "state": "FAILED",
    },
}


class Monitoring(FakeMonitoring):
    """The local CreateTimeSeries server, refusing every write while ``down``."""

    down = False

    def create(
        self, req: metric_service.CreateTimeSeriesRequest, ctx: grpc.ServicerContext
    ) -> empty_pb2.Empty:
        if self.down:
            ctx.abort(grpc.StatusCode.PERMISSION_DENIED, "monitoring.timeSeries.create denied")
        return super().create(req, ctx)


class Webhook:
    """Records each post; answers ``status`` (503: the chat service is down)."""

    def __init__(self, status: int = 200) -> None:
        self.status, self.posts = status, list[dict[str, Any]]()

    def __call__(self, url: str, data: bytes) -> int:
        if self.status < 300:
            self.posts.append(json.loads(data))
        return self.status


@pytest.fixture
def monitoring() -> Iterator[tuple[Monitoring, MetricsWriter]]:
    fake = Monitoring()
    server, endpoint = serve(fake)
    try:
        yield fake, MetricsWriter("train-prod", endpoint)
    finally:
        server.stop(0)


def _notify(fs: firestore.Client, metrics: MetricsWriter, hook: Webhook) -> Notify:
    ledger = fs.collection("pitstop_notifications")
    return Notify("https://chat.example/hook", "chat", metrics, ledger, post=hook, clock=lambda: T0)


def _failures(fake: FakeMonitoring) -> list[dict[str, Any]]:
    return [s for s in fake.series if s["type"].endswith("/remediations_failed")]


def test_a_dead_webhook_does_not_hide_a_failed_remediation_from_monitoring(
    fs_client: firestore.Client, monitoring: tuple[Monitoring, MetricsWriter]
) -> None:
    fake, metrics = monitoring
    dead = Webhook(status=503)
    with pytest.raises(RuntimeError, match="webhook answered 503"):
        _notify(fs_client, metrics, dead).handle(FAILED, "m-1")
    assert len(_failures(fake)) == 1  # counted although nobody could be told
    assert _failures(fake)[0]["labels"] == {"kind": "gpu_xid", "action": "REBOOT_NODE", "cluster": "train"}
    back = Webhook()
    done = _notify(fs_client, metrics, back).handle(FAILED, "m-1")  # Pub/Sub redelivers, the hook is back
    assert len(back.posts) == 1 and "FAILED" in back.posts[0]["text"]
    assert len(_failures(fake)) == 1  # not counted twice
    assert done["metrics"] and done["webhook"]


def test_a_monitoring_outage_does_not_silence_the_webhook(
    fs_client: firestore.Client,
    monitoring: tuple[Monitoring, MetricsWriter],
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake, metrics = monitoring
    fake.down = True
    hook = Webhook()
    with pytest.raises(RuntimeError, match="metrics not written"):  # redelivered, for the metrics
        _notify(fs_client, metrics, hook).handle(FAILED, "m-2")
    assert len(hook.posts) == 1
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert any(r["severity"] == "ERROR" and r["message"] == "metrics not written" for r in logged)
    fake.down = False
    _notify(fs_client, metrics, hook).handle(FAILED, "m-2")
    assert len(hook.posts) == 1  # the redelivery writes the metrics and does not post again
    assert len(_failures(fake)) == 1


def test_a_republished_notification_is_posted_and_counted_once(
    fs_client: firestore.Client, monitoring: tuple[Monitoring, MetricsWriter]
) -> None:
    """The outbox may publish one notification twice (new message ids): its own id is the ledger key."""
    fake, metrics = monitoring
    hook = Webhook()
    svc = _notify(fs_client, metrics, hook)
    svc.handle(FAILED, "m-3")
    svc.handle(dict(FAILED), "m-4")
    assert len(hook.posts) == 1
    assert len(_failures(fake)) == 1
    other = {**FAILED, "id": "incident-ifailed123-fedcba9876543210"}
    svc.handle(other, "m-5")
    assert len(hook.posts) == 2  # a different notification is posted


def test_a_notification_without_a_usable_id_is_keyed_by_its_message(
    fs_client: firestore.Client, monitoring: tuple[Monitoring, MetricsWriter]
) -> None:
    _, metrics = monitoring
    hook = Webhook()
    svc = _notify(fs_client, metrics, hook)
    for n, mid in (({**FAILED, "id": "../x"}, "m-6"), ({**FAILED, "id": None}, "m-7")):
        svc.handle(n, mid)
        svc.handle(n, mid)
    assert len(hook.posts) == 2
    assert {d.id for d in fs_client.collection("pitstop_notifications").stream()} == {"m-6", "m-7"}


def test_two_deliveries_at_once_post_once(
    fs_client: firestore.Client, monitoring: tuple[Monitoring, MetricsWriter]
) -> None:
    """A redelivery that arrives while the first delivery is still posting finds its claim and is
    redelivered later (SinkBusyError); neither reads "not done yet" and posts a second time."""
    _, metrics = monitoring
    posting, release = threading.Event(), threading.Event()
    posts: list[bytes] = []

    def slow(url: str, data: bytes) -> int:
        posts.append(data)
        posting.set()
        assert release.wait(30)
        return 200

    note = {**FAILED, "id": f"incident-race-{uuid.uuid4().hex[:8]}"}
    svc = _notify(fs_client, metrics, slow)  # type: ignore[arg-type]
    first = threading.Thread(target=svc.handle, args=(note, "m-10"))
    first.start()
    assert posting.wait(30)
    with pytest.raises(SinkBusyError):
        svc.handle(dict(note), "m-11")
    release.set()
    first.join(30)
    done = svc.handle(dict(note), "m-12")  # the redelivery after the first finished: nothing to do
    assert len(posts) == 1 and done["webhook"] and done["metrics"]


def test_a_delivery_that_died_holding_the_webhook_is_taken_over_after_its_claim(
    fs_client: firestore.Client, monitoring: tuple[Monitoring, MetricsWriter]
) -> None:
    _, metrics = monitoring
    note = {**FAILED, "id": f"incident-dead-{uuid.uuid4().hex[:8]}"}
    now = [T0]
    hook = Webhook()
    svc = Notify(
        "https://chat.example/hook",
        "chat",
        metrics,
        fs_client.collection("pitstop_notifications"),
        post=hook,
        clock=lambda: now[0],
    )
    ref = fs_client.collection("pitstop_notifications").document(str(note["id"]))
    ref.set({"webhook_claim": {"token": "dead", "until": T0 + SINK_CLAIM_S}})  # a delivery that died
    with pytest.raises(SinkBusyError):
        svc.handle(note, "m-20")
    assert hook.posts == []
    now[0] = T0 + SINK_CLAIM_S + 1
    svc.handle(note, "m-21")
    assert len(hook.posts) == 1
    assert "webhook_claim" not in (ref.get().to_dict() or {})
