"""Who can write each input Pitstop reads (issue 35): ``pitstop doctor --project`` names, per input of
the threat model (schemas/inputs.yaml), every principal whose role carries the input's write
permission, on the project, inherited from its folders and organization, or on the input's topic.

The pure judgement (core/writers.py) runs on the shipped role table (schemas/iam-roles.yaml); the
reading runs the real gcloud against the recording fake of Google's APIs (local/fake_gcp.py), which
answers Resource Manager's getAncestry and getIamPolicy of projects, folders and organizations,
IAM's roles.get of custom roles, and (in front of the Pub/Sub emulator) each topic's getIamPolicy.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from pitstop.core import inputs
from pitstop.core.writers import InputWriters, Policy, Roles, input_writers, own_members
from pitstop.local import fake_gcp
from pitstop.tools import deploy, exposure
from tests.tools.test_deploy_emulator import _env_at

FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"
PROJECT = "train-prod"
COMPUTE_SA = f"serviceAccount:{fake_gcp.PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
VM_SA = f"serviceAccount:trainer@{PROJECT}.iam.gserviceaccount.com"
NODE_SA = f"serviceAccount:gke-nodes@{PROJECT}.iam.gserviceaccount.com"
OPS = "group:ml-ops@example.com"
INGEST = f"serviceAccount:{deploy.sa_email('ingest', PROJECT)}"
MONITORING_AGENT = (
    f"serviceAccount:service-{fake_gcp.PROJECT_NUMBER}@gcp-sa-monitoring-notification.iam.gserviceaccount.com"
)
FORGER_ROLE = f"projects/{PROJECT}/roles/metricsAndMore"


def _input(iid: str) -> inputs.Input:
    return next(i for i in inputs.model()["inputs"] if i["id"] == iid)


def _writers(
    iid: str, project: list[Policy], topics: dict[str, Policy], custom: dict[str, Any]
) -> InputWriters:
    doc = exposure.role_doc()
    own = own_members(doc.own, PROJECT)
    return input_writers(_input(iid), project, topics, Roles(doc.predefined, custom), own, ["train"])


def test_each_input_names_its_writers_inherited_roles_and_custom_ones_included() -> None:
    project = [
        Policy(
            f"project {PROJECT}",
            {"bindings": [{"role": "roles/logging.logWriter", "members": [VM_SA, INGEST]}]},
        ),
        Policy("folder 123 (inherited)", {"bindings": [{"role": "roles/editor", "members": [COMPUTE_SA]}]}),
        Policy(
            "organization 9 (inherited)",
            {"bindings": [{"role": "roles/container.defaultNodeServiceAccount", "members": [NODE_SA]}]},
        ),
    ]
    alerts = Policy(
        "topic pitstop-alerts",
        {
            "bindings": [
                {"role": "roles/pubsub.publisher", "members": [MONITORING_AGENT]},
                {"role": FORGER_ROLE, "members": [OPS], "condition": {"expression": "true"}},
            ]
        },
    )
    custom = {FORGER_ROLE: frozenset({"pubsub.topics.publish", "monitoring.timeSeries.get"})}
    kernel = _writers("log-kernel-journal", project, {}, custom)
    assert {(w.member, w.where, w.own) for w in kernel.writers} == {
        (VM_SA, f"project {PROJECT}", False),
        (INGEST, f"project {PROJECT}", True),  # Pitstop's own: listed, no finding
        (COMPUTE_SA, "folder 123 (inherited)", False),  # Editor on the folder: writes logs here too
        (NODE_SA, "organization 9 (inherited)", False),  # a GKE node's account, granted on the org
    }
    heartbeat = _writers("metric-heartbeat", project, {}, custom)
    assert {w.member for w in heartbeat.others} == {COMPUTE_SA, NODE_SA}  # monitoring.timeSeries.create
    topic = _writers("topic-alerts", project, {"pitstop-alerts": alerts}, custom)
    assert {(w.member, w.role, w.conditional) for w in topic.others} == {
        (COMPUTE_SA, "roles/editor", False),
        (OPS, FORGER_ROLE, True),  # a custom role that carries pubsub.topics.publish, under a condition
    }
    assert [w.member for w in topic.writers if w.own] == [MONITORING_AGENT]
    unreadable = _writers("topic-alerts", project, {"pitstop-alerts": alerts}, {FORGER_ROLE: None})
    assert unreadable.unread_roles == (FORGER_ROLE,)  # named: the doctor cannot say what it carries
    conditions = _writers("k8s-node-conditions", project, {}, custom)
    assert conditions.writers == () and "root (node)" in conditions.beyond_iam


def test_every_write_permission_of_the_model_has_roles_and_a_source() -> None:
    model, doc = inputs.model(), exposure.role_doc()
    iam = {
        w["permission"] for i in model["inputs"] for w in i["writes"] if w["scope"] in ("project", "topic")
    }
    assert iam <= set(doc.predefined) and iam <= set(model["permissions"])
    assert all(len(doc.predefined[p]) >= 3 and "roles/owner" in doc.predefined[p] for p in iam)


@pytest.mark.emulator
@pytest.mark.timeout(900)  # some twenty runs of the real gcloud
def test_doctor_reads_the_project_its_ancestors_topics_and_custom_roles_through_gcloud(
    pubsub_host: str, tmp_path: Path
) -> None:
    fake = fake_gcp.FakeGcp(pubsub_upstream=pubsub_host)
    server = fake_gcp.serve(fake)
    try:
        project = f"exp-{uuid.uuid4().hex[:8]}"
        crm = "cloudresourcemanager"
        fake.resources[(crm, f"projects/{project}")] = {"projectId": project}
        fake.ancestors[project] = [("folder", "123"), ("organization", "9")]
        fake.policies[(crm, f"projects/{project}")] = {
            "bindings": [{"role": "roles/logging.logWriter", "members": [VM_SA]}]
        }
        fake.policies[(crm, "folders/123")] = {
            "bindings": [{"role": "roles/editor", "members": [COMPUTE_SA]}]
        }
        fake.policies[(crm, "organizations/9")] = {
            "bindings": [{"role": "organizations/9/roles/pusher", "members": [OPS]}]
        }
        fake.resources[("iam", "organizations/9/roles/pusher")] = {
            "name": "organizations/9/roles/pusher",
            "includedPermissions": ["pubsub.topics.publish"],
        }
        for topic in ("pitstop-events", "pitstop-notifications"):  # deployed; the others are not
            assert fake.handle("PUT", f"/pubsub/v1/projects/{project}/topics/{topic}", {})[0] == 200
        fake.policies[("pubsub", f"projects/{project}/topics/pitstop-events")] = {
            "bindings": [{"role": "roles/pubsub.publisher", "members": [NODE_SA]}]
        }
        env = _env_at(fake, tmp_path)

        def gcloud(argv: list[str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["gcloud", *argv], capture_output=True, text=True, env=env, timeout=180)

        cli = [sys.executable, "-m", "pitstop.tools.cli", "doctor", "--project", project]
        run = subprocess.run(
            cli, capture_output=True, text=True, timeout=600, env={**env, "PYTHONPATH": str(FUNCTIONS)}
        )
        assert run.returncode == 1, run.stderr  # writers beyond Pitstop's own: a person should look
        lines = run.stdout.splitlines()
        section = _section(lines, "topic-events")
        assert (
            f"  writer {NODE_SA}: pubsub.topics.publish by roles/pubsub.publisher on topic pitstop-events"
            in section
        )
        assert (
            f"  writer {COMPUTE_SA}: pubsub.topics.publish by roles/editor on folder 123 (inherited)"
            in section
        )
        pusher = "organizations/9/roles/pusher on organization 9 (inherited)"
        assert f"  writer {OPS}: pubsub.topics.publish by {pusher}" in section
        assert VM_SA not in "".join(section)  # it writes logs, it publishes nothing
        assert (
            f"  writer {VM_SA}: logging.logEntries.create by roles/logging.logWriter on project {project}"
            in (_section(lines, "log-kernel-journal"))
        )
        asked = {(c.api, c.verb, c.path) for c in fake.calls}
        assert {(crm, "getAncestry", f"projects/{project}"), (crm, "getIamPolicy", "folders/123")} <= asked
        assert {
            (crm, "getIamPolicy", "organizations/9"),
            ("iam", "", "organizations/9/roles/pusher"),
        } <= asked
        for key in [(crm, f"projects/{project}"), (crm, "folders/123"), (crm, "organizations/9")]:
            fake.policies[key] = {"bindings": []}
        fake.policies.pop(("pubsub", f"projects/{project}/topics/pitstop-events"))
        quiet: list[str] = []
        assert exposure.report(project, {}, gcloud, quiet.append) == 0
        assert quiet == [f"ok       only Pitstop's own identities can write its inputs in {project}"]
    finally:
        server.shutdown()


def _section(lines: list[str], iid: str) -> list[str]:
    """The doctor's lines about one input: its header and what follows until the next input."""
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"input    {iid}:"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("input ")), len(lines))
    return lines[start:end]
