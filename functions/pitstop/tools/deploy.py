"""`pitstop deploy` / `pitstop teardown`: the whole pipeline into one project with gcloud.

The plan is an ordered list of gcloud commands built from infra/ (filters, IAM, roles,
monitoring) and the deploy config. ``--dry-run`` prints it, one command per line, with
values known only at run time as ``<placeholders>``. A real run is idempotent: each step
that creates something first asks gcloud whether it exists and then updates or skips it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pitstop.core import sinks
from pitstop.core.policy import deep_merge

ROOT = Path(__file__).resolve().parents[3]
INFRA = ROOT / "infra"
APIS = [
    "cloudfunctions.googleapis.com",
    "run.googleapis.com",
    "cloudbuild.googleapis.com",
    "artifactregistry.googleapis.com",
    "eventarc.googleapis.com",
    "pubsub.googleapis.com",
    "workflows.googleapis.com",
    "workflowexecutions.googleapis.com",
    "firestore.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "secretmanager.googleapis.com",
    "compute.googleapis.com",
    "cloudscheduler.googleapis.com",
    "iam.googleapis.com",
]
EXISTING = "<existing>"  # in update/delete commands: the name the step's check printed
TOPICS = ["pitstop-events", "pitstop-events-dead", "pitstop-notifications", "pitstop-notifications-dead"]


@dataclass
class Step:
    what: str
    argv: list[str]
    check: list[str] | None = None  # exits 0 when the resource already exists
    update: list[str] | None = None  # run instead of argv when it exists (None: skip)
    captures: dict[str, list[str]] = field(default_factory=dict)  # placeholder -> gcloud printing it
    delete: list[str] | None = None  # for teardown; "<existing>" is each name the check printed
    expect: str | None = None  # the check prints exactly this when what is deployed is current
    when: str | None = None  # run only when the check prints exactly this

    def line(self) -> str:
        return shlex.join(["gcloud", *self.argv])


def load_config(path: str | None) -> dict[str, Any]:
    conf: dict[str, Any] = yaml.safe_load((INFRA / "deploy.defaults.yaml").read_text())
    if path:
        conf = deep_merge(conf, yaml.safe_load(Path(path).read_text()) or {})
    expand_accounts({}, list(conf.get("slurm_clusters") or []))  # names fit the account-id rules
    return conf


CLUSTER_NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,14}[a-z0-9])?")  # fits pitstop-slurm-<name> (30 max)


def expand_accounts(specs: Mapping[str, Any], clusters: list[str]) -> dict[str, dict[str, Any]]:
    """iam.yaml's accounts, a `{cluster}` one once per Slurm cluster (its `cluster` key set)."""
    for c in clusters:
        if not CLUSTER_NAME.fullmatch(c):
            raise ValueError(f"slurm_clusters: {c!r} must be 1-16 lowercase letters, digits or '-'")
    out: dict[str, dict[str, Any]] = {}
    for comp, spec in specs.items():
        if "{cluster}" not in comp:
            out[comp] = spec
            continue
        for c in clusters:
            out[comp.format(cluster=c)] = {**spec, "display": spec["display"].format(cluster=c), "cluster": c}
    return out


def _targets(pattern: str, spec: Mapping[str, Any], clusters: list[str]) -> list[str]:
    """A resource name for each cluster it covers: the account's own cluster, or all of them."""
    if "{cluster}" not in pattern:
        return [pattern]
    return [pattern.format(cluster=c) for c in ([spec["cluster"]] if "cluster" in spec else clusters)]


def sa_email(component: str, project: str) -> str:
    return f"pitstop-{component}@{project}.iam.gserviceaccount.com"


def plan(
    project: str, region: str, conf: Mapping[str, Any], source_dir: str = "<staged-source>"
) -> list[Step]:
    p, r = ["--project", project], region
    steps: list[Step] = [Step("enable APIs", ["services", "enable", *APIS, *p])]
    iam_doc = yaml.safe_load((INFRA / "iam.yaml").read_text())
    clusters: list[str] = list(conf.get("slurm_clusters") or [])
    accounts = expand_accounts(iam_doc["service_accounts"], clusters)
    agent = iam_doc["service_agents"]["pubsub"]
    pubsub_agent = agent["member"].format(project_number="<project-number>")

    # -- identities ------------------------------------------------------------------
    role_id = "pitstopActuator"
    steps.append(
        Step(
            "restore the custom role if a teardown deleted it (IAM keeps its id for 37 days)",
            ["iam", "roles", "undelete", role_id, *p],
            check=["iam", "roles", "describe", role_id, *p, "--format=value(deleted)"],
            when="True",
        )
    )
    steps.append(
        Step(
            "custom role for actuate",
            ["iam", "roles", "create", role_id, *p, f"--file={INFRA / 'roles' / 'pitstop-actuator.yaml'}"],
            check=["iam", "roles", "describe", role_id, *p],
            update=[
                "iam",
                "roles",
                "update",
                role_id,
                *p,
                f"--file={INFRA / 'roles' / 'pitstop-actuator.yaml'}",
            ],
            delete=["iam", "roles", "delete", role_id, *p, "--quiet"],
        )
    )
    for comp, spec in accounts.items():
        email = sa_email(comp, project)
        steps.append(
            Step(
                f"service account {comp}",
                [
                    "iam",
                    "service-accounts",
                    "create",
                    f"pitstop-{comp}",
                    *p,
                    f"--display-name={spec['display']}",
                ],
                check=["iam", "service-accounts", "describe", email, *p],
                delete=["iam", "service-accounts", "delete", email, *p, "--quiet"],
            )
        )
        for b in spec.get("project_roles", []):
            steps.append(
                Step(
                    f"{comp}: {b['role'].format(project=project)}",
                    [
                        "projects",
                        "add-iam-policy-binding",
                        project,
                        f"--member=serviceAccount:{email}",
                        f"--role={b['role'].format(project=project)}",
                        "--condition=None",
                        "--quiet",
                    ],
                    delete=[
                        "projects",
                        "remove-iam-policy-binding",
                        project,
                        f"--member=serviceAccount:{email}",
                        f"--role={b['role'].format(project=project)}",
                        "--condition=None",
                        "--quiet",
                    ],
                )
            )

    # -- Pub/Sub ---------------------------------------------------------------------
    for t in TOPICS + [f"pitstop-slurm-{c}" for c in clusters]:
        steps.append(
            Step(
                f"topic {t}",
                ["pubsub", "topics", "create", t, *p],
                check=["pubsub", "topics", "describe", t, *p],
                delete=["pubsub", "topics", "delete", t, *p, "--quiet"],
            )
        )
    for dead in ("pitstop-events-dead", "pitstop-notifications-dead"):
        steps.append(
            Step(
                f"inspection subscription on {dead}",
                [
                    "pubsub",
                    "subscriptions",
                    "create",
                    f"{dead}-inspect",
                    f"--topic={dead}",
                    "--message-retention-duration=7d",
                    *p,
                ],
                check=["pubsub", "subscriptions", "describe", f"{dead}-inspect", *p],
                delete=["pubsub", "subscriptions", "delete", f"{dead}-inspect", *p, "--quiet"],
            )
        )
        steps.append(
            Step(
                f"Pub/Sub service agent may publish to {dead}",
                [
                    "pubsub",
                    "topics",
                    "add-iam-policy-binding",
                    dead,
                    *p,
                    f"--member={pubsub_agent}",
                    "--role=roles/pubsub.publisher",
                ],
            )
        )
    for c in clusters:
        sub = f"pitstop-slurm-{c}-agent"
        steps.append(
            Step(
                f"agent subscription for {c}",
                [
                    "pubsub",
                    "subscriptions",
                    "create",
                    sub,
                    f"--topic=pitstop-slurm-{c}",
                    "--ack-deadline=120",
                    "--message-retention-duration=1h",
                    *p,
                ],
                check=["pubsub", "subscriptions", "describe", sub, *p],
                delete=["pubsub", "subscriptions", "delete", sub, *p, "--quiet"],
            )
        )
    for comp, spec in accounts.items():
        for kind in ("topic", "subscription"):
            for b in spec.get(f"{kind}_roles", []):
                for name in _targets(b[kind], spec, clusters):
                    steps.append(
                        Step(
                            f"{comp}: {b['role']} on {name}",
                            [
                                "pubsub",
                                f"{kind}s",
                                "add-iam-policy-binding",
                                name,
                                *p,
                                f"--member=serviceAccount:{sa_email(comp, project)}",
                                f"--role={b['role']}",
                            ],
                        )
                    )

    # -- Firestore ---------------------------------------------------------------------
    steps.append(
        Step(
            "Firestore (native mode)",
            ["firestore", "databases", "create", f"--location={r}", "--type=firestore-native", *p],
            check=["firestore", "databases", "describe", "--database=(default)", *p],
        )
    )
    steps.append(
        Step(
            "TTL on dedup records",
            [
                "firestore",
                "fields",
                "ttls",
                "update",
                "expire_at",
                "--collection-group=pitstop_dedup",
                "--enable-ttl",
                "--async",
                *p,
            ],
        )
    )

    # -- secret ------------------------------------------------------------------------
    steps.append(
        Step(
            "webhook secret",
            ["secrets", "create", "pitstop-webhook", "--replication-policy=automatic", *p],
            check=["secrets", "describe", "pitstop-webhook", *p],
            delete=["secrets", "delete", "pitstop-webhook", *p, "--quiet"],
        )
    )
    for comp, spec in accounts.items():
        for b in spec.get("secret_roles", []):
            steps.append(
                Step(
                    f"{comp} reads secret {b['secret']}",
                    [
                        "secrets",
                        "add-iam-policy-binding",
                        b["secret"],
                        *p,
                        f"--member=serviceAccount:{sa_email(comp, project)}",
                        f"--role={b['role']}",
                    ],
                )
            )

    # -- functions ---------------------------------------------------------------------
    env = "PITSTOP_POLICY=/workspace/policy.yaml,PITSTOP_NOTIFICATIONS_TOPIC=pitstop-notifications"
    common = [
        "--gen2",
        f"--runtime={conf['runtime']}",
        f"--region={r}",
        f"--source={source_dir}",
        "--no-allow-unauthenticated",
        *p,
    ]
    fn_specs = [
        ("ingest", "ingest", ["--trigger-topic=pitstop-events", "--retry"], "ingest", env),
        ("actuate", "actuate", ["--trigger-http", "--timeout=300"], "actuate", env),
        (
            "notify",
            "notify",
            [
                "--trigger-topic=pitstop-notifications",
                "--retry",
                "--set-secrets=PITSTOP_WEBHOOK_URL=pitstop-webhook:latest",
            ],
            "notify",
            f"{env},PITSTOP_WEBHOOK_FORMAT={conf['webhook_format']}",
        ),
        ("sweep", "sweep", ["--trigger-http"], "ingest", env),
    ]
    source = source_digest(conf.get("policy"))
    for name, entry, extra, sa, fn_env in fn_specs:
        fn = f"pitstop-{name}"
        argv = [
            "functions",
            "deploy",
            fn,
            f"--entry-point={entry}",
            *extra,
            f"--set-env-vars={fn_env}",
            f"--service-account={sa_email(sa, project)}",
            *common,
        ]
        digest = config_digest([a for a in argv if not a.startswith("--source=")], source)
        steps.append(
            Step(
                f"function {fn}",
                [*argv, f"--update-labels={DIGEST_LABEL}={digest}"],
                check=[
                    "functions",
                    "describe",
                    fn,
                    "--gen2",
                    f"--region={r}",
                    *p,
                    f"--format=value(labels.{DIGEST_LABEL})",
                ],
                expect=digest,
                delete=["functions", "delete", fn, "--gen2", f"--region={r}", *p, "--quiet"],
            )
        )
    for comp, spec in accounts.items():
        for b in spec.get("function_roles", []):
            member = f"--member=serviceAccount:{sa_email(comp, project)}"
            where = [b["function"], f"--region={r}", member, *p]
            steps.append(
                Step(
                    f"{comp} may invoke {b['function']}",
                    ["functions", "add-invoker-policy-binding", *where],
                )
            )
    for b in agent.get("account_roles", []):
        email = sa_email(b["account"], project)
        steps.append(
            Step(
                f"Pub/Sub service agent: {b['role']} on {b['account']}",
                [
                    "iam",
                    "service-accounts",
                    "add-iam-policy-binding",
                    email,
                    *p,
                    f"--member={pubsub_agent}",
                    f"--role={b['role']}",
                ],
            )
        )
    for fn, dlq, attempts in (
        ("pitstop-ingest", "pitstop-events-dead", 5),
        ("pitstop-notify", "pitstop-notifications-dead", 10),
    ):
        placeholder = f"<{fn}-trigger-subscription>"
        steps.append(
            Step(
                f"dead-letter policy on {fn}'s trigger",
                [
                    "pubsub",
                    "subscriptions",
                    "update",
                    placeholder,
                    f"--dead-letter-topic={dlq}",
                    f"--max-delivery-attempts={attempts}",
                    "--min-retry-delay=10s",
                    "--max-retry-delay=600s",
                    *p,
                ],
            )
        )
        steps.append(
            Step(
                f"Pub/Sub service agent may ack {fn}'s trigger subscription",
                [
                    "pubsub",
                    "subscriptions",
                    "add-iam-policy-binding",
                    placeholder,
                    *p,
                    f"--member={pubsub_agent}",
                    "--role=roles/pubsub.subscriber",
                ],
            )
        )

    # -- workflow ----------------------------------------------------------------------
    wf_env = (
        "PITSTOP_ACTUATE_URL=<pitstop-actuate-url>,PITSTOP_POLL_S=30,PITSTOP_OP_TIMEOUT_S=1800,"
        "PITSTOP_VERIFY_TIMEOUT_S=2700"
    )
    wf_source = ROOT / "workflows" / "remediate.yaml"
    wf_digest = config_digest([project, r, wf_env, sa_email("workflow", project)], _digest_files([wf_source]))
    steps.append(
        Step(
            "workflow pitstop-remediate",
            [
                "workflows",
                "deploy",
                "pitstop-remediate",
                f"--source={wf_source}",
                f"--location={r}",
                f"--service-account={sa_email('workflow', project)}",
                f"--set-env-vars={wf_env}",
                "--call-log-level=log-errors-only",
                f"--labels={DIGEST_LABEL}={wf_digest}",
                *p,
            ],
            check=[
                "workflows",
                "describe",
                "pitstop-remediate",
                f"--location={r}",
                *p,
                f"--format=value(labels.{DIGEST_LABEL})",
            ],
            expect=wf_digest,
            delete=["workflows", "delete", "pitstop-remediate", f"--location={r}", *p, "--quiet"],
        )
    )

    # -- sinks -------------------------------------------------------------------------
    agg = conf.get("aggregated_sink") or {}
    scope = (
        [f"--folder={agg['folder']}"]
        if "folder" in agg
        else [f"--organization={agg['organization']}"]
        if "organization" in agg
        else []
    )
    for sink, flt in sinks.sink_filters().items():
        dest = f"pubsub.googleapis.com/projects/{project}/topics/pitstop-events"
        where = [*scope, "--include-children"] if scope else p
        steps.append(
            Step(
                f"log sink {sink}",
                ["logging", "sinks", "create", sink, dest, f"--log-filter={flt}", *where],
                check=["logging", "sinks", "describe", sink, *(scope or p)],
                update=["logging", "sinks", "update", sink, dest, f"--log-filter={flt}", *(scope or p)],
                delete=["logging", "sinks", "delete", sink, *(scope or p), "--quiet"],
            )
        )
        placeholder = f"<{sink}-writer-identity>"
        steps.append(
            Step(
                f"{sink} may publish to pitstop-events (only)",
                [
                    "pubsub",
                    "topics",
                    "add-iam-policy-binding",
                    "pitstop-events",
                    *p,
                    f"--member={placeholder}",
                    "--role=roles/pubsub.publisher",
                ],
            )
        )
    steps.append(
        Step(
            "log-based metric pitstop_xid_lines (by Xid code)",
            [
                "logging",
                "metrics",
                "create",
                "pitstop_xid_lines",
                f"--config-from-file={xid_metric_config()}",
                *p,
            ],
            check=["logging", "metrics", "describe", "pitstop_xid_lines", *p],
            update=[
                "logging",
                "metrics",
                "update",
                "pitstop_xid_lines",
                f"--config-from-file={xid_metric_config()}",
                *p,
            ],
            delete=["logging", "metrics", "delete", "pitstop_xid_lines", *p, "--quiet"],
        )
    )

    # -- schedule, monitoring ------------------------------------------------------------
    job = [
        "pitstop-sweep",
        f"--location={r}",
        "--schedule=* * * * *",
        "--uri=<pitstop-sweep-url>",
        "--http-method=POST",
        f"--oidc-service-account-email={sa_email('scheduler', project)}",
        *p,
    ]
    steps.append(
        Step(
            "sweep every minute",
            ["scheduler", "jobs", "create", "http", *job],
            check=["scheduler", "jobs", "describe", "pitstop-sweep", f"--location={r}", *p],
            update=["scheduler", "jobs", "update", "http", *job],
            delete=["scheduler", "jobs", "delete", "pitstop-sweep", f"--location={r}", *p, "--quiet"],
        )
    )
    dashboard = INFRA / "monitoring" / "dashboard.json"
    title = json.loads(dashboard.read_text())["displayName"]
    steps.append(
        Step(
            "dashboard",
            ["monitoring", "dashboards", "create", f"--config-from-file={dashboard}", *p],
            check=[
                "monitoring",
                "dashboards",
                "list",
                *p,
                f"--filter=displayName={json.dumps(title)}",
                "--format=value(name)",
            ],
            update=[
                "monitoring",
                "dashboards",
                "update",
                EXISTING,
                f"--config-from-file={dashboard}",
                *p,
            ],
            delete=["monitoring", "dashboards", "delete", EXISTING, *p, "--quiet"],
        )
    )
    for alert in sorted((INFRA / "monitoring").glob("alert-*.json")):
        title = json.loads(alert.read_text())["displayName"]
        policies = ["alpha", "monitoring", "policies"]
        steps.append(
            Step(
                f"alert {alert.stem}",
                [*policies, "create", f"--policy-from-file={alert}", *p],
                check=[
                    *policies,
                    "list",
                    *p,
                    f"--filter=displayName={json.dumps(title)}",
                    "--format=value(name)",
                ],
                update=[*policies, "update", EXISTING, f"--policy-from-file={alert}", *p],
                delete=[*policies, "delete", EXISTING, *p, "--quiet"],
            )
        )
    learn = runtime_values(project, r, scope or p)
    for step in steps:
        step.captures = _captures([*step.argv, *(step.update or [])], learn)
    return steps


DIGEST_LABEL = "pitstop_config"


def config_digest(argv: list[str], content: str) -> str:
    """A label value that changes when a deployment's flags or sources do (a rerun skips it otherwise)."""
    h = hashlib.sha256("\0".join(argv).encode())
    h.update(content.encode())
    return h.hexdigest()[:20]


def _digest_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


SKIPPED_DIRS = {"__pycache__", "local"}  # local/: the emulator-side stand-ins never run in the cloud


def _not_shipped(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n in SKIPPED_DIRS or n.endswith((".pyc", ".pyo"))} | (
        set(names) if Path(directory).name in SKIPPED_DIRS else set()
    )


def source_digest(policy_path: str | None) -> str:
    """The content stage_source would upload, without staging it (a dry run prints the same label)."""
    files = [
        f
        for d in (ROOT / "functions", ROOT / "schemas", INFRA / "filters")
        for f in sorted(d.rglob("*"))
        if f.is_file() and not _not_shipped(str(f.parent), [f.name]) and not set(f.parts) & SKIPPED_DIRS
    ]
    policy = Path(policy_path).read_bytes() if policy_path else b"{}\n"
    return hashlib.sha256(_digest_files(files).encode() + policy).hexdigest()


def xid_metric_config() -> Path:
    """The log-based metric behind the dashboard's Xid-rate chart, from the same filter file."""
    conf = {
        "description": "GPU Xid log lines (Ops Agent syslog; the label reads jsonPayload.message)",
        "filter": sinks.read_filter("gpu-xid.filter"),
        "labelExtractors": {"xid": r'REGEXP_EXTRACT(jsonPayload.message, "NVRM: Xid \\([^)]*\\): (\\d+)")'},
        "metricDescriptor": {
            "metricKind": "DELTA",
            "valueType": "INT64",
            "labels": [{"key": "xid", "valueType": "STRING", "description": "Xid code"}],
        },
    }
    path = Path(tempfile.gettempdir()) / "pitstop-xid-metric.json"
    path.write_text(json.dumps(conf, indent=2))
    return path


def stage_source(policy_path: str | None, into: Path | None = None) -> Path:
    """functions/ plus the data it reads at run time (schemas, filters, policy), as Cloud Build uploads it."""
    out = into or Path(tempfile.mkdtemp(prefix="pitstop-src-"))
    shutil.copytree(ROOT / "functions", out, dirs_exist_ok=True, ignore=_not_shipped)
    shutil.copytree(ROOT / "schemas", out / "pitstop" / "schemas", dirs_exist_ok=True)
    shutil.copytree(INFRA / "filters", out / "pitstop" / "filters", dirs_exist_ok=True)
    src = Path(policy_path) if policy_path else ROOT / "schemas" / "policy.defaults.yaml"
    text = src.read_text() if policy_path else "{}\n"  # shipped defaults: observe mode
    (out / "policy.yaml").write_text(text)
    return out


Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _gcloud(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["gcloud", *argv], capture_output=True, text=True, check=False)


def runtime_values(project: str, region: str, sink_scope: list[str]) -> dict[str, list[str]]:
    """How to learn each value known only at run time: the gcloud command that prints it."""
    p = ["--project", project]

    def function(fn: str, field_path: str) -> list[str]:
        return [
            "functions",
            "describe",
            fn,
            "--gen2",
            f"--region={region}",
            *p,
            f"--format=value({field_path})",
        ]

    out = {"<project-number>": ["projects", "describe", project, "--format=value(projectNumber)"]}
    for fn in ("pitstop-actuate", "pitstop-sweep"):
        out[f"<{fn}-url>"] = function(fn, "serviceConfig.uri")
    for fn in ("pitstop-ingest", "pitstop-notify"):
        out[f"<{fn}-trigger>"] = function(fn, "eventTrigger.trigger")
        out[f"<{fn}-trigger-subscription>"] = [
            "eventarc",
            "triggers",
            "describe",
            f"<{fn}-trigger>",
            f"--location={region}",
            *p,
            "--format=value(transport.pubsub.subscription)",
        ]
    for sink in sinks.SINK_FILTERS:  # an aggregated sink lives in its folder or organization
        out[f"<{sink}-writer-identity>"] = ["logging", "sinks", "describe", sink, *sink_scope]
        out[f"<{sink}-writer-identity>"].append("--format=value(writerIdentity)")
    return out


def _captures(argv: list[str], learn: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """The commands a step needs run first, including those its own commands depend on."""
    out: dict[str, list[str]] = {}
    todo = _placeholders(argv)
    while todo:
        ph = todo.pop()
        if ph in learn and ph not in out:
            out[ph] = learn[ph]
            todo += _placeholders(learn[ph])
    return out


def _learn(ph: str, step: Step, values: dict[str, str], run: Runner) -> str:
    if not values.get(ph) and ph in step.captures:
        argv = [
            _fill(a, {d: _learn(d, step, values, run) for d in _placeholders([a])}) for a in step.captures[ph]
        ]
        values[ph] = run(argv).stdout.strip()
    return values.get(ph, "")


def apply(steps: list[Step], run: Runner = _gcloud, log: Callable[[str], None] = print) -> int:
    """Run the plan; a step whose check finds the resource is skipped, updated or redeployed."""
    values: dict[str, str] = {}
    for step in steps:
        needed = [ph for ph in _placeholders([*step.argv, *(step.update or [])]) if ph != EXISTING]
        missing = [ph for ph in needed if not _learn(ph, step, values, run)]
        if missing:
            log(f"FAILED   {step.what}: could not learn {', '.join(missing)} from gcloud")
            return 1
        argv = [_fill(a, values) for a in step.argv]
        found = _existing(step, run)
        if step.when is not None and found != step.when:
            log(f"skipped  {step.what}")
            continue
        if found is not None and step.when is None:
            if step.expect is not None and found == step.expect:
                log(f"current  {step.what}")
                continue
            if step.expect is None and step.update is None:
                log(f"exists   {step.what}")
                continue
            if step.update is not None:
                existing = found.splitlines()[0]
                argv = [_fill(a, {**values, EXISTING: existing}) for a in step.update]
        res = run(argv)
        if res.returncode != 0:
            log(f"FAILED   {step.what}: {res.stderr.strip()[:500]}")
            return 1
        log(f"ok       {step.what}")
    return 0


def _existing(step: Step, run: Runner) -> str | None:
    """What the step's check printed, or None when the resource is not there."""
    if step.check is None:
        return None
    res = run(step.check)
    out = res.stdout.strip()
    return out if res.returncode == 0 and out else None


def _placeholders(argv: list[str]) -> list[str]:
    return [m for a in argv for m in re.findall(r"<[a-z0-9-]+>", a)]


def _fill(arg: str, values: Mapping[str, str]) -> str:
    for k, v in values.items():
        arg = arg.replace(k, v)
    return arg


def teardown(
    steps: list[Step], purge: bool, run: Runner = _gcloud, log: Callable[[str], None] = print
) -> int:
    """Undo the plan in reverse; resources named only at creation are found through the step's check."""
    for step in reversed(steps):
        if step.delete is None:
            continue
        targets = [step.delete]
        if any(EXISTING in a for a in step.delete):
            found = _existing(step, run)
            names = found.splitlines() if found else []
            targets = [[_fill(a, {EXISTING: n}) for a in step.delete] for n in names]
        if not targets:
            log(f"absent   {step.what}")
        for argv in targets:
            res = run(argv)
            log(("deleted  " if res.returncode == 0 else "absent   ") + step.what)
    if purge:
        log(
            "incident data: delete the pitstop_* collections with `gcloud firestore bulk-delete "
            "--collection-ids=pitstop_incidents,pitstop_nodes,pitstop_budgets,pitstop_dedup,pitstop_jobs,"
            "pitstop_slurm_results,pitstop_notifications`"
        )
    return 0


def dry_run_lines(project: str, region: str, conf: Mapping[str, Any]) -> list[str]:
    return [s.line() for s in plan(project, region, conf)]
