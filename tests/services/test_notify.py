"""The notify service: metrics before the webhook, neither sink blocking the other, one post per notification.

Real sinks where they can be: the ledger on the Firestore emulator, metrics through the real
MetricServiceClient to the local CreateTimeSeries server; the webhook is a recording function.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc
import pytest
from google.cloud import firestore
from google.cloud.monitoring_v3.types import metric_service
from google.protobuf import empty_pb2

from pitstop.adapters.monitoring import MetricsWriter
from pitstop.adapters.step_records import FirestoreStepStore
from pitstop.core.notifications import sealed
from pitstop.local.fake_monitoring import FakeMonitoring, Point, serve
from pitstop.plugins.channels import Http, Post
from pitstop.plugins.channels.webhook import Webhook as ChatWebhook
from pitstop.services import channels
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

    def __call__(self, url: str, body: Mapping[str, Any]) -> int:
        if self.status < 300:
            self.posts.append(json.loads(json.dumps(body)))
        return self.status


@pytest.fixture
def monitoring() -> Iterator[tuple[Monitoring, MetricsWriter]]:
    fake = Monitoring()
    server, endpoint = serve(fake)
    try:
        yield fake, MetricsWriter("train-prod", endpoint)
    finally:
        server.stop(0)


def _ledger(fs: firestore.Client) -> FirestoreStepStore:
    return FirestoreStepStore(fs.collection("pitstop_notifications"))


def _notify(
    fs: firestore.Client, metrics: MetricsWriter | None, hook: Post, clock: Callable[[], float] = lambda: T0
) -> Notify:
    return Notify([ChatWebhook("https://chat.example/hook", "chat", Http(hook))], metrics, _ledger(fs), clock)


def _failures(fake: FakeMonitoring) -> list[Point]:
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
    keys = {d.id for d in fs_client.collection("pitstop_notifications").stream()}
    assert keys == {"m-6.metrics", "m-6.webhook", "m-7.metrics", "m-7.webhook"}


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

    def slow_post(url: str, body: Mapping[str, Any]) -> int:
        return slow(url, json.dumps(body).encode())

    svc = _notify(fs_client, metrics, slow_post)
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
    svc = _notify(fs_client, metrics, hook, clock=lambda: now[0])
    ref = fs_client.collection("pitstop_notifications").document(f"{note['id']}.webhook")
    dead = {"state": "in_progress", "token": "dead", "owner": "gone", "expires_at": T0 + SINK_CLAIM_S}
    ref.set(dead)  # a delivery that died while posting
    with pytest.raises(SinkBusyError):
        svc.handle(note, "m-20")
    assert hook.posts == []
    now[0] = T0 + SINK_CLAIM_S + 1
    svc.handle(note, "m-21")
    assert len(hook.posts) == 1
    rec = ref.get().to_dict() or {}
    assert rec["state"] == "done" and rec["attempt"] == 2 and rec["token"] != "dead"


# -- PagerDuty Events API v2 (a second channel beside the webhook) ------------------------------


class PagerDutySink:
    """Answers as PagerDuty's /v2/enqueue does: 202 with a status body, 400 for an invalid event."""

    def __init__(self, status: int = 202) -> None:
        self.status, self.events = status, list[dict[str, Any]]()

    def __call__(self, url: str, body: Mapping[str, Any]) -> int:
        assert url == "https://events.pagerduty.com/v2/enqueue"
        if self.status < 300:
            self.events.append(json.loads(json.dumps(body)))
        return self.status


def _both(fs: firestore.Client, hook: Webhook, pd: PagerDutySink) -> Notify:
    env = {
        "PITSTOP_WEBHOOK_URL": "https://chat.example/hook",
        "PITSTOP_PAGERDUTY_ROUTING_KEY": "R0UT1NGKEY0123456789abcdefABCDEF",
    }

    def post(url: str, body: Mapping[str, Any]) -> int:
        return pd(url, body) if "pagerduty" in url else hook(url, body)

    return Notify(channels.configured(env, post), None, _ledger(fs), lambda: T0)


KEY = b"this-deploys-notify-key-0123456789"  # the secret pitstop-notify-key


def _closed(iid: str = "ifailed123") -> dict[str, Any]:
    """The end of FAILED's incident: everything in it is derivable from the incident."""
    return {
        "id": f"incident-{iid}-closed",
        "kind": "incident",
        "severity": "info",
        "summary": "a3-node-007 closed by ops",
        "incident": {**FAILED["incident"], "id": iid, "state": "RESOLVED"},  # type: ignore[dict-item]
    }


def test_a_failure_triggers_one_pagerduty_alert_per_incident_and_its_end_resolves_it(
    fs_client: firestore.Client,
) -> None:
    hook, pd = Webhook(), PagerDutySink()
    svc = _both(fs_client, hook, pd)
    svc.handle(sealed(FAILED, KEY), "m-30")
    svc.handle(sealed(dict(FAILED), KEY), "m-31")  # the outbox published it again: the same id
    svc.handle(sealed(_closed(), KEY), "m-32")
    assert [e["event_action"] for e in pd.events] == ["trigger", "resolve"]
    trigger, resolve = pd.events
    assert trigger["routing_key"] == resolve["routing_key"] == "R0UT1NGKEY0123456789abcdefABCDEF"
    inc: Any = sealed(FAILED, KEY)["incident"]
    assert trigger["dedup_key"] == resolve["dedup_key"] == f"pitstop-{inc['alert_key']}"
    payload = trigger["payload"]
    assert payload["severity"] == "critical" and payload["source"] == "a3-node-007"
    assert payload["summary"] == "Remediation of a3-node-007 FAILED at act"
    assert payload["class"] == "REBOOT_NODE" and payload["component"] == "train"
    assert "payload" not in resolve
    assert len(hook.posts) == 2  # the chat channel hears both, the republished copy once


def test_a_publisher_to_the_topic_can_neither_resolve_a_real_alert_nor_take_a_real_pages_id(
    fs_client: firestore.Client,
) -> None:
    """Issue 35 (low): whoever may publish to pitstop-notifications knows an incident's id (chat
    shows it) and can compute what was derived from it: the PagerDuty dedup key pitstop-<incident>
    and the id of a page still to come. Sealed with the deploy's key, neither is derivable."""
    from pitstop.core.remediation import page_notification

    hook, pd = Webhook(), PagerDutySink()
    svc = _both(fs_client, hook, pd)
    iid = f"i{uuid.uuid4().hex[:9]}"
    svc.handle(sealed({**FAILED, "incident": {**FAILED["incident"], "id": iid}}, KEY), "m-70")  # type: ignore[dict-item]
    svc.handle(_closed(iid), "m-71")  # forged: the end of the real incident, as anyone can write it
    assert [e["event_action"] for e in pd.events] == ["trigger"]  # the real alert stays open
    held: Any = {"id": iid, "node": {"instance": "a3-node-007"}, "state": "HELD", "updated_at": T0}
    coming = page_notification("budget spent: a3-node-007 held", held)
    svc.handle({**coming, "summary": "all clear, nothing to see"}, "m-72")  # its id taken first
    svc.handle(sealed(coming, KEY), "m-73")  # the real page, as Pitstop publishes it
    assert "budget spent: a3-node-007 held" in hook.posts[-1]["text"]
    assert (
        sealed(coming, KEY)["id"] != coming["id"] and sealed(coming, KEY)["id"] == sealed(coming, KEY)["id"]
    )
    real, forged, page = pd.events  # the forged page is an alert of its own, never the incident's
    assert forged["dedup_key"] != real["dedup_key"] == page["dedup_key"]


def test_pagerduty_is_not_woken_for_a_remediation_that_went_well(fs_client: firestore.Client) -> None:
    hook, pd = Webhook(), PagerDutySink()
    done = _both(fs_client, hook, pd).handle(
        {
            "id": "incident-iok1234567-x",
            "kind": "incident",
            "severity": "warning",
            "summary": "a3-node-001: RESET_GPU done; node healthy and back in service.",
            "incident": {"id": "iok1234567", "node": {"instance": "a3-node-001"}, "state": "VERIFYING"},
        },
        "m-40",
    )
    assert pd.events == [] and done["pagerduty"] == {"skipped": "nothing for a person to do"}


def test_a_pagerduty_outage_does_not_silence_the_webhook_and_is_retried_alone(
    fs_client: firestore.Client,
) -> None:
    hook, pd = Webhook(), PagerDutySink(status=503)
    note = {**FAILED, "id": f"incident-pd-{uuid.uuid4().hex[:8]}"}
    with pytest.raises(RuntimeError, match="pagerduty answered 503"):
        _both(fs_client, hook, pd).handle(note, "m-50")
    assert len(hook.posts) == 1
    pd.status = 202
    _both(fs_client, hook, pd).handle(note, "m-51")  # Pub/Sub redelivers
    assert len(hook.posts) == 1 and [e["event_action"] for e in pd.events] == ["trigger"]


def test_an_event_pagerduty_calls_invalid_is_recorded_not_retried_forever(
    fs_client: firestore.Client,
) -> None:
    hook, pd = Webhook(), PagerDutySink(status=400)
    done = _both(fs_client, hook, pd).handle({**FAILED, "id": "incident-bad-event"}, "m-60")
    assert done["pagerduty"] == {"rejected": 400, "event_action": "trigger"}


def test_the_local_pagerduty_endpoint_refuses_what_pagerduty_would() -> None:
    from pitstop.plugins.channels.pagerduty.body import pagerduty_event
    from pitstop.plugins.channels.pagerduty.local import pagerduty_errors

    good = pagerduty_event(FAILED, "R0UT1NGKEY0123456789abcdefABCDEF", "trigger")
    assert pagerduty_errors(good) == []
    assert pagerduty_errors(pagerduty_event(FAILED, "R0UT1NGKEY0123456789abcdefABCDEF", "resolve")) == []
    assert pagerduty_errors({**good, "routing_key": "short"}) == [
        "'routing_key' must be a 32-character integration key"
    ]
    assert "'payload.summary' is missing or blank" in pagerduty_errors(
        {**good, "payload": {**good["payload"], "summary": ""}}
    )
    assert pagerduty_errors({**good, "event_action": "page"})[0].startswith("'event_action' is invalid")
    assert pagerduty_errors("not an event") == ["Event object is invalid"]
