"""The deploy plan read from infra/resources.yaml equals the reviewed baseline.

tests/fixtures/deploy/ holds every field of every step, and the dry-run output, per case,
written by `make golden` (pitstop.tools.golden) with the `pitstop_config` label values as
`<digest>`: they digest the shipped code, which changes with every edit. The baseline first
recorded the hand-written plan this interpreter replaced; the
`channels` case was written by hand from the `default` one (each alert policy's create given
`--notification-channels`, its update `--set-notification-channels`). It is regenerated only
when the plan is meant to change, and the change is reviewed step by step; the last time for
least privilege (issue 12: Pitstop's own Firestore database and conditional datastore.user,
a workflow-starter custom role instead of project-wide workflows.invoker, the actuator's roles
only in configured zones, the Slurm agent without Firestore but with a results topic), the
outbox TTL (issue 11) and GKE clusters (issue 13: the `gke` case is new); then for the workflow's
PITSTOP_CHECK_TIMEOUT_S and PITSTOP_RESUME_WAIT_S (issue 14: diagnose, validate, early requeue);
then (`gke` only) for ingest's GKE grants: clusterViewer, pitstopNodeLookup (no longer actuate's)
and ${INGEST_SA} in the RBAC manifest (ingest reads a node: a regional node's zone, XidCriticalError);
then for actuate's --memory=512Mi (issue 11: google-cloud-compute puts it at ~200 MiB before a request);
then for telemetry alerts (issue 24: the pitstop-alerts topic, Monitoring's Pub/Sub channel to it and
its service agent's publisher grant, ingest's second trigger with its dead-letter policy, the telemetry
policies sent to that channel, PITSTOP_ALERTS_TOPIC in every function's environment); then for the
kustomize base (issue 36: one `kubectl apply -k` of an overlay of infra/gke per GKE cluster instead of
two `sed | kubectl apply -f -`; each step's `overlay` replaces `stdin` and `stdin_vars`); then for
the alert policies and the notification channel (issue 36: Monitoring's v3 REST calls made in-process,
deploy_monitoring, instead of `gcloud alpha monitoring policies` and `gcloud beta monitoring channels`;
the configured channels are the policies' `notificationChannels=` field).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from pitstop.core import sinks
from pitstop.tools import deploy, deploy_monitoring, golden
from tests.helpers import ops_agent_entry

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "deploy"
CASES = golden.CASES
_normalised = golden.normalised
CHANNELS = (
    "projects/demo-proj/notificationChannels/1234567890123456789,projects/ops-oncall/notificationChannels/42"
)


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the fixture configs name their policy file relative to the repository


def test_the_baselines_are_what_the_golden_command_writes(tmp_path: Path) -> None:
    """A deploy change is reviewed as a diff of the baselines: `make golden` regenerates them, and a
    stale one (the code changed, the baseline did not) fails here, byte for byte."""
    written = golden.write(tmp_path)
    assert {p.name for p in written} == {f"{c[0]}.{k}" for c in CASES for k in ("plan.json", "dry-run.txt")}
    for path in written:
        assert path.read_text() == (FIXTURES / path.name).read_text(), f"{path.name} is stale: make golden"


@pytest.mark.parametrize(("name", "project", "region", "config"), CASES, ids=[c[0] for c in CASES])
def test_plan_equals_the_baseline(name: str, project: str, region: str | None, config: str | None) -> None:
    conf = deploy.load_config(config)
    steps = deploy.plan(project, region or deploy.setting(conf, "region"), conf)
    got: list[dict[str, Any]] = json.loads(_normalised(json.dumps([dataclasses.asdict(s) for s in steps])))
    want: list[dict[str, Any]] = json.loads(_normalised((FIXTURES / f"{name}.plan.json").read_text()))
    assert [s["what"] for s in got] == [s["what"] for s in want]
    for g, w in zip(got, want, strict=True):
        assert g == w, g["what"]


@pytest.mark.parametrize(("name", "project", "region", "config"), CASES, ids=[c[0] for c in CASES])
def test_dry_run_output_equals_the_baseline(
    name: str, project: str, region: str | None, config: str | None
) -> None:
    argv = [sys.executable, "-m", "pitstop.tools.cli", "deploy", "--project", project, "--dry-run"]
    argv += ["--region", region] if region else []
    argv += ["--config", config] if config else []
    env = {**os.environ, "PYTHONPATH": str(ROOT / "functions")}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    want = (FIXTURES / f"{name}.dry-run.txt").read_text()
    assert _normalised(proc.stdout).splitlines() == _normalised(want).splitlines()


def test_digest_labels_are_stable_and_match_what_the_checks_expect() -> None:
    conf = deploy.load_config("tests/fixtures/deploy/org.yaml")
    first, again = (deploy.plan("p-2", "asia-southeast1", conf) for _ in range(2))
    labelled = [s for s in first if s.expect is not None]
    assert len(labelled) == 6  # four functions (notify with and without its secrets) and the workflow
    for step in labelled:
        assert any(a.endswith(f"{deploy.DIGEST_LABEL}={step.expect}") for a in step.argv), step.what
    assert [s.expect for s in first] == [s.expect for s in again]


def test_planning_writes_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for _, project, region, config in CASES:
        conf = deploy.load_config(config)
        deploy.plan(project, region or deploy.setting(conf, "region"), conf)
        deploy.dry_run_lines(project, region or deploy.setting(conf, "region"), conf)
    assert list(tmp_path.iterdir()) == []


def test_apply_writes_the_metric_config_the_command_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log metric's config is derived from the Xid filter file, written just before gcloud reads it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    conf = deploy.load_config(None)
    (step,) = [
        s for s in deploy.plan("demo-proj", "us-central1", conf) if s.argv[:2] == ["logging", "metrics"]
    ]
    path = tmp_path / "pitstop-xid-metric.json"
    assert f"--config-from-file={path}" in step.argv and not path.exists()
    seen: list[dict[str, Any]] = []

    def gcloud(argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv == step.argv:
            seen.append(json.loads(path.read_text()))
        return subprocess.CompletedProcess(argv, 1 if "describe" in argv else 0, "", "")

    assert deploy.apply([step], gcloud, lambda _: None) == 0
    (metric,) = seen
    assert metric["filter"] == sinks.read_filter("gpu-xid.filter")
    assert set(metric) == {"description", "filter", "labelExtractors", "metricDescriptor"}
    # REGEXP_EXTRACT(field, re): the first group of re in that field of a verified kernel entry
    field, regex = re.fullmatch(
        r'REGEXP_EXTRACT\(([\w.]+), "(.*)"\)', metric["labelExtractors"]["xid"]
    ).groups()  # type: ignore[union-attr]
    entry: Any = ops_agent_entry(
        "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', GPU has fallen off the bus."
    )
    for key in field.split("."):
        entry = entry[key]
    found = re.search(regex.encode().decode("unicode_escape"), entry)
    assert found is not None and found.group(1) == "79"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # replaced whole, no stray temp file


def test_every_kind_in_resources_yaml_has_a_builder() -> None:
    def kinds(entries: list[dict[str, Any]]) -> set[str]:
        return {e["kind"] for e in entries if "kind" in e} | {
            k for e in entries if "resources" in e for k in kinds(e["resources"])
        }

    assert kinds(yaml.safe_load(deploy.RESOURCES.read_text())["resources"]) <= set(deploy.KINDS)
    assert deploy.TOPICS == [
        "pitstop-events",
        "pitstop-events-dead",
        "pitstop-notifications",
        "pitstop-notifications-dead",
        "pitstop-alerts",
    ]


def test_alert_policies_notify_the_configured_channels_and_only_they_change() -> None:
    plain = deploy.plan("demo-proj", "us-central1", deploy.load_config(None))
    wired = deploy.plan("demo-proj", "us-central1", deploy.load_config("tests/fixtures/deploy/channels.yaml"))
    policies = [
        w for w in wired if w.argv[:3] == [deploy_monitoring.API, "POST", "projects/demo-proj/alertPolicies"]
    ]
    alerts = [w for w in policies if "/monitoring/telemetry/" not in w.argv[3]]
    assert len(alerts) == len(list((deploy.INFRA / "monitoring").glob("alert-*.json"))) == 3
    for w in alerts:
        assert w.argv[-1] == f"notificationChannels={CHANNELS}"
        assert w.update is not None and w.update[-1] == f"notificationChannels={CHANNELS}"
    for p, w in zip(plain, wired, strict=True):
        if w not in alerts:
            assert dataclasses.asdict(p) == dataclasses.asdict(w), w.what


@pytest.mark.parametrize(
    "channels",
    [
        "projects/demo-proj/notificationChannels/1",  # a string, not a list
        ["1234567890"],  # an id without its project
        ["projects/demo-proj/notificationChannels/1,projects/x/notificationChannels/2"],
        ["projects/demo-proj/notificationChannels/abc"],
        ["projects/Demo_Proj/notificationChannels/1"],
        [None],
    ],
)
def test_notification_channels_must_be_full_resource_names(channels: Any, tmp_path: Path) -> None:
    conf = tmp_path / "deploy.yaml"
    conf.write_text(yaml.safe_dump({"notification_channels": channels}))
    with pytest.raises(ValueError, match="notification_channels"):
        deploy.load_config(str(conf))
    with pytest.raises(ValueError, match="notification_channels"):
        bad = {**deploy.load_config(None), "notification_channels": channels}
        deploy.plan("demo-proj", "us-central1", bad)


def offline_gcloud(config_dir: Path) -> dict[str, str]:
    """The environment of a gcloud that parses a command and stops at authentication, never online."""
    return {
        **os.environ,
        "CLOUDSDK_CONFIG": str(config_dir),
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_EVENTARC": "http://127.0.0.1:9/",  # never a real endpoint
    }


def test_channels_become_the_notification_channels_of_the_policy_deploy_sends() -> None:
    """The body of a policy's create and of its update (a whole-policy replace): the file's policy
    with the configured channels (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies)."""
    conf = deploy.load_config("tests/fixtures/deploy/channels.yaml")
    step = next(
        s for s in deploy.plan("demo-proj", "us-central1", conf) if "alert-xid-spike" in " ".join(s.argv)
    )
    policy = json.loads((deploy.INFRA / "monitoring" / "alert-xid-spike.json").read_text())
    assert step.update is not None and step.update[:3] == [deploy_monitoring.API, "PATCH", deploy.EXISTING]
    for argv in (step.argv, step.update):
        assert deploy_monitoring.body(argv[3:]) == {**policy, "notificationChannels": CHANNELS.split(",")}


def test_pagerduty_is_deployed_only_when_asked_for() -> None:
    """The second channel is opt-in: its secret, notify's read of it and its variable come with
    `pagerduty: true` in deploy.yaml, and not otherwise (services/channels.py reads the variable)."""
    plain = "\n".join(deploy.dry_run_lines("demo-proj", "us-central1", deploy.load_config(None)))
    assert "pitstop-pagerduty" not in plain and "PITSTOP_PAGERDUTY_ROUTING_KEY" not in plain
    lines = deploy.dry_run_lines(
        "demo-proj", "us-central1", deploy.load_config("tests/fixtures/deploy/pagerduty.yaml")
    )
    notify = next(ln for ln in lines if ln.startswith("gcloud functions deploy pitstop-notify "))
    assert (
        "--set-secrets=PITSTOP_WEBHOOK_URL=pitstop-webhook:latest,PITSTOP_PAGERDUTY_ROUTING_KEY=pitstop-pagerduty:latest"
        in notify
    )
    assert any(ln.startswith("gcloud secrets create pitstop-pagerduty ") for ln in lines)
    grant = [ln for ln in lines if ln.startswith("gcloud secrets add-iam-policy-binding pitstop-pagerduty ")]
    assert len(grant) == 1 and "pitstop-notify@" in grant[0] and "secretAccessor" in grant[0]


def test_telemetry_policies_notify_pitstop_through_its_own_channel_whatever_else_is_configured() -> None:
    """The telemetry policies' notifications are ingest's input, not a page: they go to the Pub/Sub
    channel deploy creates (learned by its display name at run time), never to the people's channels;
    the channel exists before Monitoring's agent is granted its topic, and both before the policies."""
    for config in (None, "tests/fixtures/deploy/channels.yaml"):
        steps = deploy.plan("demo-proj", "us-central1", deploy.load_config(config))
        whats = [s.what for s in steps]
        telemetry = [s for s in steps if "/monitoring/telemetry/" in " ".join(s.argv)]
        assert len(telemetry) == len(list(deploy.TELEMETRY.glob("*.json"))) >= 7
        for s in telemetry:
            assert s.argv[-1] == "notificationChannels=<pitstop-alerts-channel>"
            assert s.update is not None and s.update[-1] == "notificationChannels=<pitstop-alerts-channel>"
            assert s.captures["<pitstop-alerts-channel>"] == [
                deploy_monitoring.API,
                "GET",
                "projects/demo-proj/notificationChannels",
                f"displayName={deploy.ALERTS_CHANNEL}",
            ]
        channel = whats.index("Cloud Monitoring notification channel to pitstop-alerts")
        grant = whats.index("Monitoring's notification service agent may publish to pitstop-alerts (only it)")
        assert whats.index("topic pitstop-alerts") < channel < grant < whats.index(telemetry[0].what)
        binding = steps[grant].argv
        assert "--member=serviceAccount:service-<project-number>@gcp-sa-monitoring-notification"
        assert (
            binding[-1] == "--role=roles/pubsub.publisher" and "gcp-sa-monitoring-notification" in binding[-2]
        )


def test_ingest_gets_a_second_trigger_on_the_alerts_topic_with_a_dead_letter_policy() -> None:
    steps = deploy.plan("demo-proj", "us-central1", deploy.load_config(None))
    trigger = next(s for s in steps if s.argv[:3] == ["eventarc", "triggers", "create"])
    assert trigger.argv[3] == "pitstop-ingest-alerts"
    assert "--destination-run-service=pitstop-ingest" in trigger.argv
    assert "--transport-topic=projects/demo-proj/topics/pitstop-alerts" in trigger.argv
    assert "--service-account=pitstop-ingest@demo-proj.iam.gserviceaccount.com" in trigger.argv
    update = next(
        s
        for s in steps
        if s.argv[:4] == ["pubsub", "subscriptions", "update", "<pitstop-ingest-alerts-trigger-subscription>"]
    )
    assert "--dead-letter-topic=pitstop-events-dead" in update.argv
    assert update.captures["<pitstop-ingest-alerts-trigger-subscription>"][:4] == [
        "eventarc",
        "triggers",
        "describe",
        "pitstop-ingest-alerts",
    ]
    ingest = next(s for s in steps if s.argv[:3] == ["functions", "deploy", "pitstop-ingest"])
    assert any(
        a.startswith("--set-env-vars=") and "PITSTOP_ALERTS_TOPIC=pitstop-alerts" in a for a in ingest.argv
    )


def test_a_policy_of_your_own_may_notify_pitstop_when_it_says_what_it_raises(tmp_path: Path) -> None:
    """deploy.yaml `telemetry_policies`: e.g. a heartbeat policy on a metric the jobs already write."""
    mine = json.loads((deploy.TELEMETRY / "job-heartbeat.json").read_text())
    mine["displayName"] = "My heartbeat"
    mine["userLabels"] = {"pitstop_signal": "hang", "pitstop_job_label": "run_id", "pitstop_cluster": "train"}
    path = tmp_path / "my-heartbeat.json"
    path.write_text(json.dumps(mine))
    conf = tmp_path / "deploy.yaml"
    conf.write_text(yaml.safe_dump({"telemetry_policies": [str(path)]}))
    steps = deploy.plan("demo-proj", "us-central1", deploy.load_config(str(conf)))
    step = next(s for s in steps if f"from={path}" in s.argv)
    assert step.argv[-1] == "notificationChannels=<pitstop-alerts-channel>"
    del mine["userLabels"]["pitstop_signal"]
    path.write_text(json.dumps(mine))
    with pytest.raises(ValueError, match="pitstop_signal"):
        deploy.load_config(str(conf))


def test_the_new_commands_are_accepted_by_the_real_gcloud_parser(tmp_path: Path) -> None:
    """2 is gcloud's usage error; a command it accepts stops at authentication (1), offline."""
    steps = deploy.plan("demo-proj", "us-central1", deploy.load_config(None))
    env = offline_gcloud(tmp_path)
    picked = [s for s in steps if s.argv[:3] == ["eventarc", "triggers", "create"]]
    assert len(picked) == 1  # the channel and the policies are REST calls, not gcloud (deploy_monitoring)
    for argv in [p.argv for p in picked] + [p.check or [] for p in picked]:
        proc = subprocess.run(
            ["gcloud", *argv], capture_output=True, text=True, timeout=120, env=env, check=False
        )
        assert proc.returncode == 1, (argv, proc.stderr[-500:])
