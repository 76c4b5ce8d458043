"""deploy.yaml checked against its schema, deploy.yaml and the policy checked together before
anything is created (tools/preflight.py), and teardown's dry run and confirmation.

The CLI runs are real `pitstop deploy`/`teardown` processes with a `gcloud` on PATH that records
its arguments and answers nothing: a check that stops a deploy must stop it before any gcloud call.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pitstop.core import resources
from pitstop.tools import deploy, preflight
from pitstop.tools.cli import deploy as cli_deploy

ROOT = Path(__file__).resolve().parents[2]


def _conf(tmp_path: Path, policy: str | None = None, **keys: Any) -> dict[str, object]:
    """deploy.yaml with ``keys`` (and a policy file holding ``policy``), loaded as deploy loads it."""
    doc: dict[str, Any] = dict(keys)
    if policy is not None:
        (tmp_path / "policy.yaml").write_text(policy)
        doc["policy"] = str(tmp_path / "policy.yaml")
    (tmp_path / "deploy.yaml").write_text(yaml.safe_dump(doc))
    return deploy.load_config(str(tmp_path / "deploy.yaml"))


def _errors(conf: dict[str, object]) -> list[str]:
    return [f.text for f in preflight.check(conf, "my-proj") if f.level == "error"]


SLURM_TRAIN = "clusters:\n  - {name: train, scheduler: slurm, match: {name_pattern: 'train-*'}}\n"


# -- deploy.yaml on its own ----------------------------------------------------------------------


def test_the_shipped_defaults_satisfy_the_schema() -> None:
    resources.validate(
        yaml.safe_load((ROOT / "infra/deploy.defaults.yaml").read_text()), "deploy.schema.json", "x"
    )


def test_every_default_key_is_in_the_schema_and_every_schema_key_has_a_default() -> None:
    defaults = yaml.safe_load((ROOT / "infra/deploy.defaults.yaml").read_text())
    assert set(defaults) == set(resources.schema("deploy.schema.json")["properties"])


def test_a_misspelt_key_fails_naming_the_key_it_meant(tmp_path: Path) -> None:
    with pytest.raises(
        deploy.ConfigError, match=r"polcy: not a deploy.yaml setting \(did you mean policy\?\)"
    ):
        _conf(tmp_path, polcy="my-policy.yaml")


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ({"compute_zones": "us-central1-a"}, "compute_zones: 'us-central1-a' is not of type 'array'"),
        ({"webhook_format": "teams"}, "webhook_format: 'teams' is not one of"),
        ({"gke_clusters": [{"name": "a", "location": "us-central1", "zone": "x"}]}, "gke_clusters/0"),
        ({"pagerduty": "yes"}, "pagerduty: 'yes' is not of type 'boolean'"),
    ],
)
def test_a_value_of_the_wrong_shape_fails_naming_its_key(
    tmp_path: Path, keys: dict[str, Any], said: str
) -> None:
    with pytest.raises(deploy.ConfigError, match=said):
        _conf(tmp_path, **keys)


# -- deploy.yaml and the policy together ---------------------------------------------------------


def test_enforce_with_nowhere_to_act_is_an_error_naming_compute_zones(tmp_path: Path) -> None:
    errors = _errors(_conf(tmp_path, policy="mode: enforce\n"))
    assert len(errors) == 1 and "compute_zones" in errors[0] and "no Compute Engine role" in errors[0]
    assert _errors(_conf(tmp_path, policy="mode: enforce\n", compute_zones=["us-central1-a"])) == []
    assert _errors(_conf(tmp_path, policy="mode: observe\n")) == []  # observe acts on nothing


def test_a_gke_clusters_location_is_somewhere_to_act(tmp_path: Path) -> None:
    policy = (
        "mode: enforce\nclusters:\n  - {name: gpu, scheduler: gke, match: {gke_cluster: gpu}, "
        "gke: {location: us-central1}}\n"
    )
    assert (
        _errors(_conf(tmp_path, policy=policy, gke_clusters=[{"name": "gpu", "location": "us-central1"}]))
        == []
    )


def test_slurm_clusters_must_agree_both_ways(tmp_path: Path) -> None:
    assert _errors(_conf(tmp_path, policy=SLURM_TRAIN, slurm_clusters=["train"])) == []
    only_deploy = _errors(_conf(tmp_path, slurm_clusters=["train"]))
    assert len(only_deploy) == 1 and "no policy cluster of that name has scheduler slurm" in only_deploy[0]
    only_policy = _errors(_conf(tmp_path, policy=SLURM_TRAIN))
    assert len(only_policy) == 1 and "Add train to slurm_clusters" in only_policy[0]
    renamed = _errors(_conf(tmp_path, policy=SLURM_TRAIN, slurm_clusters=["trian"]))
    assert len(renamed) == 2


def test_gke_clusters_must_agree_by_name_location_and_project(tmp_path: Path) -> None:
    policy = (
        "clusters:\n  - {name: a3, scheduler: gke, match: {gke_cluster: gpu-a3}, "
        "gke: {location: us-central1, cluster: gpu-a3}}\n"
    )
    same = [{"name": "gpu-a3", "location": "us-central1"}]
    assert _errors(_conf(tmp_path, policy=policy, gke_clusters=same)) == []
    elsewhere = [{"name": "gpu-a3", "location": "us-east5"}]
    errors = _errors(_conf(tmp_path, policy=policy, gke_clusters=elsewhere))
    assert len(errors) == 2
    assert "actuate would have no RBAC or IAM there" in errors[0] and "us-east5" in errors[1]
    other_project = [{"name": "gpu-a3", "location": "us-central1", "project": "ml-other-proj"}]
    assert len(_errors(_conf(tmp_path, policy=policy, gke_clusters=other_project))) == 2
    no_location = "clusters:\n  - {name: a3, scheduler: gke, match: {gke_cluster: a3}}\n"
    [error] = _errors(_conf(tmp_path, policy=no_location))
    assert error.startswith("policy: ") and error.endswith("clusters/0: 'gke' is a required property")


def test_a_policy_that_does_not_load_is_an_error(tmp_path: Path) -> None:
    errors = _errors(_conf(tmp_path, policy="budgets: {cluster: {max_nodes: -1}}\n"))
    assert len(errors) == 1 and errors[0].startswith("policy:") and "max_nodes" in errors[0]


class _Gcloud:
    def __init__(self, rc: int, out: str = "", err: str = "") -> None:
        self.rc, self.out, self.err = rc, out, err
        self.argv: list[str] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.argv = argv
        return subprocess.CompletedProcess(argv, self.rc, self.out, self.err)


def test_a_webhook_secret_without_a_version_warns_with_the_command_that_adds_one() -> None:
    empty = _Gcloud(0, "")
    found = preflight.webhook_secret("my-proj", empty)
    assert [f.level for f in found] == ["warning"] and "gcloud secrets versions add pitstop-webhook" in found[
        0
    ].text
    assert empty.argv[:4] == ["secrets", "versions", "list", "pitstop-webhook"]
    assert "--filter=state:ENABLED" in empty.argv  # the version's value is never read
    missing = preflight.webhook_secret(
        "my-proj", _Gcloud(1, err="NOT_FOUND: Secret [pitstop-webhook] not found")
    )
    assert [f.level for f in missing] == ["warning"] and "does not exist yet" in missing[0].text
    assert (
        preflight.webhook_secret("my-proj", _Gcloud(0, "projects/1/secrets/pitstop-webhook/versions/3")) == []
    )


# -- the CLI: a failed check creates nothing ------------------------------------------------------


def _pitstop(
    tmp_path: Path, *argv: str, stdin: str | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`pitstop ARGV` with a gcloud that records each call and answers exit 0 with no output."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "gcloud.calls"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "gcloud").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (bin_dir / "gcloud").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT / "functions")}
    proc = subprocess.run(
        [sys.executable, "-m", "pitstop.tools.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        input=stdin,
        timeout=120,
        check=False,
    )
    return proc, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize(
    ("keys", "policy", "said"),
    [
        ({"polcy": "p.yaml"}, None, "did you mean policy?"),
        ({}, "mode: enforce\n", "no compute_zones"),
        ({"slurm_clusters": ["train"]}, None, "no policy cluster of that name"),
    ],
    ids=["bad-key", "enforce-without-zones", "clusters-disagree"],
)
def test_deploy_stops_before_any_gcloud_call_when_a_check_fails(
    tmp_path: Path, keys: dict[str, Any], policy: str | None, said: str
) -> None:
    doc = dict(keys)
    if policy is not None:
        (tmp_path / "policy.yaml").write_text(policy)
        doc["policy"] = str(tmp_path / "policy.yaml")
    (tmp_path / "deploy.yaml").write_text(yaml.safe_dump(doc))
    proc, calls = _pitstop(
        tmp_path, "deploy", "--project", "my-proj", "--config", str(tmp_path / "deploy.yaml")
    )
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr
    assert calls == [] and proc.stdout == ""


# -- teardown --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def steps() -> list[deploy.Step]:
    return deploy.plan("my-proj", "us-central1", {**deploy.load_config(None), "slurm_clusters": ["train"]})


def test_teardown_dry_run_lists_every_delete_in_reverse_and_the_purge_only_when_asked(
    steps: list[deploy.Step],
) -> None:
    deletes = [s for s in reversed(steps) if s.delete is not None]
    lines = deploy.teardown_lines(steps, purge=False)
    assert len(lines) == len(deletes)
    for line, step in zip(lines, deletes, strict=True):
        assert step.delete is not None and line.startswith(dataclasses.replace(step, argv=step.delete).line())
        assert ("<existing>" in line) == ("# <existing>: each name" in line)
    purged = deploy.teardown_lines(steps, purge=True)
    assert purged[: len(lines)] == lines
    assert [p.split()[:3] for p in purged[len(lines) :]] == [["gcloud", "firestore", "bulk-delete"]] * 2


def test_teardown_asks_for_the_project_id_at_a_terminal() -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    tty: Any = Tty()
    assert cli_deploy.confirm("my-proj", False, tty, ask=lambda prompt: "my-proj")
    assert not cli_deploy.confirm("my-proj", False, tty, ask=lambda prompt: "yes")
    asked: list[str] = []

    def ask(prompt: str) -> str:
        asked.append(prompt)
        return ""

    assert not cli_deploy.confirm("my-proj", True, tty, ask=ask)
    assert asked == ["Type the project id (my-proj) to go on: "]


def test_teardown_without_a_terminal_or_yes_refuses_and_deletes_nothing(tmp_path: Path) -> None:
    proc, calls = _pitstop(tmp_path, "teardown", "--project", "my-proj", stdin="my-proj\n")
    assert proc.returncode == 2 and "refusing to delete without --yes" in proc.stderr
    assert calls == []


def test_teardown_with_yes_deletes_without_asking(tmp_path: Path) -> None:
    proc, calls = _pitstop(tmp_path, "teardown", "--project", "my-proj", "--yes", stdin="")
    assert proc.returncode == 0, proc.stderr
    assert any(c.startswith("iam service-accounts delete pitstop-ingest@") for c in calls)
    assert not any("bulk-delete" in c for c in calls)  # the data stays without --purge


def test_teardown_dry_run_runs_no_gcloud(tmp_path: Path) -> None:
    proc, calls = _pitstop(tmp_path, "teardown", "--project", "my-proj", "--dry-run", "--purge")
    assert proc.returncode == 0 and calls == []
    assert "gcloud firestore bulk-delete --database=pitstop " in proc.stdout


def test_purges_help_says_it_deletes_the_collections() -> None:
    assert "delete every collection" in cli_deploy.PURGE_HELP and "bulk-delete" in cli_deploy.PURGE_HELP
