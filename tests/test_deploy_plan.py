"""The deploy plan read from infra/resources.yaml equals the baseline of the hand-written plan.

tests/fixtures/deploy/ holds every field of every step, and the dry-run output, of the code this
replaced. Only the `pitstop_config` label values may differ: they digest the shipped code, which
changes with every edit. The fixtures are never regenerated from the code under test.
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
from pitstop.tools import deploy

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "deploy"
BASELINE_ROOT, BASELINE_TMP = "/work/main", "/tmp"  # where the fixtures were recorded
CASES = [  # name, --project, --region, --config
    ("default", "demo-proj", None, None),
    ("slurm-folder", "demo-proj", None, "tests/fixtures/deploy/slurm-folder.yaml"),
    ("org", "p-2", "asia-southeast1", "tests/fixtures/deploy/org.yaml"),
]


def _normalised(text: str) -> str:
    """Digest labels (and the expect values equal to them) as a token; paths as recorded."""
    for digest in set(re.findall(r"pitstop_config=([0-9a-f]+)", text)):
        text = text.replace(f'"{digest}"', '"<digest>"')  # a step's expect: the label it checks for
    text = re.sub(r"pitstop_config=[0-9a-f]+", "pitstop_config=<digest>", text)
    metric = "pitstop-xid-metric.json"
    text = text.replace(str(Path(tempfile.gettempdir()) / metric), f"{BASELINE_TMP}/{metric}")
    return text.replace(str(deploy.ROOT), BASELINE_ROOT)


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the fixture configs name their policy file relative to the repository


@pytest.mark.parametrize(("name", "project", "region", "config"), CASES, ids=[c[0] for c in CASES])
def test_plan_equals_the_baseline(name: str, project: str, region: str | None, config: str | None) -> None:
    conf = deploy.load_config(config)
    steps = deploy.plan(project, region or conf["region"], conf)
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
    assert len(labelled) == 5  # four functions and the workflow
    for step in labelled:
        assert any(a.endswith(f"{deploy.DIGEST_LABEL}={step.expect}") for a in step.argv), step.what
    assert [s.expect for s in first] == [s.expect for s in again]


def test_planning_writes_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for _, project, region, config in CASES:
        conf = deploy.load_config(config)
        deploy.plan(project, region or conf["region"], conf)
        deploy.dry_run_lines(project, region or conf["region"], conf)
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
    ]
