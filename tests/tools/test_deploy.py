"""`pitstop deploy`: the plan, least privilege, and every command accepted by the real gcloud parser."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
import yaml

from pitstop.core import sinks
from pitstop.tools import deploy, deploy_monitoring
from pitstop.tools.deploy_monitoring import API
from pitstop.tools.deploy_types import Grant as IamGrant
from pitstop.tools.deploy_types import IamCondition

if TYPE_CHECKING:
    from pitstop.local import fake_gcp

ROOT = Path(__file__).resolve().parents[2]
CONF = {**deploy.load_config(None), "slurm_clusters": ["train", "infer"], "webhook_format": "slack"}
GKE_CONF = {  # the same, acting on VMs in two zones and two GKE clusters, one in another project
    **CONF,
    "compute_zones": [
        "us-central1-a",
        {"zone": "us-east5-b", "name_prefix": "a3-node-", "migs": ["a3-node"]},
    ],
    "gke_clusters": [
        {
            "name": "gpu-a3",
            "location": "us-central1",
            "node_groups": [
                "us-central1-a/gke-gpu-a3-a3-1a2b3c4d-grp",
                "us-central1-b/gke-gpu-a3-a3-5e6f7a8b-grp",
            ],
        },
        {
            "name": "tpu-b",
            "location": "europe-west4-b",
            "project": "ml-other-proj",
            "node_groups": ["europe-west4-b/gke-tpu-b-pool-0c0d0e0f-grp"],
        },
    ],
}


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> list[deploy.Step]:
    source = deploy.stage_source(None, tmp_path_factory.mktemp("src"))
    return deploy.plan("my-train-proj", "us-central1", CONF, str(source))


@pytest.fixture(scope="module")
def gke_steps(tmp_path_factory: pytest.TempPathFactory) -> list[deploy.Step]:
    source = deploy.stage_source(None, tmp_path_factory.mktemp("src"))
    return deploy.plan("my-train-proj", "us-central1", GKE_CONF, str(source))


def test_dry_run_prints_one_gcloud_command_or_rest_call_per_line() -> None:
    proc = subprocess.run(
        ["pitstop", "deploy", "--project", "my-train-proj", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": f"{ROOT}/.venv/bin:" + os.environ["PATH"]},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) > 30
    rest = [
        line
        for line in lines
        if re.match(r"(GET|POST|PATCH|DELETE) https://monitoring\.googleapis\.com/v3/", line)
    ]
    assert len(rest) == 11  # the channel and the alert policies (deploy_monitoring)
    assert all(shlex.split(line)[0] == "gcloud" for line in lines if line not in rest)
    assert any("<pitstop-gpu-xid-writer-identity>" in line for line in lines)
    assert any("<pitstop-actuate-url>" in line for line in lines)


def _every_argv(s: deploy.Step) -> list[list[str]]:
    lists = [s.argv, s.check, s.update, s.delete, s.purge, s.credentials, *s.captures.values()]
    return [a for a in [*lists, *(s.gate.commands if s.gate else [])] if a is not None]


def test_no_step_uses_gcloud_alpha_or_beta(steps: list[deploy.Step], gke_steps: list[deploy.Step]) -> None:
    """gcloud's alpha and beta commands may change or go without notice; Monitoring's alert
    policies and channel (alpha/beta only in gcloud 528) are REST calls deploy makes itself."""
    channels = deploy.plan(
        "my-train-proj", "us-central1", deploy.load_config("tests/fixtures/deploy/channels.yaml")
    )
    every = [(s.program, a) for s in [*steps, *gke_steps, *channels] for a in _every_argv(s)]
    assert [a for program, a in every if program == "gcloud" and a[0] in ("alpha", "beta")] == []
    made = [s for s in steps if deploy_monitoring.is_api(s.argv)]
    assert [s.argv[2].rsplit("/", 1)[-1] for s in made] == ["notificationChannels"] + ["alertPolicies"] * 10
    assert all(deploy_monitoring.is_api(a) for s in made for a in _every_argv(s))


def test_least_privilege(steps: list[deploy.Step]) -> None:
    roles = [a.split("=", 1)[1] for s in steps for a in s.argv if a.startswith("--role=")]
    assert roles and not {"roles/owner", "roles/editor", "roles/compute.admin"} & set(roles)
    assert not {"roles/workflows.invoker", "roles/datastore.owner", "roles/pubsub.editor"} & set(roles)
    iam = deploy._iam()["service_accounts"]  # iam.yaml with every plugin folder's grants
    grants = [
        g
        for spec in iam.values()
        for k, v in spec.items()
        if k.endswith("_roles")
        for g in cast(list[IamGrant], v)
    ]
    assert grants and all(b["why"] for b in grants)
    deploys = [s for s in steps if s.argv[:2] == ["functions", "deploy"]]
    fns = {
        s.argv[2]: s.argv for s in deploys if s.gate is None or not s.gate.negate
    }  # notify: its secrets bound
    assert set(fns) == {"pitstop-ingest", "pitstop-actuate", "pitstop-notify", "pitstop-sweep"}
    for argv in fns.values():
        assert "--no-allow-unauthenticated" in argv
    assert "--retry" in fns["pitstop-ingest"]
    assert any(
        a.startswith("--set-secrets=PITSTOP_WEBHOOK_URL=pitstop-webhook") for a in fns["pitstop-notify"]
    )
    invokers = {
        (s.argv[2], s.argv[4].split("=", 1)[1])
        for s in steps
        if s.argv[:2] == ["functions", "add-invoker-policy-binding"]
    }
    sa = "serviceAccount:pitstop-{}@my-train-proj.iam.gserviceaccount.com".format
    assert invokers == {  # callers, and each Pub/Sub function's own trigger identity
        ("pitstop-actuate", sa("workflow")),
        ("pitstop-sweep", sa("scheduler")),
        ("pitstop-ingest", sa("ingest")),
        ("pitstop-notify", sa("notify")),
    }
    role = yaml.safe_load((ROOT / "infra" / "roles" / "pitstop-actuator.yaml").read_text())
    assert "compute.instances.reportHostAsFaulty" in role["includedPermissions"]
    assert not any(p.endswith((".delete", ".setIamPolicy", ".insert")) for p in role["includedPermissions"])


PERMISSIONS = {  # each custom role, exactly: what the code calls (adapters/compute.py, workflows.py, vertex)
    "pitstop-actuator.yaml": {
        "compute.instances.get",
        "compute.instances.reset",
        "compute.instances.setLabels",
        "compute.instances.reportHostAsFaulty",
        "compute.instances.performMaintenance",
        "compute.instanceGroupManagers.get",
        "compute.instanceGroupManagers.update",
    },
    "pitstop-operations-reader.yaml": {"compute.zoneOperations.get"},
    "pitstop-node-lookup.yaml": {"compute.instances.get"},
    "pitstop-workflow-starter.yaml": {
        "workflows.executions.create",
        "workflows.executions.get",
        "workflows.executions.list",
        "workflows.executions.cancel",
    },
    "pitstop-vertex-resubmitter.yaml": {  # plugins/schedulers/vertex/adapter.py: read, find, create, cancel
        "aiplatform.customJobs.get",
        "aiplatform.customJobs.list",
        "aiplatform.customJobs.create",
        "aiplatform.customJobs.cancel",
    },
}


def test_custom_roles_hold_exactly_the_permissions_pitstop_uses() -> None:
    files = {f.name: f for f in (ROOT / "infra" / "roles").glob("*.yaml")}
    assert set(files) == set(PERMISSIONS)
    for name, want in PERMISSIONS.items():
        role = yaml.safe_load(files[name].read_text())
        assert len(role["includedPermissions"]) == len(set(role["includedPermissions"]))
        assert set(role["includedPermissions"]) == want, name


Grant = tuple[str, str, str, str]  # where (gcloud group), resource, role, condition title or ""


def _grants(steps: list[deploy.Step]) -> dict[str, set[Grant]]:
    """Every binding the plan makes, by member: the whole of what each identity may do."""
    out: dict[str, set[Grant]] = {}
    for s in steps:
        verbs = [
            i for i, a in enumerate(s.argv) if a in ("add-iam-policy-binding", "add-invoker-policy-binding")
        ]
        if not verbs:
            continue
        flags = dict(a.removeprefix("--").split("=", 1) for a in s.argv if a.startswith("--") and "=" in a)
        cond = flags.get("condition", "None")
        title = "" if cond == "None" else cond.rsplit(",title=", 1)[1]
        where = " ".join(s.argv[: verbs[0]])
        grant = (where, s.argv[verbs[0] + 1], flags.get("role", "roles/run.invoker"), title)
        out.setdefault(flags["member"], set()).add(grant)
    return out


def test_each_identity_holds_exactly_its_expected_grants(gke_steps: list[deploy.Step]) -> None:
    """The complete set per account: nothing project-wide that a resource or a condition can narrow."""
    p, other = "my-train-proj", "ml-other-proj"
    sa = "serviceAccount:pitstop-{}@my-train-proj.iam.gserviceaccount.com".format
    prj, topic, sub = "projects", "pubsub topics", "pubsub subscriptions"
    db, zones, starter = (
        "pitstop-database-only",
        "pitstop-actuator-zones",
        f"projects/{p}/roles/pitstopWorkflowStarter",
    )
    logs = (prj, p, "roles/logging.logWriter", "")
    # every publisher of notifications seals them with the deploy's key (issue 35)
    seal = ("secrets", "pitstop-notify-key", "roles/secretmanager.secretAccessor", "")
    want = {
        sa("ingest"): {
            (prj, p, "roles/datastore.user", db),
            (prj, p, starter, ""),
            logs,
            (topic, "pitstop-notifications", "roles/pubsub.publisher", ""),
            ("functions", "pitstop-ingest", "roles/run.invoker", ""),
            seal,
            # reads a node (RBAC: nodes get only): a regional node's zone, XidCriticalError
            (prj, p, "roles/container.clusterViewer", ""),
            (prj, other, "roles/container.clusterViewer", ""),
            (prj, p, f"projects/{p}/roles/pitstopNodeLookup", "pitstop-gke-node-lookup"),
            (prj, other, f"projects/{other}/roles/pitstopNodeLookup", "pitstop-gke-node-lookup"),
        },
        sa("actuate"): {
            (prj, p, "roles/datastore.user", db),
            (prj, p, starter, ""),
            logs,
            (prj, p, f"projects/{p}/roles/pitstopActuator", zones),
            (prj, other, f"projects/{other}/roles/pitstopActuator", zones),
            (prj, p, f"projects/{p}/roles/pitstopOperationsReader", ""),
            (prj, other, f"projects/{other}/roles/pitstopOperationsReader", ""),
            # a degraded node's peers: the DCGM metrics of the job's nodes (read-only)
            (prj, p, "roles/monitoring.viewer", ""),
            (prj, other, "roles/monitoring.viewer", ""),
            (prj, p, "roles/container.clusterViewer", ""),
            (prj, other, "roles/container.clusterViewer", ""),
            (topic, "pitstop-notifications", "roles/pubsub.publisher", ""),
            (topic, "pitstop-slurm-train", "roles/pubsub.publisher", ""),
            (topic, "pitstop-slurm-infer", "roles/pubsub.publisher", ""),
            (sub, "pitstop-slurm-train-results-actuate", "roles/pubsub.subscriber", ""),
            (sub, "pitstop-slurm-infer-results-actuate", "roles/pubsub.subscriber", ""),
            seal,
        },
        sa("notify"): {
            (prj, p, "roles/monitoring.metricWriter", ""),
            (prj, p, "roles/datastore.user", "pitstop-notify-database-only"),  # its ledger alone
            logs,
            ("secrets", "pitstop-webhook", "roles/secretmanager.secretAccessor", ""),
            ("functions", "pitstop-notify", "roles/run.invoker", ""),
        },
        sa("sweep"): {  # its own account: no GKE reads, no trigger identity
            (prj, p, "roles/datastore.user", db),
            (prj, p, starter, ""),
            logs,
            (topic, "pitstop-notifications", "roles/pubsub.publisher", ""),
            seal,
        },
        sa("workflow"): {logs, ("functions", "pitstop-actuate", "roles/run.invoker", "")},
        sa("scheduler"): {("functions", "pitstop-sweep", "roles/run.invoker", "")},
        **{
            sa(f"slurm-{c}"): {  # no Firestore at all: results go to its own topic
                logs,
                (sub, f"pitstop-slurm-{c}-agent", "roles/pubsub.subscriber", ""),
                (topic, f"pitstop-slurm-{c}-results", "roles/pubsub.publisher", ""),
            }
            for c in ("train", "infer")
        },
    }
    got = _grants(gke_steps)
    pitstop = {m: g for m, g in got.items() if m.startswith("serviceAccount:pitstop-")}
    assert pitstop == want
    others = {(m, g) for m, gs in got.items() if m not in want for g in gs}
    assert {g[2] for _, g in others} == {
        "roles/pubsub.publisher",
        "roles/pubsub.subscriber",
        "roles/iam.serviceAccountTokenCreator",
    }
    assert {m for m, _ in others} == {
        "serviceAccount:service-<project-number>@gcp-sa-pubsub.iam.gserviceaccount.com",
        "serviceAccount:service-<project-number>@gcp-sa-monitoring-notification.iam.gserviceaccount.com",
        "<pitstop-gpu-xid-writer-identity>",
        "<pitstop-system-events-writer-identity>",
    }


def test_conditions_confine_firestore_to_pitstops_database_and_compute_to_the_zones(
    gke_steps: list[deploy.Step],
) -> None:
    every = [
        ((s.argv[2], next(a for a in s.argv if a.startswith("--role="))), a.removeprefix("--condition="))
        for s in gke_steps
        if s.argv[:2] == ["projects", "add-iam-policy-binding"]
        for a in s.argv
        if a.startswith("--condition=") and a != "--condition=None"
    ]
    conds = dict(every)
    database = (
        'expression=resource.name == "projects/my-train-proj/databases/pitstop" || '
        'resource.name.startsWith("projects/my-train-proj/databases/pitstop/"),title=pitstop-database-only'
    )
    notify_database = (
        'expression=resource.name == "projects/my-train-proj/databases/pitstop-notify" || '
        'resource.name.startsWith("projects/my-train-proj/databases/pitstop-notify/"),'
        "title=pitstop-notify-database-only"
    )
    datastore = {c for key, c in every if key == ("my-train-proj", "--role=roles/datastore.user")}
    assert datastore == {database, notify_database}
    local = conds[("my-train-proj", "--role=projects/my-train-proj/roles/pitstopActuator")]
    where = "projects/my-train-proj/zones"
    assert local == (
        f'expression=resource.name.startsWith("{where}/us-central1-a/") || '
        f'resource.name.startsWith("{where}/us-east5-b/instances/a3-node-") || '
        f'resource.name == "{where}/us-east5-b/instanceGroupManagers/a3-node" || '
        # the regional GKE cluster: each node pool's MIG by name and the VMs named after it
        f'resource.name.startsWith("{where}/us-central1-a/instances/gke-gpu-a3-a3-1a2b3c4d-") || '
        f'resource.name == "{where}/us-central1-a/instanceGroupManagers/gke-gpu-a3-a3-1a2b3c4d-grp" || '
        f'resource.name.startsWith("{where}/us-central1-b/instances/gke-gpu-a3-a3-5e6f7a8b-") || '
        f'resource.name == "{where}/us-central1-b/instanceGroupManagers/gke-gpu-a3-a3-5e6f7a8b-grp"'
        ",title=pitstop-actuator-zones"
    )
    other = "projects/ml-other-proj/zones/europe-west4-b"
    assert conds[("ml-other-proj", "--role=projects/ml-other-proj/roles/pitstopActuator")] == (
        f'expression=resource.name.startsWith("{other}/instances/gke-tpu-b-pool-0c0d0e0f-") || '
        f'resource.name == "{other}/instanceGroupManagers/gke-tpu-b-pool-0c0d0e0f-grp",'
        "title=pitstop-actuator-zones"
    )
    # the Firestore conditions (one role, two databases) and the node lookup's, one per GKE project
    assert len(conds) == 5
    lookups = {k[0] for k, c in conds.items() if c.endswith(",title=pitstop-gke-node-lookup")}
    assert lookups == {"my-train-proj", "ml-other-proj"}


def test_without_zones_or_gke_clusters_actuate_gets_no_compute_role(steps: list[deploy.Step]) -> None:
    roles = {a for s in steps for a in s.argv if a.startswith("--role=")}
    assert not [r for r in roles if "pitstopActuator" in r or "compute" in r or "container" in r]
    assert not [s for s in steps if s.argv[:3] == ["iam", "roles", "create"] and "pitstopActuator" in s.argv]


def test_many_zones_are_split_over_conditions_iam_accepts() -> None:
    scope = [(f"us-central1-{z}", "") for z in "abcdef"]
    scope += [(f"us-east{n}-a", w) for n in range(1, 6) for w in ("a3-", f"mig:a3-{n}")]
    conds = deploy.compute_conditions("p-1234", scope)
    assert [c["title"] for c in conds] == ["pitstop-actuator-zones", "pitstop-actuator-zones-2"]
    clauses = [c["expression"].split(" || ") for c in conds]
    assert [len(c) for c in clauses] == [12, 4]  # 6 zones + 5 x (instances, MIGs) = 16 clauses
    assert all(c["expression"].count("||") <= 11 and "," not in c["expression"] for c in conds)


def test_sinks_use_the_filter_files(steps: list[deploy.Step]) -> None:
    created = {s.argv[3]: s.argv for s in steps if s.argv[:3] == ["logging", "sinks", "create"]}
    for sink, flt in sinks.sink_filters().items():
        assert f"--log-filter={flt}" in created[sink]
        assert created[sink][4] == "pubsub.googleapis.com/projects/my-train-proj/topics/pitstop-events"


def test_every_slurm_cluster_gets_a_topic_a_subscription_and_the_agent_pull_right(
    steps: list[deploy.Step],
) -> None:
    lines = [s.line() for s in steps]
    for c in ("train", "infer"):
        assert any(f"pubsub topics create pitstop-slurm-{c}" in x for x in lines)
        assert any(
            f"pubsub subscriptions add-iam-policy-binding pitstop-slurm-{c}-agent" in x
            and "roles/pubsub.subscriber" in x
            for x in lines
        )
    pulls = {
        s.argv[3]: s.argv[6]
        for s in steps
        if s.argv[:3] == ["pubsub", "subscriptions", "add-iam-policy-binding"]
    }
    for c in ("train", "infer"):  # its own account, and no other cluster's
        assert pulls[f"pitstop-slurm-{c}-agent"] == (
            f"--member=serviceAccount:pitstop-slurm-{c}@my-train-proj.iam.gserviceaccount.com"
        )
        assert pulls[f"pitstop-slurm-{c}-results-actuate"] == (
            "--member=serviceAccount:pitstop-actuate@my-train-proj.iam.gserviceaccount.com"
        )
    publishers = {
        (s.argv[3], s.argv[6])
        for s in steps
        if s.argv[:3] == ["pubsub", "topics", "add-iam-policy-binding"] and s.argv[3].endswith("-results")
    }
    assert publishers == {  # only a cluster's own agent can answer for that cluster
        (
            f"pitstop-slurm-{c}-results",
            f"--member=serviceAccount:pitstop-slurm-{c}@my-train-proj.iam.gserviceaccount.com",
        )
        for c in ("train", "infer")
    }


def test_a_slurm_controllers_account_may_mint_tokens_as_its_clusters_agent_account_only() -> None:
    """deploy.yaml slurm_controller_accounts: roles/iam.serviceAccountTokenCreator on that cluster's
    agent account (the agent's --impersonate-service-account), nothing else; a cluster deploy does
    not know, or a value that is not an account's email, is refused."""
    ctl = "slurm-ctl@my-train-proj.iam.gserviceaccount.com"
    conf = {**CONF, "slurm_controller_accounts": {"train": ctl}}
    base = {tuple(s.argv) for s in deploy.plan("my-train-proj", "us-central1", CONF)}
    added = [s.argv for s in deploy.plan("my-train-proj", "us-central1", conf) if tuple(s.argv) not in base]
    assert added == [
        [
            "iam", "service-accounts", "add-iam-policy-binding",
            "pitstop-slurm-train@my-train-proj.iam.gserviceaccount.com", "--project", "my-train-proj",
            f"--member=serviceAccount:{ctl}", "--role=roles/iam.serviceAccountTokenCreator",
        ]
    ]  # fmt: skip
    for bad, why in (({"other": ctl}, "not one of slurm_clusters"), ({"train": "x;rm -rf"}, "not a service")):
        with pytest.raises(ValueError, match=why):
            deploy.plan("my-train-proj", "us-central1", {**CONF, "slurm_controller_accounts": bad})


@pytest.mark.parametrize("name", ["Train", "a_b", "-x", "x-", "", "seventeen-chars-x", "a b", "x;rm"])
def test_cluster_names_that_cannot_name_an_account_are_refused(name: str, tmp_path: Path) -> None:
    conf = tmp_path / "deploy.yaml"
    conf.write_text(yaml.safe_dump({"slurm_clusters": [name]}))
    with pytest.raises(ValueError, match="slurm_clusters"):
        deploy.load_config(str(conf))
    assert deploy.CLUSTER_NAME.fullmatch("train-2") and deploy.CLUSTER_NAME.fullmatch("a")


def _tree(root: Path) -> dict[str, bytes]:
    return {f.relative_to(root).as_posix(): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def test_staged_source_holds_the_shipped_packages_and_their_data_only(tmp_path: Path) -> None:
    out = deploy.stage_source(None, tmp_path / "src")
    assert {p.name for p in out.iterdir()} == {"main.py", "requirements.txt", "policy.yaml", "pitstop"}
    assert {p.name for p in (out / "pitstop").iterdir()} == {
        "__init__.py",
        "core",
        "services",
        "adapters",
        "plugins",
        "schemas",
        "filters",
    }  # no tools (CLI, deploy), agent (runs on the Slurm controller) or local (the stand-ins)
    packages = {p.parent.relative_to(out).as_posix() for p in out.rglob("__init__.py")}
    functions = ROOT / "functions"
    shipped = {
        p.parent.relative_to(functions).as_posix()
        for room in ("core", "services", "adapters", "plugins")
        for p in (functions / "pitstop" / room).rglob("__init__.py")
    }
    assert packages == {"pitstop", *shipped}  # the rooms and their subpackages (actuate, gke), no more
    assert {"pitstop/services/actuate", "pitstop/adapters/gke"} <= packages
    assert not [p for p in out.rglob("*") if p.name == "__pycache__" or p.suffix in (".pyc", ".pyo")]
    for pkg in shipped:  # a plugin folder's local sink or stand-in (local.py) stays home
        here = {p.name for p in (functions / pkg).glob("*.py")}
        assert {p.name for p in (out / pkg).glob("*.py")} == here - (
            {"local.py"} if "plugins/" in pkg else set()
        )
    assert (out / "pitstop/plugins/channels/pagerduty/plugin.yaml").is_file()
    assert not (out / "pitstop/plugins/channels/pagerduty/local.py").exists()
    assert (out / "pitstop" / "schemas" / "xid-policy.yaml").is_file()
    assert (out / "pitstop" / "filters" / "gpu-xid.filter").is_file()
    assert (out / "policy.yaml").read_text().strip() == "{}"


def test_source_digest_hashes_exactly_what_is_staged(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: enforce\n")
    out = deploy.stage_source(str(policy), tmp_path / "src")
    assert (out / "policy.yaml").read_text() == "mode: enforce\n"
    h = hashlib.sha256()
    for name, data in sorted(_tree(out).items()):  # every staged file, path-ordered: path NUL content NUL
        h.update(name.encode() + b"\0" + data + b"\0")
    assert deploy.source_digest(str(policy)) == h.hexdigest()
    assert deploy.source_digest(None) != h.hexdigest()


@contextmanager
def _gcloud_at(fake: fake_gcp.FakeGcp, tmp: Path) -> Iterator[deploy.Runner]:
    """The real gcloud against the fake APIs: the deploy-emulator test's one gcloud interpreter."""
    from tests.tools.gcloud_batch import GcloudWorker
    from tests.tools.test_deploy_emulator import _env_at

    worker = GcloudWorker(_env_at(fake, tmp), tmp)
    try:
        yield worker.run
    finally:
        worker.close()


def test_the_notification_key_is_generated_once_in_a_private_file_and_never_shown(tmp_path: Path) -> None:
    """Issue 35 (low): the key that seals notifications is a secret deploy creates with a random
    value: written 0600 in a directory of this run just before gcloud reads it, gone after; a
    second deploy finds the secret and leaves its value. Through the real gcloud and the fake APIs."""
    from pitstop.local import fake_gcp

    fake = fake_gcp.FakeGcp()
    server = fake_gcp.serve(fake)
    try:
        (step,) = [
            s
            for s in deploy.plan("p-1234", "us-central1", CONF)
            if s.argv[:3] == ["secrets", "create", "pitstop-notify-key"]
        ]
        lines, seen = list[str](), list[tuple[str, int, str]]()
        with _gcloud_at(fake, tmp_path) as gcloud:

            def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
                for a in argv:
                    if a.startswith("--data-file="):
                        path = Path(a.split("=", 1)[1])
                        seen.append((str(path.parent), path.stat().st_mode & 0o777, path.read_text()))
                return gcloud(argv)

            assert deploy.apply([step], run, lines.append) == 0
            ((where, mode, value),) = seen
            assert mode == 0o600 and re.fullmatch(r"[0-9a-f]{64}", value) and not Path(where).exists()
            (version,) = [
                r for (api, n), r in fake.resources.items() if api == "secretmanager" and "/versions/" in n
            ]
            assert base64.b64decode(version["payload"]["data"]).decode() == value
            assert value not in "".join(lines)
            assert deploy.apply([step], run, lines.append) == 0 and len(seen) == 1  # exists: kept as it is
    finally:
        server.shutdown()


def test_apply_is_idempotent_and_fills_placeholders(steps: list[deploy.Step]) -> None:
    existing: set[str] = set()
    calls: list[list[str]] = []

    def fake_gcloud(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = ""
        if "describe" in argv or argv[:2] == ["projects", "describe"]:
            key = " ".join(argv[:4])
            rc = 0 if key in existing or "--format" in " ".join(argv) else 1
            if "projectNumber" in " ".join(argv):
                out = "123456789"
            elif "serviceConfig.uri" in " ".join(argv):
                out = f"https://{argv[2]}-xyz.a.run.app"
            elif "eventTrigger.trigger" in " ".join(argv):
                out = f"projects/p/locations/us-central1/triggers/{argv[2]}-trigger"
            elif "transport.pubsub.subscription" in " ".join(argv):
                out = f"projects/p/subscriptions/eventarc-us-central1-{argv[3].rsplit('/', 1)[-1]}-sub-123"
            elif "writerIdentity" in " ".join(argv):
                out = "serviceAccount:service-123@gcp-sa-logging.iam.gserviceaccount.com"
            return subprocess.CompletedProcess(argv, rc, out or ("name: x" if rc == 0 else ""), "")
        if argv[:3] == [
            API,
            "GET",
            "projects/my-train-proj/notificationChannels",
        ]:  # the channel, by its name once made
            made = [API, "POST", "projects/my-train-proj/notificationChannels"] in [c[:3] for c in calls[:-1]]
            return subprocess.CompletedProcess(
                argv, 0, "projects/p/notificationChannels/7\n" if made else "", ""
            )
        for s in steps:
            if s.argv == argv and s.check is not None:
                existing.add(" ".join(s.check[:4]))
        return subprocess.CompletedProcess(argv, 0, "", "")

    logs: list[str] = []
    assert deploy.apply(steps, fake_gcloud, logs.append) == 0
    first = [c for c in calls if "create" in c]
    assert not any("<" in a for c in calls for a in c)
    assert any(
        "--member=serviceAccount:service-123@gcp-sa-logging.iam.gserviceaccount.com" in c for c in calls
    )
    assert any("eventarc-us-central1-pitstop-ingest-trigger-sub-123" in a for c in calls for a in c)
    assert any("notificationChannels=projects/p/notificationChannels/7" in c for c in calls)
    calls.clear()
    logs.clear()
    assert deploy.apply(steps, fake_gcloud, logs.append) == 0
    second = [c for c in calls if "create" in c]
    assert len(second) < len(first)
    assert not any(c[:3] == ["pubsub", "topics", "create"] for c in second)
    assert any(line.startswith("exists") for line in logs)
    assert any(c[:3] == ["logging", "sinks", "update"] for c in calls)  # filters converge on re-run


SINK_WRITER = "serviceAccount:service-1234@gcp-sa-logging.iam.gserviceaccount.com"
SAMPLE_VALUES = {  # what the placeholders hold at run time, so gcloud's own validation applies
    "<project-number>": "123456789012",
    "<pitstop-actuate-url>": "https://pitstop-actuate-abc123-uc.a.run.app",
    "<pitstop-sweep-url>": "https://pitstop-sweep-abc123-uc.a.run.app",
    "<pitstop-ingest-trigger>": "projects/my-train-proj/locations/us-central1/triggers/pitstop-ingest-123456",
    "<pitstop-notify-trigger>": "projects/my-train-proj/locations/us-central1/triggers/pitstop-notify-123456",
    "<pitstop-ingest-trigger-subscription>": "eventarc-us-central1-pitstop-ingest-123456-sub-781",
    "<pitstop-notify-trigger-subscription>": "eventarc-us-central1-pitstop-notify-123456-sub-782",
    "<pitstop-ingest-alerts-trigger-subscription>": "eventarc-us-central1-pitstop-ingest-alerts-sub-783",
    "<pitstop-gpu-xid-writer-identity>": SINK_WRITER,
    "<pitstop-system-events-writer-identity>": SINK_WRITER,
    "<existing>": "1234567890",  # a dashboard id a check printed
    "<gke-credentials>": "/tmp/pitstop-deploy-x",
}


def _parse_env(cfg: str) -> dict[str, str]:
    """No credentials, no prompts, every API pointed at a closed local port: a valid command stops at auth."""
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": cfg,
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
    }
    for api in (
        "CLOUDFUNCTIONS",
        "RUN",
        "PUBSUB",
        "WORKFLOWS",
        "FIRESTORE",
        "LOGGING",
        "MONITORING",
        "SECRETMANAGER",
        "CLOUDSCHEDULER",
        "IAM",
        "SERVICEUSAGE",
        "CLOUDRESOURCEMANAGER",
        "EVENTARC",
        "CONTAINER",
    ):
        env[f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{api}"] = "http://127.0.0.1:9/"  # never a real Google endpoint
    return env


def _with_samples(line: str) -> list[str]:
    for k, v in SAMPLE_VALUES.items():
        line = line.replace(k, v)
    argv = shlex.split(line)
    assert argv[0] == "gcloud", line
    return argv[1:]


def _gcloud_lines(steps: list[deploy.Step]) -> list[str]:
    """Every gcloud command a plan can run: steps, checks, updates, deletes, captures, credentials, gates
    (not the REST calls deploy makes itself, deploy_monitoring)."""
    steps = [s for s in steps if not deploy_monitoring.is_api(s.argv)]
    plain = [s for s in steps if s.program == "gcloud"]
    lines = [shlex.join(["gcloud", *s.argv]) for s in plain]
    lines += [shlex.join(["gcloud", *s.check]) for s in steps if s.check]
    lines += [shlex.join(["gcloud", *s.update]) for s in steps if s.update]
    lines += [shlex.join(["gcloud", *s.delete]) for s in plain if s.delete]
    lines += [shlex.join(["gcloud", *s.purge]) for s in steps if s.purge]
    lines += [shlex.join(["gcloud", *s.credentials]) for s in steps if s.credentials]
    lines += [
        shlex.join(["gcloud", *argv])
        for s in steps
        for argv in s.captures.values()
        if not deploy_monitoring.is_api(argv)
    ]
    lines += [shlex.join(["gcloud", *argv]) for s in steps if s.gate for argv in s.gate.commands]
    return sorted(set(lines))


def _condition_shape(flag: str) -> str:
    """A condition's first attribute and function: each generator's own grammar is parsed once."""
    return "(if " + re.split(r"[ (]", flag.removeprefix("--condition=expression="), maxsplit=1)[0] + ")"


def _shape(line: str) -> tuple[str, tuple[str, ...]]:
    """A command's grammar: its command path and the flags it passes (a condition counted apart).

    Lines of one shape differ only in names the same builder filled in, so one of each is parsed.
    """
    words = shlex.split(line)
    path = next((words[:i] for i, w in enumerate(words) if w.startswith("-")), words)
    flags = [
        w.split("=", 1)[0] + (_condition_shape(w) if w.startswith("--condition=expr") else "") for w in words
    ]
    return " ".join(path[:4]), tuple(sorted(f for f in flags if f.startswith("-")))


@pytest.mark.timeout(600)  # ~80 commands in one gcloud interpreter: a hang guard, not a speed check
def test_every_command_is_accepted_by_the_real_gcloud_parser(
    steps: list[deploy.Step], gke_steps: list[deploy.Step]
) -> None:
    every = _gcloud_lines([*steps, *gke_steps])
    lines = list({_shape(ln): ln for ln in every}.values())  # one of each shape: minutes under load
    assert len(lines) < len(every)
    assert any(" container clusters get-credentials " in ln for ln in lines)
    assert any(" container node-pools list --cluster=" in ln for ln in lines)
    assert any(" firestore bulk-delete --database=" in ln for ln in lines)
    assert any(" resource-manager org-policies describe " in ln for ln in lines)
    assert any("--condition=expression=resource.name.startsWith(" in ln for ln in lines)
    assert any(
        '--condition=expression=resource.type == "compute.googleapis.com/Instance" && ' in ln for ln in lines
    )
    for s in steps:  # files gcloud reads at parse time, written by apply() just before use
        deploy.write_config_files([*s.argv, *(s.update or [])])
    from tests.tools.gcloud_batch import GcloudWorker

    work = Path(tempfile.mkdtemp(prefix="gcloud-parse-"))
    worker = GcloudWorker(_parse_env(str(work / "config")), work)  # gcloud's own parser, one start-up
    try:
        results = [(ln, (p := worker.run(_with_samples(ln))).returncode, p.stderr) for ln in lines]
    finally:
        worker.close()
    usage = [(ln, err.strip().splitlines()[-1:]) for ln, rc, err in results if rc == 2]
    assert usage == [], usage  # 2 = usage error; without credentials a valid command stops at auth (1)
    assert all(rc == 1 for _, rc, _ in results), [(ln, rc) for ln, rc, _ in results if rc != 1]


def _rbac_steps(gke_steps: list[deploy.Step]) -> list[deploy.Step]:
    return [s for s in gke_steps if s.program == "kubectl" and s.overlay is not None]


def test_kubectl_accepts_the_kustomize_commands(gke_steps: list[deploy.Step]) -> None:
    """kubectl parses flags before --help: an unknown flag is an error (1), a valid line prints help (0)."""
    kustomize = [s for s in gke_steps if s.program == "kubectl"]
    assert len(kustomize) == 2  # per cluster: the base infra/gke
    for s in kustomize:
        for argv in (s.argv, s.delete or []):
            assert argv[:2] in (["apply", "-k"], ["delete", "-k"])
            proc = subprocess.run(["kubectl", *argv, "--help"], capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, (argv, proc.stderr)
    bad = subprocess.run(["kubectl", "apply", "-k", "x", "--no-such-flag", "--help"], capture_output=True)
    assert bad.returncode != 0


def _manifests(*names: str) -> list[dict[str, Any]]:
    return [d for n in names for d in yaml.safe_load_all((ROOT / "infra" / "gke" / n).read_text()) if d]


def _key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def _kustomized(directory: str) -> list[dict[str, Any]]:
    """What `kubectl apply -k` sends: the overlay rendered by the installed kubectl's kustomize."""
    proc = subprocess.run(["kubectl", "kustomize", directory], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return sorted((d for d in yaml.safe_load_all(proc.stdout) if d), key=_key)


def _substituted(actuator: str, ingest: str) -> list[dict[str, Any]]:
    """What deploy applied before the kustomize base: both files, each ${...} replaced (sed | kubectl)."""
    text = "\n---\n".join((ROOT / "infra" / "gke" / n).read_text() for n in ("clusterrole.yaml", "npd.yaml"))
    text = text.replace("${ACTUATOR_SA}", actuator).replace("${INGEST_SA}", ingest)
    return sorted((d for d in yaml.safe_load_all(text) if d), key=_key)


def test_the_base_lists_every_manifest_of_infra_gke() -> None:
    """A GitOps tool pointed at infra/gke gets every file deploy applies (kubectl kustomize, for real)."""
    listed = yaml.safe_load((ROOT / "infra" / "gke" / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(
        p.name for p in (ROOT / "infra" / "gke").glob("*.yaml") if p.stem != "kustomization"
    )
    assert [_key(d) for d in _kustomized(str(ROOT / "infra" / "gke"))] == [
        _key(d) for d in _substituted("${ACTUATOR_SA}", "${INGEST_SA}")
    ]


def test_gke_pieces_are_applied_with_kustomize_naming_the_accounts_and_credentials_kept_private(
    gke_steps: list[deploy.Step],
) -> None:
    """Each cluster: gcloud writes its credentials, then `kubectl apply -k` an overlay of infra/gke
    whose render (by the real kubectl) is object for object what the sed-substituted manifests were."""
    rbac = _rbac_steps(gke_steps)
    seen: list[tuple[str, list[str], dict[str, str]]] = []
    rendered: list[list[dict[str, Any]]] = []

    def tool(program: str, argv: list[str], env: Mapping[str, str]) -> Proc:
        seen.append((program, argv, dict(env)))
        kubeconfig = Path(env["KUBECONFIG"])
        if program == "gcloud":
            assert oct(kubeconfig.parent.stat().st_mode & 0o777) == "0o700"
            kubeconfig.write_text("credentials")
        else:
            assert kubeconfig.read_text() == "credentials"  # kubectl uses what gcloud just wrote
            overlay = argv[argv.index("-k") + 1]
            assert Path(overlay).parent == kubeconfig.parent  # in the run's private directory
            rendered.append(_kustomized(overlay))
        return Proc(argv, 0, "", "")

    logs: list[str] = []
    assert deploy.apply(rbac, _never_gcloud, logs.append, tool) == 0
    assert [x[0] for x in seen] == ["gcloud", "kubectl", "gcloud", "kubectl"]
    creds = ["container", "clusters", "get-credentials", "gpu-a3", "--location=us-central1"]
    assert seen[0][1] == [*creds, "--project", "my-train-proj"]
    assert seen[2][1][3:] == ["tpu-b", "--location=europe-west4-b", "--project", "ml-other-proj"]
    assert seen[1][1][:2] == ["apply", "-k"] and seen[1][1][2].endswith(
        "/my-train-proj.us-central1.gpu-a3.kustomize"
    )
    actuator, ingest = (f"pitstop-{a}@my-train-proj.iam.gserviceaccount.com" for a in ("actuate", "ingest"))
    want = _substituted(actuator, ingest)
    assert rendered == [want, want]  # both clusters name the accounts of Pitstop's project
    assert actuator in json.dumps(want) and "${" not in json.dumps(want)
    assert seen[0][2] == seen[1][2] != seen[2][2]  # one kubeconfig per cluster, shared by its two commands
    assert not Path(seen[0][2]["KUBECONFIG"]).parent.exists()  # removed when the run ends
    seen.clear()
    rendered.clear()
    assert deploy.teardown(rbac, False, _never_gcloud, logs.append, tool) == 0
    assert [(x[0], x[1][:2]) for x in seen] == [
        ("gcloud", ["container", "clusters"]),
        ("kubectl", ["delete", "-k"]),
    ] * 2
    assert rendered == [want, want]  # teardown deletes exactly what apply applied


def test_a_changed_policy_redeploys_the_functions_and_nothing_else(tmp_path: Path) -> None:
    def labels(policy_text: str | None) -> dict[str, str]:
        conf = dict(CONF)
        if policy_text is not None:
            (tmp_path / "policy.yaml").write_text(policy_text)
            conf["policy"] = str(tmp_path / "policy.yaml")
        return {s.what: s.expect for s in deploy.plan("my-train-proj", "us-central1", conf) if s.expect}

    shipped, observe, enforce = labels(None), labels("mode: observe\n"), labels("mode: enforce\n")
    unbound = (
        "function pitstop-notify without PITSTOP_WEBHOOK_URL: add a version to pitstop-webhook, deploy again"
    )
    assert set(shipped) == {f"function pitstop-{f}" for f in ("ingest", "actuate", "notify", "sweep")} | {
        "workflow pitstop-remediate",
        unbound,  # notify until its secret has a version
    }
    assert shipped == labels(None)  # stable: a rerun with the same inputs is "current"
    changed = {k for k in shipped if observe[k] != enforce[k]}
    assert changed == {k for k in shipped if k.startswith("function ")}


def test_gke_rbac_lets_ingest_get_nodes_and_nothing_else(
    gke_steps: list[deploy.Step], tmp_path: Path
) -> None:
    """ingest reads one Node by name (spec.providerID: a regional node's zone; the XidCriticalError
    condition that corroborates a serial-console Xid line); a get of a node returns its status too."""
    rbac = _rbac_steps(gke_steps)
    assert len(rbac) == 2 and all(s.overlay == rbac[0].overlay for s in rbac)
    email = "pitstop-{}@my-train-proj.iam.gserviceaccount.com".format
    assert rbac[0].overlay is not None
    assert rbac[0].overlay.accounts == {"actuator": email("actuate"), "ingest": email("ingest")}
    docs = _manifests("clusterrole.yaml", "npd.yaml")
    named = [d for d in docs if "${INGEST_SA}" in json.dumps(d)]  # ingest's account, in one binding only
    assert [(d["kind"], d["metadata"]["name"]) for d in named] == [
        ("ClusterRoleBinding", "pitstop-ingest-reader")
    ]
    (binding,) = named
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "pitstop-ingest-reader",
    }
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "${INGEST_SA}"}
    ]
    (role,) = [
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == binding["roleRef"]["name"]
    ]
    assert set(role) == {"apiVersion", "kind", "metadata", "rules"}  # no aggregationRule to widen it
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    bound = [
        d
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")  # RBAC's: an admission binding has no roleRef
        and d["roleRef"]["name"] == role["metadata"]["name"]
    ]
    assert bound == [binding]  # and no other account holds ingest's role
    directory = tmp_path / "overlay"
    rbac[0].overlay.write(directory)
    applied = {
        d["metadata"]["name"]: d for d in _kustomized(str(directory)) if d["kind"] == "ClusterRoleBinding"
    }
    assert [x["name"] for x in applied["pitstop-ingest-reader"]["subjects"]] == [email("ingest")]
    assert [x["name"] for x in applied["pitstop-actuator"]["subjects"]] == [email("actuate")]


def _never_gcloud(argv: list[str]) -> Proc:
    raise AssertionError(f"plain gcloud was not expected: {argv}")


Proc = subprocess.CompletedProcess[str]


@pytest.mark.parametrize(
    ("pools", "policy", "rc", "want"),
    [
        ("", "", 0, ["ok", "ok"]),
        ("old-a3\nold-h100\n", "", 0, ["ok", "warning: old-a3 old-h100"]),
        ("", "True", 0, ["warning", "ok"]),
        ("", "", 1, ["could not check", "could not check"]),
    ],
)
def test_gke_logging_checks_warn_and_never_fail_the_deploy(
    gke_steps: list[deploy.Step], pools: str, policy: str, rc: int, want: list[str]
) -> None:
    checks = [s for s in gke_steps if s.warn is not None and "my-train-proj" in s.argv]
    assert [s.argv[:2] for s in checks] == [["resource-manager", "org-policies"], ["container", "node-pools"]]

    def gcloud(argv: list[str]) -> Proc:
        out = policy if argv[0] == "resource-manager" else pools
        return Proc(argv, rc, out, "permission denied" if rc else "")

    logs: list[str] = []
    assert deploy.apply(checks, gcloud, logs.append) == 0
    for line, w in zip(logs, want, strict=True):
        if w == "ok":
            assert line.startswith("ok "), line
        elif w == "could not check":
            assert line.startswith("warning ") and "could not check: permission denied" in line, line
        else:
            assert line.startswith("warning "), line
            assert line.endswith(w.removeprefix("warning")) or w == "warning", line
    if policy == "True":
        assert "compute.disableSerialPortLogging is enforced" in logs[0]


def _collections_the_code_writes() -> set[str]:
    """Collection ids in the shipped code and the agent, as `<prefix>_<name>` names or subcollections."""
    names: set[str] = set()
    for f in (ROOT / "functions").rglob("*.py"):
        if "local" in f.parts:
            continue
        src = f.read_text()
        names |= set(re.findall(r'collection\(\s*f"\{[^}]*\}_([a-z_]+)"', src))
        names |= set(re.findall(r'replace\("_incidents", "_([a-z_]+)"\)', src))
        names |= {n.removeprefix("pitstop_") for n in re.findall(r'\.collection\("([a-z_]+)"\)', src)}
    # the incident store's own collections, one `<prefix>_<field>` each (adapters/firestore_docs.py)
    from dataclasses import fields

    from pitstop.adapters.firestore_docs import Collections

    return names | {f.name for f in fields(Collections)}


def test_purge_deletes_every_collection_pitstop_writes_and_only_when_asked(steps: list[deploy.Step]) -> None:
    calls: list[list[str]] = []

    def gcloud(argv: list[str]) -> Proc:
        calls.append(argv)
        return Proc(argv, 0, "", "")

    logs: list[str] = []
    assert deploy.teardown(steps, False, gcloud, logs.append) == 0
    assert not [c for c in calls if "bulk-delete" in c]
    assert not [c for c in calls if c[:3] == ["firestore", "databases", "delete"]]
    calls.clear()
    assert deploy.teardown(steps, True, gcloud, logs.append) == 0
    purges = [c for c in calls if c[:2] == ["firestore", "bulk-delete"]]
    assert sorted(p[2] for p in purges) == ["--database=pitstop", "--database=pitstop-notify"]
    assert all("--quiet" in p for p in purges)
    ids = [
        i
        for p in purges
        for i in next(a for a in p if a.startswith("--collection-ids=")).split("=", 1)[1].split(",")
    ]
    code = _collections_the_code_writes()
    assert {"outbox", "dedup", "incidents", "slurm_results", "notifications", "jobs", "steps"} <= code
    assert {i.removeprefix("pitstop_") for i in ids} == code  # every one, and nothing else
    assert "pitstop_outbox" in ids and "steps" in ids
    assert any(line.startswith("purging ") and "pitstop_outbox" in line for line in logs)


def test_purge_uses_the_policys_collection_prefix(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("store: {collection_prefix: team_a}\n")
    step, ledger = [
        s for s in deploy.plan("my-train-proj", "us-central1", {**CONF, "policy": str(policy)}) if s.purge
    ]
    assert step.purge is not None and ledger.purge is not None
    assert "--collection-ids=team_a_incidents,team_a_nodes," in " ".join(step.purge)
    assert "--collection-ids=team_a_notifications" in ledger.purge
    ttls = [
        s
        for s in deploy.plan("my-train-proj", "us-central1", {**CONF, "policy": str(policy)})
        if "ttls" in s.argv
    ]
    assert [s.argv[5] for s in ttls] == [
        "--collection-group=team_a_dedup",
        "--collection-group=team_a_outbox",
        "--collection-group=team_a_resolved",
        "--collection-group=team_a_counts",
    ]


def test_ttls_cover_the_dedup_records_and_the_outbox_in_pitstops_database(steps: list[deploy.Step]) -> None:
    ttls = [s.argv for s in steps if s.argv[:4] == ["firestore", "fields", "ttls", "update"]]
    assert [(a[4], a[5], a[6]) for a in ttls] == [
        ("expire_at", "--collection-group=pitstop_dedup", "--database=pitstop"),
        ("expire_at", "--collection-group=pitstop_outbox", "--database=pitstop"),
        ("expire_at", "--collection-group=pitstop_resolved", "--database=pitstop"),
        # count pages (adapters/firestore_counts.py): an instance gone, its pages expire
        ("expire_at", "--collection-group=pitstop_counts", "--database=pitstop"),
    ]
    db, ndb = [s for s in steps if s.argv[:3] == ["firestore", "databases", "create"]]
    assert "--database=pitstop" in db.argv and db.check is not None and "--database=pitstop" in db.check
    assert db.delete is None  # teardown keeps the incidents unless --purge
    assert "--database=pitstop-notify" in ndb.argv and ndb.delete is None
    fns = [s.argv for s in steps if s.argv[:2] == ["functions", "deploy"]]
    assert all(any("PITSTOP_FIRESTORE_DATABASE=pitstop" in a for a in argv) for argv in fns)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gke_clusters", [{"name": "Bad_Name", "location": "us-central1"}]),
        ("gke_clusters", [{"name": "a", "location": "mars"}]),
        ("gke_clusters", [{"name": "a", "location": "us-central1", "project": "X;rm"}]),
        ("gke_clusters", [{"name": "a", "location": "us-central1", "zone": "x"}]),
        ("gke_clusters", ["just-a-name"]),
        ("compute_zones", ["us-central1-a/a3"]),
        ("compute_zones", [{"zone": "us-central1", "name_prefix": "a3-"}]),  # a prefix needs a zone
        ("compute_zones", [{"zone": "us-central1-a", "name_prefix": "A3*"}]),
        ("compute_zones", [{"zone": "us-central1-a", "project": "1"}]),
        ("firestore_database", "(default)"),
        ("firestore_database", "x"),
        ("notify_database", "pitstop"),  # notify's own, never the incidents' database
        ("notify_database", "(default)"),
    ],
)
def test_gke_zone_and_database_settings_are_checked(key: str, value: Any, tmp_path: Path) -> None:
    conf = tmp_path / "deploy.yaml"
    conf.write_text(yaml.safe_dump({key: value}))
    with pytest.raises(ValueError, match=key):
        deploy.load_config(str(conf))


def test_notify_reaches_only_its_own_ledger_database(steps: list[deploy.Step]) -> None:
    """Issue 21 (12): notify held datastore.user on Pitstop's whole database, so it could write an
    incident or a pending step that the sweep starts. Firestore IAM conditions name a database,
    never a collection, so its ledger lives in a database of its own and its grant names only that;
    no other identity's condition admits that database, and notify's admits no other."""
    binds = [s for s in steps if "--role=roles/datastore.user" in s.argv]
    by_member = {next(a for a in b.argv if a.startswith("--member=")): b for b in binds}
    notify = by_member["--member=serviceAccount:pitstop-notify@my-train-proj.iam.gserviceaccount.com"]
    (cond,) = [a for a in notify.argv if a.startswith("--condition=")]
    assert 'resource.name == "projects/my-train-proj/databases/pitstop-notify"' in cond
    assert 'resource.name.startsWith("projects/my-train-proj/databases/pitstop-notify/")' in cond
    assert '"projects/my-train-proj/databases/pitstop"' not in cond and "databases/pitstop/" not in cond
    for member, b in by_member.items():
        if "pitstop-notify@" not in member:
            (other,) = [a for a in b.argv if a.startswith("--condition=")]
            assert "pitstop-notify" not in other, member  # the others' condition: pitstop and below only
            assert 'startsWith("projects/my-train-proj/databases/pitstop/")' in other, member
    # the ledger is what notify's database holds; the incidents' database no longer lists it
    dbs = {s.argv[3]: s for s in steps if s.argv[:3] == ["firestore", "databases", "create"]}
    assert set(dbs) == {"--database=pitstop", "--database=pitstop-notify"}
    main_purge, notify_purge = dbs["--database=pitstop"].purge, dbs["--database=pitstop-notify"].purge
    assert main_purge is not None and notify_purge is not None
    assert "pitstop_notifications" not in " ".join(main_purge) and "pitstop_incidents" in " ".join(main_purge)
    assert "--collection-ids=pitstop_notifications" in notify_purge
    fns = [s.argv for s in steps if s.argv[:3] == ["functions", "deploy", "pitstop-notify"]]
    assert len(fns) == 2  # with its secrets, and without them until they have a version
    assert all(any("PITSTOP_NOTIFY_DATABASE=pitstop-notify" in a for a in fn) for fn in fns)


class _OnlyGet:
    """Compute's instances client as the node lookup may use it: any other call fails the test."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def get(self, request: dict[str, Any], **_: Any) -> Any:
        from google.api_core import exceptions as gexc

        self.requests.append(dict(request))
        raise gexc.NotFound("not in this zone")  # type: ignore[no-untyped-call]

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the node lookup called instances.{name}")


def _admits(expression: str, name: str, kind: str = "compute.googleapis.com/Instance") -> bool:
    """The node-lookup condition evaluated on one resource: exactly its three clauses' grammar
    (type ==, name startsWith one of several, extract("/instances/{name}") startsWith), the
    semantics Google documents (infra/roles/pitstop-node-lookup.yaml); anything else fails."""
    m = re.fullmatch(
        r'resource\.type == "([^"]+)" && \(?((?:resource\.name\.startsWith\("[^"]+"\)(?: \|\| )?)+)\)? && '
        r'resource\.name\.extract\("/instances/\{name\}"\)\.startsWith\("([^"]+)"\)',
        expression,
    )
    assert m is not None, expression
    wheres = re.findall(r'startsWith\("([^"]+)"\)', m.group(2))
    _, found, instance = name.partition("/instances/")
    return (
        kind == m.group(1)
        and any(name.startswith(w) for w in wheres)
        and bool(found)
        and (instance.startswith(m.group(3)))
    )


def test_the_node_lookup_grant_is_exactly_what_the_lookup_calls(
    steps: list[deploy.Step], gke_steps: list[deploy.Step]
) -> None:
    """Issue 21 (12): pitstopNodeLookup holds compute.instances.get and nothing else (the custom
    role test pins the set; no list permission: a list returns every VM of the project), it
    exists and is granted only in projects with a configured GKE cluster, to ingest alone, under
    a condition that admits only instances named gke-* in the zones of that project's clusters;
    and the only calls the lookup makes are instances.get of the node's exact name in the
    cluster's zones. Dropping or widening the condition, or the lookup asking anything else,
    fails here."""
    from pitstop.adapters.gke.zone import ZoneResolver

    lookup = [a for s in steps for a in s.argv if "pitstopNodeLookup" in a]
    assert lookup == []  # no GKE cluster in deploy.yaml: no role, no grant
    created = [s.argv for s in gke_steps if "pitstopNodeLookup" in s.argv and "create" in s.argv]
    assert {a[a.index("--project") + 1] if "--project" in a else "" for a in created} <= {
        "my-train-proj",
        "ml-other-proj",
    }
    binds = [s.argv for s in gke_steps if any(a.endswith("/roles/pitstopNodeLookup") for a in s.argv)]
    binds = [b for b in binds if "add-iam-policy-binding" in b]
    assert {next(a for a in b if a.startswith("--member=")) for b in binds} == {
        "--member=serviceAccount:pitstop-ingest@my-train-proj.iam.gserviceaccount.com"
    }
    conds = {b[2]: next(a for a in b if a.startswith("--condition=")) for b in binds}
    assert set(conds) == {"my-train-proj", "ml-other-proj"} and len(binds) == 2
    expr = {p: c.removeprefix("--condition=expression=").rsplit(",title=", 1) for p, c in conds.items()}
    assert {t for _, t in expr.values()} == {"pitstop-gke-node-lookup"}
    regional, zonal = expr["my-train-proj"][0], expr["ml-other-proj"][0]  # gpu-a3: us-central1; tpu-b
    assert 'resource.name.startsWith("projects/my-train-proj/zones/us-central1-")' in regional
    assert 'resource.name.startsWith("projects/ml-other-proj/zones/europe-west4-b/")' in zonal
    node = "instances/gke-gpu-a3-pool-1-abcd"
    assert _admits(regional, f"projects/my-train-proj/zones/us-central1-f/{node}")
    assert _admits(zonal, f"projects/ml-other-proj/zones/europe-west4-b/{node}")
    for name, kind in (
        (f"projects/my-train-proj/zones/us-east5-b/{node}", ""),  # another region
        (f"projects/ml-other-proj/zones/us-central1-f/{node}", ""),  # another project
        ("projects/my-train-proj/zones/us-central1-f/instances/train-vm-1", ""),  # not a GKE node
        (f"projects/my-train-proj/zones/us-central1-f/disks/{node.split('/')[1]}", ""),  # not an instance
        (f"projects/my-train-proj/zones/us-central1-f/{node}", "compute.googleapis.com/Disk"),
        ("projects/my-train-proj", "cloudresourcemanager.googleapis.com/Project"),  # a list's check
    ):
        assert not _admits(regional, name, kind or "compute.googleapis.com/Instance"), name
    role = yaml.safe_load((ROOT / "infra" / "roles" / "pitstop-node-lookup.yaml").read_text())
    assert role["includedPermissions"] == ["compute.instances.get"]
    client = _OnlyGet()
    zones = ["us-central1-a", "us-central1-b", "europe-west4-a"]
    resolver = ZoneResolver(instances=client, clusters=lambda p, loc, c: zones)
    answer = resolver.resolve("ml-other-proj", "us-central1", "gke-train-pool-1-abcd", "train")
    assert answer.zone is None and client.requests == [
        {"project": "ml-other-proj", "zone": z, "instance": "gke-train-pool-1-abcd"} for z in zones[:2]
    ]


def test_node_lookup_conditions_stay_within_iams_operator_limit() -> None:
    """12 logical operators per condition: two ANDs, so 11 locations per binding, then another."""
    locs = [f"us-east{i}" for i in range(1, 14)]
    conds = deploy.node_lookup_conditions("p-1234", locs)
    assert [c["title"] for c in conds] == ["pitstop-gke-node-lookup", "pitstop-gke-node-lookup-2"]
    for c in conds:
        assert c["expression"].count("&&") + c["expression"].count("||") <= 12
    assert sum(c["expression"].count('startsWith("projects/') for c in conds) == 13


def test_a_named_prefix_admits_only_its_migs_by_exact_name() -> None:
    """Issue 21 (12): instanceGroupManagers.update can resize, abandon or re-template a group; a
    prefix once admitted every MIG of its zone. Now only the MIGs deploy.yaml names, by name."""
    conf = {**CONF, "compute_zones": [{"zone": "us-east5-b", "name_prefix": "a3-", "migs": ["a3-node"]}]}
    scope = deploy.compute_scope(conf, "p-1234")["p-1234"]
    (cond,) = deploy.compute_conditions("p-1234", scope)
    clauses = cond["expression"].split(" || ")
    assert clauses == [
        'resource.name.startsWith("projects/p-1234/zones/us-east5-b/instances/a3-")',
        'resource.name == "projects/p-1234/zones/us-east5-b/instanceGroupManagers/a3-node"',
    ]
    assert not [c for c in clauses if 'instanceGroupManagers/")' in c]  # never a zone's every MIG
    no_migs = deploy.compute_scope(
        {**CONF, "compute_zones": [{"zone": "us-east5-b", "name_prefix": "a3-"}]}, "p-1234"
    )
    assert (
        "instanceGroupManagers" not in deploy.compute_conditions("p-1234", no_migs["p-1234"])[0]["expression"]
    )
    for bad in (["A3 NODE"], "a3-node", [""]):
        with pytest.raises(ValueError, match="migs"):
            deploy.compute_scope(
                {**CONF, "compute_zones": [{"zone": "us-east5-b", "name_prefix": "a3-", "migs": bad}]},
                "p-1234",
            )


def _actuator_admits(conds: list[IamCondition], name: str) -> bool:
    """The actuator's conditions (startsWith and == on resource.name, joined by ||) evaluated by a
    CEL interpreter on one resource name: any binding's condition true admits it."""
    return any(_cel(c["expression"], resource={"name": name}) for c in conds)


def test_a_gke_cluster_admits_its_node_pools_migs_and_vms_by_name_and_nothing_else_of_its_region() -> None:
    """Issue 35 (9): a regional GKE cluster once added resource.name.startsWith("projects/P/zones/
    us-central1-"), so instanceGroupManagers.update (resize, abandon, re-template) and reset covered
    every VM and MIG of the region. Now each node pool's MIG by its exact name and the VMs it names."""
    conf = {
        **CONF,
        "gke_clusters": [
            {
                "name": "gpu-a3",
                "location": "us-central1",
                "node_groups": [
                    "us-central1-a/gke-gpu-a3-a3-1a2b3c4d-grp",
                    "us-central1-c/gke-gpu-a3-a3-9f9f9f9f-grp",
                ],
            }
        ],
    }
    conds = deploy.compute_conditions("p-1234", deploy.compute_scope(conf, "p-1234")["p-1234"])
    zones = "projects/p-1234/zones"
    admitted = [
        f"{zones}/us-central1-a/instances/gke-gpu-a3-a3-1a2b3c4d-x7k2",
        f"{zones}/us-central1-a/instanceGroupManagers/gke-gpu-a3-a3-1a2b3c4d-grp",
        f"{zones}/us-central1-c/instances/gke-gpu-a3-a3-9f9f9f9f-0abc",
    ]
    refused = [
        f"{zones}/us-central1-a/instances/training-vm-1",  # a VM of the region that is no node
        f"{zones}/us-central1-b/instanceGroupManagers/web-frontend",  # another MIG of the region
        f"{zones}/us-central1-a/instanceGroupManagers/gke-gpu-a3-a3-1a2b3c4d-grp2",
        f"{zones}/us-central1-c/instances/gke-gpu-a3-a3-1a2b3c4d-x7k2",  # a pool's name, another zone
        f"{zones}/us-central1-a/instances/gke-other-cluster-pool-1a2b3c4d-x7k2",
    ]
    assert [n for n in admitted if not _actuator_admits(conds, n)] == []
    assert [n for n in refused if _actuator_admits(conds, n)] == []
    cluster = {"name": "gpu-a3", "location": "us-central1"}
    for bad in (["us-central1-a/web-frontend"], ["europe-west4-a/gke-gpu-a3-a3-1a2b3c4d-grp"], "x"):
        with pytest.raises(ValueError, match=r"node_groups|node group|node pool"):
            deploy.compute_scope({**CONF, "gke_clusters": [{**cluster, "node_groups": bad}]}, "p-1234")


def test_deploy_reads_each_gke_clusters_node_groups_through_gcloud(tmp_path: Path) -> None:
    """A cluster that lists no node_groups has them read from its node pools' instanceGroupUrls
    (gcloud container node-pools list, the real gcloud against the recording fake of the APIs); a
    cluster whose pools cannot be read stops the deploy rather than granting its region."""
    from pitstop.local import fake_gcp

    fake = fake_gcp.FakeGcp()
    server = fake_gcp.serve(fake)
    try:
        url = "https://www.googleapis.com/compute/v1/projects/p-1234/zones/{}/instanceGroupManagers/{}"
        pools = "projects/p-1234/locations/us-central1/clusters/gpu-a3/nodePools"
        fake.resources[("container", pools.removesuffix("/nodePools"))] = {"name": "gpu-a3"}
        fake.resources[("container", f"{pools}/a3")] = {
            "name": "a3",
            "instanceGroupUrls": [
                url.format(z, f"gke-gpu-a3-a3-{h}-grp")
                for z, h in (("us-central1-a", "1a2b3c4d"), ("us-central1-b", "5e6f7a8b"))
            ],
        }
        fake.resources[("container", f"{pools}/cpu")] = {
            "name": "cpu",
            "instanceGroupUrls": [url.format("us-central1-a", "gke-gpu-a3-cpu-0f0f0f0f-grp")],
        }
        conf = {**CONF, "gke_clusters": [{"name": "gpu-a3", "location": "us-central1"}]}
        with pytest.raises(ValueError, match="not known"):
            deploy.compute_scope(conf, "p-1234")
        with _gcloud_at(fake, tmp_path) as gcloud:
            learned = deploy.learn_node_groups(conf, "p-1234", gcloud)
            (cluster,) = deploy.gke_clusters(learned, "p-1234")
            assert cluster["node_groups"] == [
                ("us-central1-a", "gke-gpu-a3-a3-1a2b3c4d-grp"),
                ("us-central1-a", "gke-gpu-a3-cpu-0f0f0f0f-grp"),
                ("us-central1-b", "gke-gpu-a3-a3-5e6f7a8b-grp"),
            ]
            scope = deploy.compute_scope(learned, "p-1234")["p-1234"]
            assert ("us-central1-b", "mig:gke-gpu-a3-a3-5e6f7a8b-grp") in scope
            missing = {**CONF, "gke_clusters": [{"name": "gone", "location": "us-central1"}]}
            with pytest.raises(ValueError, match="could not read the node pools of gone"):
                deploy.learn_node_groups(missing, "p-1234", gcloud)
    finally:
        server.shutdown()


# Issue 21 (12): each Kubernetes grant of actuate, and why; widening any of them fails here.
ACTUATOR_GRANTS = {
    ("", "nodes"): ["get", "list", "patch"],  # fence/unfence (cordon, taint, annotations), health
    ("", "nodes/status"): ["get"],  # the device plugin's XidCriticalError (corroboration)
    ("", "pods"): ["get", "list", "delete"],  # ... and force-deleting one stuck on a NotReady node
    ("", "pods/eviction"): ["create"],  # checkpoint and the one eviction that restarts a JobSet
    ("batch", "jobs"): ["get", "patch"],  # a batch Job's pods; suspend/resume for a hang's checks
    # restart count and conditions; patch: spec.suspend for a hang's stop-time checks (issue 24)
    ("jobset.x-k8s.io", "jobsets"): ["get", "list", "patch"],
    ("kueue.x-k8s.io", "workloads"): ["get", "list", "patch"],  # deactivate/reactivate a Workload
    ("policy", "poddisruptionbudgets"): ["get", "list"],  # name the PDB that blocks an eviction
}
CHECK_GRANTS = {("batch", "jobs"): ["get", "create", "delete"], ("", "pods/log"): ["get"]}


def _rbac_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "infra" / "gke" / "clusterrole.yaml").read_text()) if d]


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames games, no URLs
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                out[(g, r)] = sorted(rule["verbs"])
    return out


def test_actuates_cluster_grants_are_exactly_the_ones_it_uses() -> None:
    docs = _rbac_docs()
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "pitstop-actuator"]
    assert _rules(role) == {k: sorted(v) for k, v in ACTUATOR_GRANTS.items()}
    (checks,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "pitstop-checks"]
    assert checks["metadata"]["namespace"] == "pitstop-system"
    assert _rules(checks) == {k: sorted(v) for k, v in CHECK_GRANTS.items()}


def test_check_pods_run_where_pod_security_forbids_root_on_the_node() -> None:
    """The Role lets actuate create Jobs with any pod spec in pitstop-system: Pod Security `baseline`
    enforced there refuses privileged pods, host namespaces and hostPath; the check template itself
    drops every capability and forbids privilege escalation."""
    from pitstop.adapters.gke.checks import CHECK_SECURITY

    (ns,) = [d for d in _rbac_docs() if d["kind"] == "Namespace"]
    labels = ns["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] in ("baseline", "restricted")
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert CHECK_SECURITY["privileged"] is False and CHECK_SECURITY["allowPrivilegeEscalation"] is False
    assert CHECK_SECURITY["capabilities"] == {"drop": ["ALL"]}
    assert CHECK_SECURITY["seccompProfile"] == {"type": "RuntimeDefault"}


NPD_GRANTS = {
    ("", "nodes"): ["get"],
    ("", "nodes/status"): ["patch"],
    ("", "events"): ["create", "patch", "update"],
    ("events.k8s.io", "events"): ["create", "patch", "update"],
}


def test_node_problem_detector_runs_alone_in_its_namespace_with_only_what_it_needs(
    gke_steps: list[deploy.Step],
) -> None:
    """infra/gke/npd.yaml: the one privileged pod Pitstop deploys (it reads /dev/kmsg), in a namespace
    of its own that alone allows `privileged`; a pinned image; its account may set Node status and
    events only; no Pitstop identity is named in it; deploy applies it once per GKE cluster."""
    docs = [d for d in yaml.safe_load_all((ROOT / "infra" / "gke" / "npd.yaml").read_text()) if d]
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == "pitstop-npd"  # not pitstop-system, where actuate creates pods
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    namespaced = [d for d in docs if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")]
    assert {d["metadata"]["namespace"] for d in namespaced} == {"pitstop-npd"}
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert _rules(role) == {k: sorted(v) for k, v in NPD_GRANTS.items()}
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pitstop-npd", "namespace": "pitstop-npd"}
    ]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    image, _, tag = ctr["image"].rpartition(":")
    assert image == "registry.k8s.io/node-problem-detector/node-problem-detector" and tag.startswith("v")
    assert all(m["readOnly"] for m in ctr["volumeMounts"])
    assert "${" not in (ROOT / "infra" / "gke" / "npd.yaml").read_text()
    base = yaml.safe_load((ROOT / "infra" / "gke" / "kustomization.yaml").read_text())
    assert "npd.yaml" in base["resources"]
    clusters = _rbac_steps(gke_steps)
    assert len(clusters) == 2 and all(
        s.overlay and s.overlay.base == str(ROOT / "infra" / "gke") for s in clusters
    )
    for grants in (ACTUATOR_GRANTS, CHECK_GRANTS):  # nothing of Pitstop's can change the DaemonSet
        assert not {r for _, r in grants} & {"daemonsets", "configmaps", "namespaces", "serviceaccounts"}


def _deploy_argv(steps: list[deploy.Step], fn: str) -> list[str]:
    return next(s.argv for s in steps if s.argv[:3] == ["functions", "deploy", fn])


def test_every_function_is_deployed_with_its_measured_size(steps: list[deploy.Step]) -> None:
    """Left to defaults, a gen2 function takes one request per instance on up to 100 instances:
    a storm spread over that many coalescers. Each function states all five, and functions-framework
    gets as many threads as the concurrency Cloud Run sends it (THREADS)."""
    spec = {e["name"]: e for e in yaml.safe_load(deploy.RESOURCES.read_text())["resources"] if "scale" in e}
    assert set(spec) == {f"pitstop-{f}" for f in ("ingest", "actuate", "notify", "sweep")}
    for fn, entry in spec.items():
        argv = _deploy_argv(steps, fn)
        flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        for key in ("concurrency", "cpu", "memory", "max-instances", "min-instances"):
            assert flags[key] == str(entry["scale"][key.replace("-", "_")]), (fn, key)
        env = dict(kv.split("=", 1) for kv in flags["set-env-vars"].split(","))
        assert env["THREADS"] == flags["concurrency"], fn
        if int(flags["concurrency"]) > 1:  # Cloud Run functions: concurrency > 1 needs >= 1 vCPU
            assert float(flags["cpu"]) >= 1, fn
    ingest = dict(a[2:].split("=", 1) for a in _deploy_argv(steps, "pitstop-ingest") if "=" in a)
    assert int(ingest["concurrency"]) > 1 and int(ingest["max-instances"]) <= 10


@pytest.mark.parametrize("fn", ["pitstop-ingest", "pitstop-notify", "pitstop-actuate"])
@pytest.mark.parametrize("dropped", ["concurrency", "cpu", "memory", "max_instances", "min_instances"])
def test_a_function_without_its_measured_size_is_not_deployed(fn: str, dropped: str) -> None:
    """ingest, notify and actuate are sized from `pitstop bench ingest|notify|actuate`: none of the
    five may be left to Cloud Run's default."""
    doc = yaml.safe_load(deploy.RESOURCES.read_text())
    entry = next(e for e in doc["resources"] if e.get("name") == fn)
    assert len(deploy.scale_flags(entry)) == 5
    del entry["scale"][dropped]
    with pytest.raises(ValueError, match=f"{fn}: scale sets no {dropped}"):
        deploy.scale_flags(entry)
    entry["scale"] = {**entry["scale"], dropped: 1, "concurrency": 80, "cpu": 0.5}
    with pytest.raises(ValueError, match="concurrency above 1 needs cpu 1 or more"):
        deploy.scale_flags(entry)


# -- the admission policy that narrows actuate's JobSet/Job patch to spec.suspend ----------------

ACTUATE_EMAIL = "pitstop-actuate@p-1234.iam.gserviceaccount.com"


def _admission() -> tuple[dict[str, Any], dict[str, Any]]:
    text = (ROOT / "infra" / "gke" / "clusterrole.yaml").read_text().replace("${ACTUATOR_SA}", ACTUATE_EMAIL)
    docs = [d for d in yaml.safe_load_all(text) if d]
    (vap,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    return vap, binding


def _cel(expr: str, **activation: Any) -> bool:
    """The expression as the API server evaluates it (CEL, through cel-python)."""
    import celpy
    from celpy.adapter import json_to_cel

    env = celpy.Environment()
    prog = env.program(env.compile(expr))
    return bool(prog.evaluate({k: json_to_cel(v) for k, v in activation.items()}))


def _admitted(old: dict[str, Any], new: dict[str, Any], user: str = ACTUATE_EMAIL) -> bool:
    vap, _ = _admission()
    req = {"userInfo": {"username": user}}
    if not all(_cel(m["expression"], request=req) for m in vap["spec"]["matchConditions"]):
        return True  # not actuate's request: the policy does not apply
    return all(
        _cel(v["expression"], object=new, oldObject=old, request=req) for v in vap["spec"]["validations"]
    )


def _jobset(**over: Any) -> dict[str, Any]:
    tpl = {"spec": {"template": {"spec": {"containers": [{"name": "t", "image": "trainer:1"}]}}}}
    doc: dict[str, Any] = {
        "metadata": {"name": "train", "labels": {"team": "a"}, "annotations": {"owner": "ml"}},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 4, "template": tpl}], "suspend": False},
    }
    for path, value in over.items():
        *parents, leaf = path.split("__")
        node = doc
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


def test_actuate_may_change_a_jobsets_suspend_and_its_own_annotations_and_nothing_else() -> None:
    """RBAC cannot narrow `jobsets patch` / `jobs patch` to a field; the admission policy deployed
    beside the ClusterRole does: evaluated here with a CEL interpreter, as the API server would."""
    old = _jobset()
    stop = _jobset(spec__suspend=True)
    stop["metadata"]["annotations"]["pitstop.dev/stopped-for"] = "iabc-1"
    assert _admitted(old, stop) and _admitted(stop, old)  # Pitstop's stop, and its resume
    assert _admitted(_jobset(spec__suspend=None), stop)  # a spec that never named suspend
    image = _jobset()
    image["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = (
        "evil"
    )
    refused = [
        image,  # the pod template: any container on the GPU nodes
        _jobset(spec__failurePolicy={"maxRestarts": 99}),  # a spec field added
        _jobset(spec__replicatedJobs=None),  # a spec field removed
        _jobset(metadata__labels={"team": "b"}),  # a label (Kueue's queue is a label)
        _jobset(metadata__annotations={}),  # someone else's annotation removed
        _jobset(metadata__annotations={"owner": "ml", "x": "1"}),  # one added
    ]
    assert [_admitted(old, new) for new in refused] == [False] * len(refused)
    assert _admitted(old, image, user="someone@example.com")  # other users are not Pitstop's to limit

    def selecting(**labels: str) -> dict[str, Any]:
        pin = _jobset(spec__suspend=True)
        pin["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"] = labels
        return pin

    block, sub = "cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock"
    assert _admitted(old, selecting(**{block: "b1", sub: "s2"}))  # a move placed in its sub-block
    assert _admitted(selecting(**{block: "b1"}), selecting(**{block: "b2"}))
    assert not _admitted(old, selecting(**{"cloud.google.com/gke-nodepool": "other"}))
    assert not _admitted(selecting(pool="a"), selecting(**{block: "b1"}))  # the owner's key removed


def test_the_admission_policy_covers_every_job_kind_actuate_may_patch() -> None:
    vap, binding = _admission()
    covered = {
        (g, r) for rule in vap["spec"]["matchConstraints"]["resourceRules"] for g in rule["apiGroups"]
        for r in rule["resources"] if rule["operations"] == ["UPDATE"]
    }  # fmt: skip
    patched = {k for k, verbs in ACTUATOR_GRANTS.items() if "patch" in verbs and k[1] in ("jobs", "jobsets")}
    assert patched == {("batch", "jobs"), ("jobset.x-k8s.io", "jobsets")} and patched <= covered
    assert vap["spec"]["failurePolicy"] == "Fail"  # an unevaluable request is refused, not let through
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
