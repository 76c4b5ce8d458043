"""The real deploy: `pitstop deploy`'s apply() driving the real gcloud at local endpoints.

Pub/Sub is Google's emulator (behind the recording fake, which adds the IAM methods the emulator
lacks); every other API is the recording fake in pitstop/local/fake_gcp.py. One module-wide
run deploys with the command a user types, deploys again, tears down, and deploys the identity
part again; the tests read what gcloud sent and what exists. Every command is parsed and sent
by the real gcloud, all of them by one gcloud interpreter (tests/tools/gcloud_batch.py).
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.cloud.pubsub_v1 import PublisherClient, SubscriberClient

from pitstop.core import sinks
from pitstop.local import fake_gcp
from pitstop.tools import deploy, deploy_monitoring
from tests.tools import gcloud_batch

# ~460 gcloud commands in one fixture, in one gcloud interpreter (tests/tools/gcloud_batch.py):
# about 20 s of its CPU, minutes of wall time on a loaded box. A hang guard, not a speed check.
pytestmark = [pytest.mark.emulator, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
REGION = "us-central1"
PUBSUB_AGENT = f"serviceAccount:service-{fake_gcp.PROJECT_NUMBER}@gcp-sa-pubsub.iam.gserviceaccount.com"
CLUSTERS = ("train", "infer")
ZONES = [
    "us-central1-a",
    {"zone": "us-central1-b", "name_prefix": "a3-", "migs": ["a3-node"]},
]  # actuate's VMs
CUSTOM_ROLES = ("pitstopWorkflowStarter", "pitstopActuator", "pitstopOperationsReader")
# the operator's policy: enforce, with the clusters deploy.yaml names (deploy's pre-flight checks they agree)
ENFORCE_POLICY = "mode: enforce\nclusters:\n" + "".join(
    f"  - {{name: {c}, scheduler: slurm, match: {{name_pattern: '{c}-*'}}}}\n" for c in CLUSTERS
)
NOT_SHIPPED = ("pitstop/local/", "pitstop/tools/", "pitstop/agent/")  # the CLI, the Slurm agent, stand-ins
LOGGING_AGENT = f"serviceAccount:service-{fake_gcp.PROJECT_NUMBER}@gcp-sa-logging.iam.gserviceaccount.com"
MONITORING_AGENT = (
    f"serviceAccount:service-{fake_gcp.PROJECT_NUMBER}@gcp-sa-monitoring-notification.iam.gserviceaccount.com"
)


@dataclass
class Deployed:
    project: str
    fake: fake_gcp.FakeGcp
    steps: list[deploy.Step]
    logs: list[list[str]] = field(default_factory=list)  # per phase: deploy, deploy, teardown, identity
    calls: list[list[fake_gcp.Call]] = field(default_factory=list)
    rcs: list[int] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)  # after each phase
    topics: list[set[str]] = field(default_factory=list)
    subscriptions: list[dict[str, Any]] = field(default_factory=list)

    def sa(self, component: str) -> str:
        return f"serviceAccount:{deploy.sa_email(component, self.project)}"

    def created(self, api: str, collection: str) -> list[dict[str, Any]]:
        """Bodies of the first run's create requests to a collection (as gcloud sent them)."""
        return [
            c.body
            for c in self.calls[0]
            if c.api == api and c.method == "POST" and not c.verb and c.path.endswith(collection)
        ]


def _state(fake: fake_gcp.FakeGcp, project: str) -> dict[str, Any]:
    """Everything the fake holds, minus what changes on every write (etags, operations) and what
    other tests made in projects of their own (the module's tests share the fake and its gcloud)."""

    def ours(name: str) -> bool:
        return not name.startswith("projects/") or name.split("/")[1] == project

    def clean(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: clean(v) for k, v in obj.items() if k != "etag"}
        if isinstance(obj, list):
            return [clean(v) for v in obj]
        return obj

    with fake.lock:
        res = {
            f"{a} {n}": clean(copy.deepcopy(v))
            for (a, n), v in fake.resources.items()
            if "/operations/" not in n and ours(n)
        }
        pol = {f"{a} {n}": clean(copy.deepcopy(v)) for (a, n), v in fake.policies.items() if ours(n)}
    return {"resources": res, "policies": pol}


def _env_at(fake: fake_gcp.FakeGcp, tmp: Path) -> dict[str, str]:
    """gcloud's environment with every API it calls pointed at the fake and a dummy access token."""
    token = tmp / "token"
    token.write_text("local-token")
    env = {
        **{k: v for k, v in os.environ.items() if not k.endswith("_EMULATOR_HOST")},
        **fake.env(),
        "CLOUDSDK_CONFIG": str(tmp / "gcloud"),
        "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token),
        "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
    }
    return env


def _cli_deploy(project: str, conf: dict[str, Any], gcloud: Gcloud, log: Any) -> int:
    """`pitstop deploy` in a process of its own; the `gcloud` first on its PATH is the worker's."""
    config = gcloud.tmp / "deploy.yaml"
    keys = ("slurm_clusters", "webhook_format", "policy", "compute_zones")
    config.write_text(yaml.safe_dump({k: conf[k] for k in keys}))
    argv = [sys.executable, "-m", "pitstop.tools.cli", "deploy", "--project", project, "--region", REGION]
    proc = subprocess.run(
        [*argv, "--config", str(config)],
        capture_output=True,
        text=True,
        env={**gcloud.env, "PATH": gcloud.worker.path(), "PYTHONPATH": str(ROOT / "functions")},
        timeout=900,
        check=False,
    )
    for line in proc.stdout.splitlines() + [f"stderr   {x}" for x in proc.stderr.splitlines()]:
        log(line)
    return proc.returncode


def _identity(steps: list[deploy.Step]) -> list[deploy.Step]:
    """The plan's roles, accounts, project bindings and topics: enough to redeploy after a teardown."""
    return [
        s
        for s in steps
        if s.argv[0] in ("services", "projects")
        or s.argv[:2] == ["iam", "roles"]
        or s.argv[:3] in (["iam", "service-accounts", "create"], ["pubsub", "topics", "create"])
    ]


@dataclass
class Gcloud:
    """The module's fake Google APIs and the one gcloud interpreter that runs every command at them."""

    fake: fake_gcp.FakeGcp
    env: dict[str, str]
    worker: gcloud_batch.GcloudWorker
    tmp: Path


@pytest.fixture(scope="module")
def gcloud(pubsub_host: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gcloud]:
    fake = fake_gcp.FakeGcp(pubsub_upstream=pubsub_host)
    server = fake_gcp.serve(fake)
    tmp = tmp_path_factory.mktemp("deploy")
    env = _env_at(fake, tmp)
    worker = gcloud_batch.GcloudWorker(env, tmp)
    try:
        yield Gcloud(fake, env, worker, tmp)
    finally:
        worker.close()
        server.shutdown()


@pytest.fixture(scope="module")
def deployed(gcloud: Gcloud) -> Iterator[Deployed]:
    project = f"dep-{uuid.uuid4().hex[:8]}"
    fake, tmp = gcloud.fake, gcloud.tmp
    run = deploy_monitoring.runner(gcloud.worker.run, gcloud.env)  # alert policies and the channel: REST
    policy = tmp / "policy.yaml"  # the operator's policy, switched to enforce
    policy.write_text(ENFORCE_POLICY)
    conf = {
        **deploy.load_config(None),
        "slurm_clusters": list(CLUSTERS),
        "webhook_format": "slack",
        "policy": str(policy),
        "compute_zones": ZONES,
    }
    steps = deploy.plan(
        project, REGION, conf, str(deploy.stage_source(deploy.policy_path(conf), tmp / "src"))
    )
    d = Deployed(project, fake, steps)
    pub, sub = PublisherClient(), SubscriberClient()

    def phase(fn: Any) -> None:
        start, logs = len(fake.calls), list[str]()
        d.rcs.append(fn(logs.append))
        d.logs.append(logs)
        d.calls.append(fake.calls[start:])
        d.states.append(_state(fake, project))
        d.topics.append({t.name.rsplit("/", 1)[-1] for t in pub.list_topics(project=f"projects/{project}")})
        d.subscriptions.append(
            {s.name.rsplit("/", 1)[-1]: s for s in sub.list_subscriptions(project=f"projects/{project}")}
        )

    try:
        phase(lambda log: _cli_deploy(project, conf, gcloud, log))  # the command a user runs
        phase(lambda log: deploy.apply(steps, run, log))
        phase(lambda log: deploy.teardown(steps, False, run, log))
        phase(lambda log: deploy.apply(_identity(steps), run, log))  # what a teardown soft-deletes
        yield d
    finally:
        sub.close()


def test_the_worker_answers_as_the_gcloud_binary(gcloud: Gcloud) -> None:
    """The module's commands run in one gcloud interpreter: each answers as `gcloud ARGV` does."""
    project = f"chk-{uuid.uuid4().hex[:8]}"
    for argv in (
        ["secrets", "describe", "pitstop-nothing", "--project", project],  # the fake's 404: exit 1
        ["secrets", "create", "x", "--replication-policy=everywhere", "--project", project],  # gcloud says no
        ["pubsub", "topics", "crate", "x", "--project", project],  # gcloud's parser says no: exit 2
        ["projects", "describe", project, "--format=value(projectNumber)"],
    ):
        fresh = subprocess.run(
            ["gcloud", *argv], capture_output=True, text=True, env=gcloud.env, timeout=300, check=False
        )
        got = gcloud.worker.run(argv)
        assert (got.returncode, got.stdout, got.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_every_step_ran_and_gcloud_sent_no_placeholder(deployed: Deployed) -> None:
    assert deployed.rcs == [0, 0, 0, 0], deployed.logs
    # after the steps, deploy reads who else can write the inputs Pitstop reads: only Pitstop
    steps_log, exposure_log = deployed.logs[0][: len(deployed.steps)], deployed.logs[0][len(deployed.steps) :]
    only_own = "only Pitstop's own identities can write its inputs in"
    assert exposure_log[0] == f"ok       {only_own} {deployed.project}"
    # and what is still to do by hand: the webhook's URL (deploy creates its secret empty)
    assert [line.split(":", 1)[0] for line in exposure_log[1:]] == ["stderr   pitstop deploy"]
    assert "pitstop-webhook has no enabled version" in exposure_log[1]
    assert [line for line in steps_log if not line.startswith("ok ")] == [
        "skipped  restore the custom role if a teardown deleted it (IAM keeps its id for 37 days)"
    ] * len(CUSTOM_ROLES) + [f"skipped  {BOUND}"]  # the webhook secret has no version yet
    leftovers = [
        str(c) for c in deployed.calls[0] if re.search(r"<[a-z0-9-]+>", json.dumps([c.path, c.query, c.body]))
    ]
    assert leftovers == []


def test_pubsub_resources_exist_in_the_emulator(deployed: Deployed) -> None:
    assert deployed.topics[0] == set(deploy.TOPICS) | {
        f"pitstop-slurm-{c}{end}" for c in CLUSTERS for end in ("", "-results")
    }
    subs = deployed.subscriptions[0]
    assert {
        "pitstop-events-dead-inspect",
        "pitstop-notifications-dead-inspect",
        "pitstop-slurm-train-agent",
        "pitstop-slurm-infer-agent",
    } <= set(subs)
    assert subs["pitstop-slurm-train-agent"].ack_deadline_seconds == 120
    # Eventarc's push subscriptions (made by the fake, as Google does) got the dead-letter policies
    triggers = {name: s for name, s in subs.items() if name.startswith("eventarc-")}
    assert len(triggers) == 3  # ingest's two (the sink's topic, the alerts topic) and notify's
    dlq = {
        re.sub(r"-\d+$", "", name.split("-pitstop-")[1].split("-sub-")[0]): (
            s.dead_letter_policy.dead_letter_topic,
            s.dead_letter_policy.max_delivery_attempts,
            s.topic.rsplit("/", 1)[-1],
        )
        for name, s in triggers.items()
    }
    p = deployed.project
    assert dlq == {
        "ingest": (f"projects/{p}/topics/pitstop-events-dead", 5, "pitstop-events"),
        "ingest-alerts": (f"projects/{p}/topics/pitstop-events-dead", 5, "pitstop-alerts"),
        "notify": (f"projects/{p}/topics/pitstop-notifications-dead", 10, "pitstop-notifications"),
    }


BOUND = "function pitstop-notify"  # deployed with its secret, once the secret has a version
WAITING = f"ok       {BOUND} without PITSTOP_WEBHOOK_URL: add a version to pitstop-webhook, deploy again"


def test_notify_gets_the_webhook_secret_once_it_has_a_version(gcloud: Gcloud, tmp_path: Path) -> None:
    """Cloud Run resolves a secret environment variable before an instance starts: a revision whose
    secret version cannot be read does not start, and the deploy fails
    (https://cloud.google.com/run/docs/configuring/services/secrets, "How secrets are checked at
    deployment and runtime"; Cloud Run reports "Revision '...' is not ready and cannot serve
    traffic. spec.template.spec.containers[0].env[N].value_from.secret_key_ref.name: Secret
    projects/NUMBER/secrets/S/versions/latest was not found"). deploy creates the secret empty."""
    project, fake, run = f"sec-{uuid.uuid4().hex[:8]}", gcloud.fake, gcloud.worker.run
    conf = {**deploy.load_config(None), "webhook_format": "slack"}
    steps = [
        s
        for s in deploy.plan(project, REGION, conf, str(deploy.stage_source(None, tmp_path / "src")))
        if s.argv[:3] == ["secrets", "create", "pitstop-webhook"]
        or s.argv[:3] == ["functions", "deploy", "pitstop-notify"]
    ]
    secret, bound, waiting = steps
    assert waiting.gate is not None and bound.gate is not None and waiting.gate.negate
    name = f"projects/{project}/locations/{REGION}/functions/pitstop-notify"

    def deployed(plan: list[deploy.Step]) -> tuple[int, list[str], dict[str, Any]]:
        logs: list[str] = []
        rc = deploy.apply(plan, run, logs.append)
        return rc, logs, copy.deepcopy(fake.resources[("cloudfunctions", name)])

    # the old order (deploy's, until bound was gated): the secret created empty, then notify bound to it
    assert deploy.apply([secret], run, list[str]().append) == 0
    old = run(bound.argv)
    missing = (
        f"Secret projects/{fake_gcp.PROJECT_NUMBER}/secrets/pitstop-webhook/versions/latest was not found"
    )
    assert old.returncode == 1, old.stderr
    assert (
        "ERROR: (gcloud.functions.deploy) Could not create or update Cloud Run service pitstop-notify"
        in old.stderr
    )
    assert f"value_from.secret_key_ref.name: {missing}" in old.stderr
    assert fake.resources[("cloudfunctions", name)]["state"] == "FAILED"
    # now: notify without the secret while it has no version (the failed function is replaced)
    rc, logs, fn = deployed(steps)
    assert (rc, logs[1:], fn["state"]) == (0, [f"skipped  {BOUND}", WAITING], "ACTIVE"), logs
    assert "secretEnvironmentVariables" not in fn["serviceConfig"]
    url = tmp_path / "webhook-url"
    url.write_text("https://hooks.slack.com/services/T0/B0/x")
    added = run(["secrets", "versions", "add", "pitstop-webhook", f"--data-file={url}", "--project", project])
    assert added.returncode == 0, added.stderr
    # the run after a version exists binds it, and the next finds it current
    rc, logs, fn = deployed(steps)
    assert (rc, logs[1:], fn["state"]) == (0, [f"ok       {BOUND}", f"skipped  {WAITING[9:]}"], "ACTIVE"), (
        logs
    )
    secrets = fn["serviceConfig"]["secretEnvironmentVariables"]
    assert [(s["key"], s["secret"], s["version"]) for s in secrets] == [
        ("PITSTOP_WEBHOOK_URL", "pitstop-webhook", "latest")
    ]
    rc, logs, _ = deployed(steps)
    assert (rc, logs[1:]) == (0, [f"current  {BOUND}", f"skipped  {WAITING[9:]}"]), logs


Binding = tuple[str, str]  # role, condition title ("" for none)


def _expected_project_bindings(project: str) -> dict[Binding, set[str]]:
    """iam.yaml's project_roles and compute_roles (ZONES are all in this project), by role and condition."""
    iam = yaml.safe_load((ROOT / "infra" / "iam.yaml").read_text())
    titles = {name: c["title"] for name, c in iam["conditions"].items()}
    titles["compute-zones"] = "pitstop-actuator-zones"  # generated by deploy.compute_conditions
    out: dict[Binding, set[str]] = {}
    for comp, spec in iam["service_accounts"].items():
        for account in [comp.format(cluster=c) for c in CLUSTERS] if "{cluster}" in comp else [comp]:
            for b in spec.get("project_roles", []) + spec.get("compute_roles", []):
                role = b["role"].format(project=project, compute_project=project)
                key = (role, titles[b["condition"]] if "condition" in b else "")
                out.setdefault(key, set()).add(f"serviceAccount:{deploy.sa_email(account, project)}")
    return out


def _project_bindings(policy: dict[str, Any]) -> dict[Binding, set[str]]:
    return {
        (b["role"], b.get("condition", {}).get("title", "")): set(b["members"]) for b in policy["bindings"]
    }


def test_project_iam_policy_holds_exactly_the_roles_in_iam_yaml(deployed: Deployed) -> None:
    p = deployed.project
    policy = deployed.states[0]["policies"][f"cloudresourcemanager projects/{p}"]
    got = _project_bindings(policy)
    assert got == _expected_project_bindings(p)
    assert not {"roles/owner", "roles/editor", "roles/workflows.invoker"} & {r for r, _ in got}
    conditions = {
        (b["role"], (b.get("condition") or {}).get("title")): b.get("condition") for b in policy["bindings"]
    }
    # one grant per database: Pitstop's own, and notify's ledger alone (notify reaches no incident)
    for title, db in (
        ("pitstop-database-only", "pitstop"),
        ("pitstop-notify-database-only", "pitstop-notify"),
    ):
        assert conditions["roles/datastore.user", title] == {
            "title": title,
            "expression": f'resource.name == "projects/{p}/databases/{db}" || '
            f'resource.name.startsWith("projects/{p}/databases/{db}/")',
        }
    assert conditions[f"projects/{p}/roles/pitstopActuator", "pitstop-actuator-zones"] == {
        "title": "pitstop-actuator-zones",
        "expression": f'resource.name.startsWith("projects/{p}/zones/us-central1-a/") || '
        f'resource.name.startsWith("projects/{p}/zones/us-central1-b/instances/a3-") || '
        f'resource.name == "projects/{p}/zones/us-central1-b/instanceGroupManagers/a3-node"',
    }
    assert policy["version"] == 3  # conditional bindings need policy version 3
    role = deployed.states[0]["resources"][f"iam projects/{p}/roles/pitstopActuator"]
    spec = yaml.safe_load((ROOT / "infra" / "roles" / "pitstop-actuator.yaml").read_text())
    assert role["includedPermissions"] == spec["includedPermissions"]
    assert set(role["includedPermissions"]) <= fake_gcp.TESTABLE_PERMISSIONS
    accounts = {b["accountId"] for b in deployed.created("iam", "/serviceAccounts")}
    components = ("ingest", "sweep", "actuate", "notify", "workflow", "scheduler", "slurm-train")
    assert accounts == {f"pitstop-{c}" for c in (*components, "slurm-infer")}


def test_resource_level_bindings_reach_only_their_resource(deployed: Deployed) -> None:
    f, p, sa = deployed.fake, deployed.project, deployed.sa
    # (state after the first run is what the fake holds until teardown; read the snapshot)
    pol = deployed.states[0]["policies"]

    def members(api: str, name: str, role: str) -> set[str]:
        return {
            m
            for b in pol.get(f"{api} {name}", {}).get("bindings", [])
            if b["role"] == role
            for m in b["members"]
        }

    pub, subr, inv = "roles/pubsub.publisher", "roles/pubsub.subscriber", "roles/run.invoker"
    assert members("pubsub", f"projects/{p}/topics/pitstop-events", pub) == {LOGGING_AGENT}  # the sinks only
    assert members("pubsub", f"projects/{p}/topics/pitstop-notifications", pub) == {
        sa("ingest"),
        sa("sweep"),
        sa("actuate"),
    }
    for c in CLUSTERS:  # each cluster's agent pulls its own commands and answers on its own topic
        assert members("pubsub", f"projects/{p}/topics/pitstop-slurm-{c}", pub) == {sa("actuate")}
        assert members("pubsub", f"projects/{p}/subscriptions/pitstop-slurm-{c}-agent", subr) == {
            sa(f"slurm-{c}")
        }
        assert members("pubsub", f"projects/{p}/topics/pitstop-slurm-{c}-results", pub) == {sa(f"slurm-{c}")}
        results = f"projects/{p}/subscriptions/pitstop-slurm-{c}-results-actuate"
        assert members("pubsub", results, subr) == {sa("actuate")}
    for dead in ("pitstop-events-dead", "pitstop-notifications-dead"):
        assert members("pubsub", f"projects/{p}/topics/{dead}", pub) == {PUBSUB_AGENT}
    # Monitoring's notifications count only from pitstop-alerts, so only its agent publishes there
    assert members("pubsub", f"projects/{p}/topics/pitstop-alerts", pub) == {MONITORING_AGENT}
    secret = f"projects/{p}/secrets/pitstop-webhook"
    assert members("secretmanager", secret, "roles/secretmanager.secretAccessor") == {sa("notify")}
    run = f"projects/{p}/locations/{REGION}/services"
    assert members("run", f"{run}/pitstop-actuate", inv) == {sa("workflow")}
    assert members("run", f"{run}/pitstop-sweep", inv) == {sa("scheduler")}
    assert members("run", f"{run}/pitstop-ingest", inv) == {sa("ingest")}  # its Eventarc trigger identity
    assert members("run", f"{run}/pitstop-notify", inv) == {sa("notify")}
    for comp in ("ingest", "notify"):
        account = f"projects/{p}/serviceAccounts/{deploy.sa_email(comp, p)}"
        assert members("iam", account, "roles/iam.serviceAccountTokenCreator") == {PUBSUB_AGENT}
    every_member = {m for v in pol.values() for b in v.get("bindings", []) for m in b["members"]}
    assert not {"allUsers", "allAuthenticatedUsers"} & every_member
    assert f is deployed.fake


def test_sinks_carry_the_filter_files_and_unique_writer_identities(deployed: Deployed) -> None:
    sent = {
        c.body["name"]: c
        for c in deployed.calls[0]
        if c.api == "logging" and c.path.endswith("/sinks") and c.method == "POST"
    }
    assert set(sent) == set(sinks.SINK_FILTERS)
    for name, flt in sinks.sink_filters().items():
        assert sent[name].body["filter"] == flt
        assert (
            sent[name].body["destination"]
            == f"pubsub.googleapis.com/projects/{deployed.project}/topics/pitstop-events"
        )
        assert sent[name].query.get("uniqueWriterIdentity") == "True"
    metric = deployed.created("logging", "/metrics")[0]
    assert metric["name"] == "pitstop_xid_lines" and metric["filter"] == sinks.read_filter("gpu-xid.filter")


def test_functions_are_deployed_with_their_flags_and_the_staged_source(deployed: Deployed) -> None:
    bodies = {
        c.query["functionId"]: c.body
        for c in deployed.calls[0]
        if c.api == "cloudfunctions" and c.method == "POST" and "functionId" in c.query
    }
    assert set(bodies) == {"pitstop-ingest", "pitstop-actuate", "pitstop-notify", "pitstop-sweep"}
    p = deployed.project
    for fn, body in bodies.items():
        assert body["buildConfig"]["runtime"] == "python312"
        assert body["buildConfig"]["entryPoint"] == fn.removeprefix("pitstop-")
        env = body["serviceConfig"]["environmentVariables"]
        assert env["PITSTOP_POLICY"] == "/workspace/policy.yaml"
        assert env["PITSTOP_NOTIFICATIONS_TOPIC"] == "pitstop-notifications"
        assert re.fullmatch(r"[0-9a-f]{20}", body["labels"][deploy.DIGEST_LABEL])
    for fn, topic, sa in (
        ("pitstop-ingest", "pitstop-events", "ingest"),
        ("pitstop-notify", "pitstop-notifications", "notify"),
    ):
        trig = bodies[fn]["eventTrigger"]
        assert trig["pubsubTopic"] == f"projects/{p}/topics/{topic}"
        assert trig["retryPolicy"] == "RETRY_POLICY_RETRY"
        assert trig["serviceAccountEmail"] == deploy.sa_email(sa, p)
    assert "eventTrigger" not in bodies["pitstop-actuate"] and "eventTrigger" not in bodies["pitstop-sweep"]
    assert bodies["pitstop-actuate"]["serviceConfig"]["serviceAccountEmail"] == deploy.sa_email("actuate", p)
    assert bodies["pitstop-actuate"]["serviceConfig"]["timeoutSeconds"] == 300
    notify = bodies["pitstop-notify"]["serviceConfig"]
    assert notify["environmentVariables"]["PITSTOP_WEBHOOK_FORMAT"] == "slack"
    # the webhook secret has no version yet: notify runs without it (the binding: test_notify_gets_...)
    assert "secretEnvironmentVariables" not in notify
    assert WAITING in deployed.logs[0] and f"skipped  {BOUND}" in deployed.logs[0]
    # the archive gcloud uploaded is the staged source: code, its data, and the policy
    objects = {b["buildConfig"]["source"]["storageSource"]["object"] for b in bodies.values()}
    assert len(objects) == 4 and objects <= set(deployed.fake.uploads)
    archive = zipfile.ZipFile(io.BytesIO(deployed.fake.uploads[min(objects)]))
    names = set(archive.namelist())
    assert archive.read("policy.yaml").decode() == ENFORCE_POLICY  # deploy.yaml's policy, as given
    assert not [n for n in names if n.startswith(NOT_SHIPPED) or "__pycache__" in n]
    assert {
        "main.py",
        "requirements.txt",
        "policy.yaml",
        "pitstop/core/engine.py",
        "pitstop/schemas/xid-policy.yaml",
    } <= names
    assert {"pitstop/filters/gpu-xid.filter", "pitstop/filters/system-events.filter"} <= names


def test_workflow_source_env_and_identity(deployed: Deployed) -> None:
    (wf,) = deployed.created("workflows", "/workflows")
    assert wf["sourceContents"] == (ROOT / "workflows" / "remediate.yaml").read_text()
    assert wf["serviceAccount"].endswith(deploy.sa_email("workflow", deployed.project))
    fns = deployed.states[0]["resources"]
    actuate = fns[f"cloudfunctions projects/{deployed.project}/locations/{REGION}/functions/pitstop-actuate"]
    assert wf["userEnvVars"]["PITSTOP_ACTUATE_URL"] == actuate["serviceConfig"]["uri"]
    (job,) = deployed.created("cloudscheduler", "/jobs")
    sweep = fns[f"cloudfunctions projects/{deployed.project}/locations/{REGION}/functions/pitstop-sweep"]
    assert job["httpTarget"]["uri"] == sweep["serviceConfig"]["uri"]
    assert job["httpTarget"]["oidcToken"]["serviceAccountEmail"] == deploy.sa_email(
        "scheduler", deployed.project
    )
    assert job["schedule"] == "* * * * *"


def test_firestore_monitoring_and_secret(deployed: Deployed) -> None:
    dbs = deployed.created("firestore", "/databases")
    assert len(dbs) == 2 and all(d["type"] == "FIRESTORE_NATIVE" and d["locationId"] == REGION for d in dbs)
    made = [c for c in deployed.calls[0] if c.api == "firestore" and c.method == "POST"]
    # Pitstop's own, not (default), and notify's ledger in one of its own
    assert [c.query.get("databaseId") for c in made] == ["pitstop", "pitstop-notify"]
    ttl = [c for c in deployed.calls[0] if c.api == "firestore" and c.method == "PATCH"]
    assert [(c.path.split("/collectionGroups/")[0], c.query["updateMask"]) for c in ttl] == [
        (f"projects/{deployed.project}/databases/pitstop", "ttlConfig")
    ] * 4
    assert [c.path.split("/collectionGroups/")[1] for c in ttl] == [
        "pitstop_dedup/fields/expire_at",
        "pitstop_outbox/fields/expire_at",
        "pitstop_resolved/fields/expire_at",  # the resolved feed ingest instances' caches read
        "pitstop_counts/fields/expire_at",  # count pages of instances long gone
    ]
    (dash,) = deployed.created("monitoring", "/dashboards")
    assert dash == json.loads((ROOT / "infra" / "monitoring" / "dashboard.json").read_text())
    (channel,) = deployed.created("monitoring", "/notificationChannels")
    topic = f"projects/{deployed.project}/topics/pitstop-alerts"
    assert (channel["type"], channel["labels"], channel["displayName"]) == (
        "pubsub",
        {"topic": topic},
        deploy.ALERTS_CHANNEL,
    )
    policies = deployed.created("monitoring", "/alertPolicies")
    people = {a["displayName"] for a in policies if not a.get("notificationChannels")}
    files = sorted((ROOT / "infra" / "monitoring").glob("alert-*.json"))
    assert people == {json.loads(f.read_text())["displayName"] for f in files} and len(people) == 3
    sent = {tuple(a.get("notificationChannels") or ()) for a in policies} - {()}
    assert len(sent) == 1 and next(iter(sent))[0].startswith(
        f"projects/{deployed.project}/notificationChannels/"
    )
    to_pitstop = {a["displayName"] for a in policies if a.get("notificationChannels")}
    telemetry = sorted(deploy.TELEMETRY.glob("*.json"))
    assert (
        to_pitstop == {json.loads(f.read_text())["displayName"] for f in telemetry} and len(to_pitstop) == 7
    )
    secrets = deployed.created("secretmanager", "/secrets")  # the webhook's, and the sealing key's
    assert len(secrets) == 2 and all(s["replication"] == {"automatic": {}} for s in secrets)


def test_second_run_creates_nothing_and_changes_nothing(deployed: Deployed) -> None:
    second = deployed.calls[1]
    creates = [str(c) for c in second if c.method == "POST" and not c.verb] + [
        str(c) for c in second if c.api == "pubsub" and c.method == "PUT"
    ]
    assert creates == []
    assert not [
        c
        for c in second
        if c.verb == "generateUploadUrl" or (c.api in ("cloudfunctions", "workflows") and c.method != "GET")
    ]
    assert sum(line.startswith("current") for line in deployed.logs[1]) == 5  # 4 functions + the workflow
    assert deployed.states[1] == deployed.states[0]
    assert deployed.topics[1] == deployed.topics[0] and set(deployed.subscriptions[1]) == set(
        deployed.subscriptions[0]
    )


def _monitoring(state: dict[str, Any], collection: str) -> list[str]:
    return sorted(v["displayName"] for k, v in state["resources"].items() if f"/{collection}/" in k)


def test_alert_policies_and_the_channel_exist_once_are_updated_in_place_and_torn_down(
    deployed: Deployed,
) -> None:
    """Made through Monitoring's REST API, not gcloud alpha/beta: found again by display name, so a
    second deploy replaces each policy (PATCH on its name) instead of adding one, and teardown
    deletes each (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies)."""
    files = [
        *sorted((ROOT / "infra" / "monitoring").glob("alert-*.json")),
        *sorted(deploy.TELEMETRY.glob("*.json")),
    ]
    titles = sorted(json.loads(f.read_text())["displayName"] for f in files)
    for state in deployed.states[:2]:  # after the first deploy and after the second
        assert _monitoring(state, "alertPolicies") == titles
        assert _monitoring(state, "notificationChannels") == [deploy.ALERTS_CHANNEL]
    patched = [
        c.path
        for c in deployed.calls[1]
        if c.api == "monitoring" and c.method == "PATCH" and "/alertPolicies/" in c.path
    ]
    assert len(patched) == len(set(patched)) == len(titles)
    assert set(patched) == {
        k.split(" ", 1)[1] for k in deployed.states[0]["resources"] if "/alertPolicies/" in k
    }
    deleted = [c.path for c in deployed.calls[2] if c.api == "monitoring" and c.method == "DELETE"]
    assert len([d for d in deleted if "/alertPolicies/" in d]) == len(titles)
    assert len([d for d in deleted if "/notificationChannels/" in d]) == 1
    assert (
        _monitoring(deployed.states[2], "alertPolicies")
        == _monitoring(deployed.states[2], "notificationChannels")
        == []
    )


def test_teardown_leaves_only_the_database_and_enabled_apis(deployed: Deployed) -> None:
    p = deployed.project
    roles = {f"iam projects/{p}/roles/{r}" for r in CUSTOM_ROLES}
    left = {k.split(" ")[0] for k in deployed.states[2]["resources"] if k not in roles}
    assert left <= {"firestore", "serviceusage"}, sorted(deployed.states[2]["resources"])
    assert all(deployed.states[2]["resources"][r]["deleted"] is True for r in roles)
    remaining = [
        m
        for v in deployed.states[2]["policies"].values()
        for b in v.get("bindings", [])
        for m in b["members"]
    ]
    assert not [m for m in remaining if "pitstop-" in m], remaining
    assert deployed.topics[2] == set() and deployed.subscriptions[2] == {}
    assert f"cloudresourcemanager projects/{p}" in deployed.states[2]["policies"]


def test_deploy_after_teardown_restores_the_soft_deleted_role(deployed: Deployed) -> None:
    assert not [line for line in deployed.logs[3] if not line.startswith(("ok ", "skipped "))]
    restored = "ok       restore the custom role if a teardown deleted it (IAM keeps its id for 37 days)"
    assert deployed.logs[3].count(restored) == len(CUSTOM_ROLES)
    for r in CUSTOM_ROLES:
        assert "deleted" not in deployed.states[3]["resources"][f"iam projects/{deployed.project}/roles/{r}"]
    assert deployed.topics[3] == deployed.topics[0]
    policy = deployed.states[3]["policies"][f"cloudresourcemanager projects/{deployed.project}"]
    assert _project_bindings(policy) == _expected_project_bindings(deployed.project)


def test_folder_sinks_include_children_and_their_writers_publish_to_the_project_topic(gcloud: Gcloud) -> None:
    project, fake = f"agg-{uuid.uuid4().hex[:8]}", gcloud.fake
    conf = {**deploy.load_config(None), "aggregated_sink": {"folder": "123456789"}}
    steps = [
        s
        for s in deploy.plan(project, REGION, conf)
        if s.argv[:2] == ["logging", "sinks"] or ("pitstop-events" in s.argv[3:4] and s.argv[0] == "pubsub")
    ]
    logs: list[str] = []
    start = len(fake.calls)
    assert deploy.apply(steps, gcloud.worker.run, logs.append) == 0, logs
    sent = [c for c in fake.calls[start:] if c.api == "logging" and c.method == "POST"]
    assert {c.path for c in sent} == {"folders/123456789/sinks"}
    assert {c.body["name"] for c in sent} == set(sinks.SINK_FILTERS)
    assert all(c.body["includeChildren"] is True for c in sent)
    writer = "serviceAccount:service-folder-123456789@gcp-sa-logging.iam.gserviceaccount.com"
    topic = fake.policy("pubsub", f"projects/{project}/topics/pitstop-events")
    assert [(b["role"], b["members"]) for b in topic["bindings"]] == [("roles/pubsub.publisher", [writer])]
