"""The real deploy code and the real gcloud, pointed at the Pub/Sub emulator: it creates, then converges."""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid

import pytest
from google.cloud.pubsub_v1 import PublisherClient, SubscriberClient

from pitstop import deploy

pytestmark = pytest.mark.emulator


def test_pubsub_part_of_the_plan_creates_then_changes_nothing(pubsub_host: str) -> None:
    project = f"dep-{uuid.uuid4().hex[:8]}"
    token = tempfile.NamedTemporaryFile("w", delete=False, suffix=".token")  # noqa: SIM115
    token.write("local-token")
    token.close()
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": tempfile.mkdtemp(prefix="gcloud-"),
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": f"http://{pubsub_host}/",
        "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": token.name,
        "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
    }
    calls: list[list[str]] = []

    def gcloud(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.run(
            ["gcloud", *argv], capture_output=True, text=True, env=env, timeout=120, check=False
        )

    conf = {**deploy.load_config(None), "slurm_clusters": ["train"]}
    steps = [
        s
        for s in deploy.plan(project, "us-central1", conf)
        if s.argv[:2] in (["pubsub", "topics"], ["pubsub", "subscriptions"]) and s.argv[2] == "create"
    ]
    assert len(steps) >= 7
    logs: list[str] = []
    assert deploy.apply(steps, project, "us-central1", gcloud, logs.append) == 0, logs
    pub, sub = PublisherClient(), SubscriberClient()
    topics = {t.name.rsplit("/", 1)[-1] for t in pub.list_topics(project=f"projects/{project}")}
    assert topics == set(deploy.TOPICS) | {"pitstop-slurm-train"}
    subs = {s.name.rsplit("/", 1)[-1] for s in sub.list_subscriptions(project=f"projects/{project}")}
    assert subs == {
        "pitstop-events-dead-inspect",
        "pitstop-notifications-dead-inspect",
        "pitstop-slurm-train-agent",
    }
    agent = sub.get_subscription(subscription=f"projects/{project}/subscriptions/pitstop-slurm-train-agent")
    assert agent.ack_deadline_seconds == 120
    calls.clear()
    logs.clear()
    assert deploy.apply(steps, project, "us-central1", gcloud, logs.append) == 0
    assert all(line.startswith("exists") for line in logs), logs
    assert not any("create" in c for c in calls)  # a second run only looked
