"""`pitstop deploy`: the plan, least privilege, and every command accepted by the real gcloud parser."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from pitstop.core import sinks
from pitstop.tools import deploy

ROOT = Path(__file__).resolve().parents[1]
CONF = {**deploy.load_config(None), "slurm_clusters": ["train", "infer"], "webhook_format": "slack"}


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> list[deploy.Step]:
    source = deploy.stage_source(None, tmp_path_factory.mktemp("src"))
    return deploy.plan("my-train-proj", "us-central1", CONF, str(source))


def test_dry_run_prints_one_gcloud_command_per_line() -> None:
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
    assert all(shlex.split(line)[0] == "gcloud" for line in lines)
    assert any("<pitstop-gpu-xid-writer-identity>" in line for line in lines)
    assert any("<pitstop-actuate-url>" in line for line in lines)


def test_least_privilege(steps: list[deploy.Step]) -> None:
    roles = [a.split("=", 1)[1] for s in steps for a in s.argv if a.startswith("--role=")]
    assert roles and not {"roles/owner", "roles/editor", "roles/compute.admin"} & set(roles)
    iam = yaml.safe_load((ROOT / "infra" / "iam.yaml").read_text())["service_accounts"]
    assert all(b["why"] for spec in iam.values() for k in spec if k.endswith("_roles") for b in spec[k])
    fns = {s.argv[2]: s.argv for s in steps if s.argv[:2] == ["functions", "deploy"]}
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
        "schemas",
        "filters",
    }  # no tools (CLI, deploy), agent (runs on the Slurm controller) or local (the stand-ins)
    packages = {p.parent.relative_to(out).as_posix() for p in out.rglob("__init__.py")}
    assert packages == {"pitstop", "pitstop/core", "pitstop/services", "pitstop/adapters"}
    assert not [p for p in out.rglob("*") if p.name == "__pycache__" or p.suffix in (".pyc", ".pyo")]
    functions = ROOT / "functions" / "pitstop"
    for pkg in ("core", "services", "adapters"):
        assert {p.name for p in (out / "pitstop" / pkg).glob("*.py")} == {
            p.name for p in (functions / pkg).glob("*.py")
        }
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
    "<pitstop-gpu-xid-writer-identity>": SINK_WRITER,
    "<pitstop-system-events-writer-identity>": SINK_WRITER,
    "<existing>": "1234567890",  # a dashboard or alert policy id a check printed
}


def _gcloud_parse(line: str, cfg: str) -> tuple[str, int, str]:
    for k, v in SAMPLE_VALUES.items():
        line = line.replace(k, v)
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
    ):
        env[f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{api}"] = "http://127.0.0.1:9/"  # never a real Google endpoint
    proc = subprocess.run(
        shlex.split(line), capture_output=True, text=True, timeout=120, env=env, check=False
    )
    return line, proc.returncode, proc.stderr


def test_every_command_is_accepted_by_the_real_gcloud_parser(steps: list[deploy.Step]) -> None:
    lines = [s.line() for s in steps]
    lines += [shlex.join(["gcloud", *s.check]) for s in steps if s.check]
    lines += [shlex.join(["gcloud", *s.update]) for s in steps if s.update]
    lines += [shlex.join(["gcloud", *s.delete]) for s in steps if s.delete]
    lines += sorted({shlex.join(["gcloud", *argv]) for s in steps for argv in s.captures.values()})
    for s in steps:  # files gcloud reads at parse time, written by apply() just before use
        deploy.write_config_files([*s.argv, *(s.update or [])])
    cfg = tempfile.mkdtemp(prefix="gcloud-config-")
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda ln: _gcloud_parse(ln, cfg), lines))
    usage = [(ln, err.strip().splitlines()[-1:]) for ln, rc, err in results if rc == 2]
    assert usage == [], usage  # 2 = usage error; without credentials a valid command stops at auth (1)
    assert all(rc == 1 for _, rc, _ in results), [(ln, rc) for ln, rc, _ in results if rc != 1]


def test_a_changed_policy_redeploys_the_functions_and_nothing_else(tmp_path: Path) -> None:
    def labels(policy_text: str | None) -> dict[str, str]:
        conf = dict(CONF)
        if policy_text is not None:
            (tmp_path / "policy.yaml").write_text(policy_text)
            conf["policy"] = str(tmp_path / "policy.yaml")
        return {s.what: s.expect for s in deploy.plan("my-train-proj", "us-central1", conf) if s.expect}

    shipped, observe, enforce = labels(None), labels("mode: observe\n"), labels("mode: enforce\n")
    assert set(shipped) == {f"function pitstop-{f}" for f in ("ingest", "actuate", "notify", "sweep")} | {
        "workflow pitstop-remediate"
    }
    assert shipped == labels(None)  # stable: a rerun with the same inputs is "current"
    changed = {k for k in shipped if observe[k] != enforce[k]}
    assert changed == {k for k in shipped if k.startswith("function ")}
