"""Pages are never lost: the outbox on the Firestore and Pub/Sub emulators.

A page is recorded in the transaction of the decision that causes it and published after the
commit; actuate's notifications are recorded, then published. A publish that fails (or a
publisher that dies) leaves the entry unsent, and the sweep publishes it. Notify keys its
ledger by the entry's deterministic id, so a notification published twice is posted once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

import pytest
from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.pubsub_v1 import SubscriberClient

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.pubsub import Notifier
from pitstop.adapters.step_records import FirestoreStepStore
from pitstop.core import policy
from pitstop.core.domain import Notice
from pitstop.plugins.channels import Http
from pitstop.plugins.channels.webhook import Webhook
from pitstop.services.actuate import Actuator
from pitstop.services.ingest import Ingest
from pitstop.services.notify import Notify
from pitstop.services.sweep import Sweep
from tests.helpers import RecordingTopic, ops_agent_entry

pytestmark = pytest.mark.emulator

T0 = 1_800_000_000.0
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
CLUSTER = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-node-*"}}


class Crash(BaseException):
    """The function instance dies (scale-in, OOM) between the commit and the publish."""


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Flaky:
    """A publisher whose next ``failures`` publishes fail (Pub/Sub unavailable), then work."""

    def __init__(self, inner: Any, failures: int = 1, error: BaseException | None = None) -> None:
        self.inner, self.failures = inner, failures
        self.error = error or gexc.ServiceUnavailable("pubsub unavailable")  # type: ignore[no-untyped-call]
        self.attempts = 0

    def publish(self, notification: Mapping[str, Any]) -> str:
        self.attempts += 1
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        message_id: str = self.inner.publish(notification)
        return message_id


Recorder = RecordingTopic


def _policy() -> policy.Policy:
    return policy.from_doc({"mode": "enforce", "clusters": [CLUSTER]})  # one node in remediation at a time


def _entry(node: str, n: int) -> dict[str, Any]:
    e = ops_agent_entry(XID79, instance=node, insert_id=f"{node}-{n}")
    e["timestamp"] = "2027-01-15T08:00:00Z"
    return e


def _deliver(ing: Ingest, entry: dict[str, Any]) -> str:
    """As Pub/Sub does: a delivery that raises is delivered again."""
    for attempt in range(3):
        try:
            return ing.handle_payload(entry).result
        except Exception:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _pull(sub: SubscriberClient, project: str, expect: int) -> list[tuple[str, dict[str, Any]]]:
    """(message id, notification) of what is on the topic: ``expect`` messages, then whatever else came."""
    path, got = sub.subscription_path(project, "pull"), list[tuple[str, dict[str, Any]]]()
    for _ in range(5):
        wait = 10 if len(got) < expect else 2  # nothing more expected: a short look for extras
        resp = sub.pull(subscription=path, max_messages=20, timeout=wait)
        if resp.received_messages:
            sub.acknowledge(subscription=path, ack_ids=[m.ack_id for m in resp.received_messages])
        got += [(m.message.message_id, json.loads(m.message.data)) for m in resp.received_messages]
        if len(got) >= expect and not resp.received_messages:
            break
    return got


def _posted(fs: firestore.Client, messages: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Run notify over the messages; what it posted to the webhook."""
    posts: list[dict[str, Any]] = []

    def hook(url: str, body: Mapping[str, Any]) -> int:
        posts.append(dict(body))
        return 200

    ledger = FirestoreStepStore(fs.collection("pitstop_notifications"))
    svc = Notify([Webhook("https://chat.example/hook", "chat", Http(hook))], None, ledger)
    for message_id, n in messages:
        svc.handle(n, message_id)
    return posts


def _outbox(fs: firestore.Client) -> list[dict[str, Any]]:
    return [d for d in (s.to_dict() for s in fs.collection("pitstop_outbox").stream()) if d]


def test_a_page_whose_publish_failed_is_published_by_the_sweep(
    fs_client: firestore.Client, notifications: tuple[str, str, SubscriberClient]
) -> None:
    project, topic, sub = notifications
    notifier = Flaky(Notifier(project, topic))
    ing = Ingest(_policy(), IncidentStore(fs_client, "pitstop"), None, notifier, clock=Clock())
    assert _deliver(ing, _entry("a3-node-101", 1)) == "opened"
    assert _deliver(ing, _entry("a3-node-102", 1)) == "held"  # the budget is full: page a human
    assert notifier.attempts == 1 and _pull(sub, project, 0) == []  # that publish failed
    assert Sweep(ing).run()["republished"] == 1
    messages = _pull(sub, project, 1)
    assert [n["kind"] for _, n in messages] == ["page"]
    page = messages[0][1]
    assert "cluster-train" in page["summary"] and page["incident"]["state"] == "HELD"
    assert page["id"].startswith(f"page-{page['incident']['id']}-")
    assert len(_posted(fs_client, messages)) == 1
    assert Sweep(ing).run()["republished"] == 0  # marked sent
    assert _pull(sub, project, 0) == []


def test_the_page_commits_with_its_decision_and_outlives_a_dead_publisher(
    fs_client: firestore.Client,
) -> None:
    topic = Recorder()
    notifier = Flaky(topic, error=Crash())
    ing = Ingest(_policy(), IncidentStore(fs_client, "pitstop"), None, notifier, clock=Clock())
    assert _deliver(ing, _entry("a3-node-111", 1)) == "opened"
    assert _outbox(fs_client) == []  # nothing to announce
    with pytest.raises(Crash):
        ing.handle_payload(_entry("a3-node-112", 1))  # committed, then died before publishing
    (entry,) = _outbox(fs_client)
    held = ing.store.get(entry["notification"]["incident"]["id"])
    assert held is not None and held["state"] == "HELD"
    assert entry["sent"] is False and entry["notification"]["kind"] == "page"
    assert _deliver(ing, _entry("a3-node-112", 1)) == "duplicate"  # Pub/Sub redelivers: nothing new
    outbox = ing.launcher.outbox
    assert outbox is not None
    assert outbox.publish_pending(entry["created_at"]) == 0  # its publisher may still be on its way
    assert outbox.publish_pending(entry["created_at"] + outbox.grace_s + 1) == 1
    assert [n["id"] for n in topic.published] == [entry["id"]]
    assert _outbox(fs_client)[0]["sent"] is True


def test_actuate_notification_survives_a_failed_publish(
    fs_client: firestore.Client, notifications: tuple[str, str, SubscriberClient]
) -> None:
    project, topic, sub = notifications
    clock, pol = Clock(), _policy()
    ing = Ingest(pol, IncidentStore(fs_client, "pitstop"), None, Notifier(project, topic), clock=clock)
    out = ing.handle_payload(_entry("a3-node-121", 1))
    assert out.result == "opened" and out.incident is not None
    iid = out.incident["id"]
    notifier = Flaky(Notifier(project, topic))
    act = Actuator(pol, ing.store, cast(ComputeAdapter, None), {}, notifier, None, clock=clock)
    body, status = act.handle({"op": "close", "incident": iid, "step": 1})
    assert status == 200 and body["outcome"] == "resolved"  # remediation is done whatever the topic does
    assert _pull(sub, project, 0) == []
    assert Sweep(ing).run()["republished"] == 1
    messages = _pull(sub, project, 1)
    assert [(n["kind"], n["incident"]["id"], n["incident"]["state"]) for _, n in messages] == [
        ("incident", iid, "RESOLVED")
    ]
    assert act.handle({"op": "close", "incident": iid, "step": 1})[0]["replayed"] is True
    assert _pull(sub, project, 0) == []


def test_publish_pending_waits_out_the_grace_and_sends_each_entry_once(fs_client: firestore.Client) -> None:
    from pitstop.core.store import outbox_entry
    from pitstop.services.outbox import Outbox

    clock, topic = Clock(), Recorder()
    store = IncidentStore(fs_client, "pitstop")
    outbox = Outbox(store, topic, clock=clock, grace_s=10)
    note = cast(Notice, {"id": "incident-i1-abc", "kind": "incident", "severity": "info", "summary": "done"})

    entry = outbox_entry(note, clock.t)  # as a decision's commit records it (core/store.commit_of)
    assert store.outbox.add(entry["id"], entry)["id"] == "incident-i1-abc"
    clock.t += 5
    assert outbox.publish_pending(clock.t) == 0
    clock.t += 6
    assert outbox.publish_pending(clock.t) == 1
    assert outbox.publish_pending(clock.t + 60) == 0
    assert outbox.deliver(note) is True  # a retried caller: already sent, not published again
    assert topic.published == [note]


def test_a_notification_published_twice_is_posted_once(
    fs_client: firestore.Client,
    notifications: tuple[str, str, SubscriberClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Published, but the mark-sent was lost: the sweep publishes it again, notify posts it once."""
    from pitstop.services.outbox import Outbox

    project, topic, sub = notifications
    clock, store = Clock(), IncidentStore(fs_client, "pitstop")
    outbox = Outbox(store, Notifier(project, topic), clock=clock)

    def lost(*args: Any) -> None:
        raise gexc.ServiceUnavailable("firestore unavailable")  # type: ignore[no-untyped-call]

    monkeypatch.setattr(store.outbox, "mark_sent", lost)
    note = cast(
        Notice, {"id": "incident-i2-def", "kind": "incident", "severity": "warning", "summary": "rebooted"}
    )
    assert outbox.deliver(note) is True
    monkeypatch.undo()
    clock.t += outbox.grace_s + 1
    assert outbox.publish_pending(clock.t) == 1
    messages = _pull(sub, project, 2)
    assert len(messages) == 2 and len({mid for mid, _ in messages}) == 2
    assert len(_posted(fs_client, messages)) == 1
