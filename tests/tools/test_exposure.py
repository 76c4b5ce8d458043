"""Who besides Pitstop can publish to its topics or write the logs its sinks select (issue 21): a
finding per principal with the risk in words, read from the IAM policies of the project and of
Pitstop's topics (``pitstop doctor --project``, and the end of ``pitstop deploy``).

The pure judgement runs on the shipped table (infra/exposure.yaml); the reading runs the real gcloud
against the recording fake of Google's APIs (local/fake_gcp.py), whose Pub/Sub IAM sits in front of
the Pub/Sub emulator, as ``pitstop deploy``'s own tests do.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pitstop.core.exposure import ExposureTable, exposure_findings, finding_line
from pitstop.local import fake_gcp
from pitstop.tools import deploy, exposure
from tests.tools.test_deploy_emulator import _env_at

FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"
PROJECT = "train-prod"
COMPUTE_SA = f"serviceAccount:{fake_gcp.PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
VM_SA = f"serviceAccount:trainer@{PROJECT}.iam.gserviceaccount.com"
INGEST = f"serviceAccount:{deploy.sa_email('ingest', PROJECT)}"
LOGGING_AGENT = f"serviceAccount:service-{fake_gcp.PROJECT_NUMBER}@gcp-sa-logging.iam.gserviceaccount.com"
# The project as many are: the default Compute service account is an Editor (Google's default for
# it: cloud.google.com/compute/docs/access/service-accounts#default_service_account), training VMs
# run as an account that may write logs, Pitstop's own accounts hold what infra/iam.yaml grants.
PROJECT_POLICY: dict[str, Any] = {
    "bindings": [
        {"role": "roles/editor", "members": [COMPUTE_SA]},
        {"role": "roles/logging.logWriter", "members": [VM_SA, INGEST]},
        {"role": "roles/datastore.user", "members": [INGEST]},
    ]
}
TOPIC_POLICIES: dict[str, dict[str, Any]] = {
    "pitstop-events": {"bindings": [{"role": "roles/pubsub.publisher", "members": [LOGGING_AGENT]}]},
    "pitstop-notifications": {
        "bindings": [{"role": "roles/pubsub.publisher", "members": [INGEST, "allUsers"]}]
    },
}


def _table() -> ExposureTable:
    return ExposureTable(yaml.safe_load(exposure.EXPOSURE.read_text()), PROJECT)


def test_a_finding_per_principal_beyond_pitstops_own_with_its_risk() -> None:
    found = {f["member"]: f for f in exposure_findings(PROJECT, PROJECT_POLICY, TOPIC_POLICIES, _table())}
    assert set(found) == {COMPUTE_SA, VM_SA, "allUsers"}  # not ingest, not the sink's Logging agent
    editor = found[COMPUTE_SA]
    assert editor["grants"] == [f"roles/editor on project {PROJECT}"]
    assert any("kernel-transport Xid line for any VM" in r for r in editor["risks"])
    assert any("straight to pitstop-events, past the sinks' filters" in r for r in editor["risks"])
    assert any("false pages" in r for r in editor["risks"])  # the project grant covers every topic
    assert [r[:40] for r in found[VM_SA]["risks"]] == ["can write log entries (logging.logEntrie"]
    public = found["allUsers"]
    assert public["grants"] == ["roles/pubsub.publisher on topic pitstop-notifications"]
    assert public["risks"][0].startswith("anyone (allUsers) can publish to pitstop-notifications")
    assert finding_line(public).startswith(
        "allUsers (roles/pubsub.publisher on topic pitstop-notifications): "
    )


def test_a_conditional_grant_says_so_and_only_pitstop_is_no_finding() -> None:
    conditional = {
        "bindings": [
            {"role": "roles/pubsub.publisher", "members": [VM_SA], "condition": {"expression": "true"}}
        ]
    }
    (f,) = exposure_findings(PROJECT, {"bindings": []}, {"pitstop-slurm-train": conditional}, _table())
    assert "commands the agent runs on the controller" in f["risks"][0]
    assert f["risks"][0].endswith("(under an IAM condition: check what it allows)")
    own = {"bindings": [{"role": "roles/logging.logWriter", "members": [INGEST, LOGGING_AGENT]}]}
    assert exposure_findings(PROJECT, own, {}, _table()) == []


def test_every_topic_deploy_creates_has_its_own_risk() -> None:
    topics = exposure.pitstop_topics({"slurm_clusters": ["train"]})
    assert {"pitstop-events", "pitstop-slurm-train", "pitstop-slurm-train-results"} <= set(topics)
    generic = _table().topic_risk("pitstop-something-new")
    assert all(_table().topic_risk(t) != generic for t in topics)


@pytest.mark.emulator
def test_doctor_reads_the_policies_through_gcloud(pubsub_host: str, tmp_path: Path) -> None:
    fake = fake_gcp.FakeGcp(pubsub_upstream=pubsub_host)
    server = fake_gcp.serve(fake)
    try:
        project = f"exp-{uuid.uuid4().hex[:8]}"
        fake.resources[("cloudresourcemanager", f"projects/{project}")] = {"projectId": project}
        fake.policies[("cloudresourcemanager", f"projects/{project}")] = {
            "bindings": [{"role": "roles/editor", "members": [COMPUTE_SA]}]
        }
        for topic in ("pitstop-events", "pitstop-notifications"):  # deployed; the others are not
            path = f"projects/{project}/topics/{topic}"
            assert fake.handle("PUT", f"/pubsub/v1/{path}", {})[0] == 200
        fake.policies[("pubsub", f"projects/{project}/topics/pitstop-events")] = {
            "bindings": [{"role": "roles/pubsub.publisher", "members": [VM_SA]}]
        }
        env = _env_at(fake, tmp_path)

        def gcloud(argv: list[str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["gcloud", *argv], capture_output=True, text=True, env=env, timeout=180)

        lines: list[str] = []
        assert exposure.report(project, {"slurm_clusters": []}, gcloud, lines.append) == 2
        assert [ln.split(" (")[0] for ln in lines] == [f"finding  {COMPUTE_SA}", f"finding  {VM_SA}"]
        assert "roles/pubsub.publisher on topic pitstop-events" in lines[1]
        asked = {(c.api, c.verb, c.path) for c in fake.calls if c.verb == "getIamPolicy"}
        assert ("cloudresourcemanager", "getIamPolicy", f"projects/{project}") in asked
        assert ("pubsub", "getIamPolicy", f"projects/{project}/topics/pitstop-events") in asked
        cli = [sys.executable, "-m", "pitstop.tools.cli", "doctor", "--project", project]
        run = subprocess.run(
            cli, capture_output=True, text=True, timeout=300, env={**env, "PYTHONPATH": str(FUNCTIONS)}
        )
        assert run.returncode == 1, run.stderr  # findings: a person should look
        assert run.stdout.splitlines() == lines
        fake.policies[("cloudresourcemanager", f"projects/{project}")] = {"bindings": []}
        fake.policies.pop(("pubsub", f"projects/{project}/topics/pitstop-events"))
        assert exposure.report(project, {}, gcloud, lines.append) == 0 and lines[-1].startswith("ok ")
    finally:
        server.shutdown()
