"""A channel or a scheduler is one folder, found by the registries with no table to edit
(core/plugins.py, services/channels.py, services/schedulers.py, tools/deploy.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pitstop.core import plugins
from pitstop.core import policy as policy_mod
from pitstop.core.resources import DataFileError
from pitstop.services import channels, schedulers
from pitstop.tools import deploy


@pytest.fixture
def extra_scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The shipped plugin folders, copied, with a scheduler folder ``toy`` added (a policy block only)."""
    root = tmp_path / "plugins"
    shutil.copytree(plugins.plugins_dir(), root, ignore=shutil.ignore_patterns("__pycache__"))
    toy = root / "schedulers" / "toy"
    toy.mkdir()
    (toy / "plugin.yaml").write_text(
        "name: toy\nkind: schedulers\norder: 99\nsummary: a test\npolicy_block: required\n"
    )
    block = {"type": "object", "additionalProperties": False, "properties": {"depth": {"type": "integer"}}}
    (toy / "policy.schema.json").write_text(json.dumps(block))
    monkeypatch.setattr(plugins, "plugins_dir", lambda: root)
    plugins.found.cache_clear()
    plugins.policy_validator.cache_clear()
    yield toy
    plugins.found.cache_clear()
    plugins.policy_validator.cache_clear()


def _cluster(scheduler: str, **block: object) -> dict[str, object]:
    return {"name": "c", "scheduler": scheduler, "match": {"name_pattern": "c-*"}, **block}


def test_a_scheduler_folder_adds_its_name_and_its_policy_block(extra_scheduler: Path) -> None:
    pol = policy_mod.from_doc({"clusters": [_cluster("toy", toy={"depth": 3})]})
    assert pol.clusters[0].block("toy") == {"depth": 3}
    with pytest.raises(DataFileError, match="'toy' is a required property"):
        policy_mod.from_doc({"clusters": [_cluster("toy")]})
    with pytest.raises(DataFileError, match="clusters/0/toy/depth"):
        policy_mod.from_doc({"clusters": [_cluster("toy", toy={"depth": "deep"})]})
    shutil.rmtree(extra_scheduler)  # the folder gone, its name is no scheduler
    plugins.found.cache_clear()
    plugins.policy_validator.cache_clear()
    with pytest.raises(DataFileError, match="clusters/0/scheduler: 'toy' is not one of"):
        policy_mod.from_doc({"clusters": [_cluster("toy")]})


def test_the_shipped_folders_are_the_registries() -> None:
    assert plugins.names("channels") == ["webhook", "pagerduty", "generic_webhook"]
    assert list(channels.builders()) == plugins.names("channels")
    assert list(schedulers.factories()) == plugins.names("schedulers")
    assert plugins.names("schedulers") == ["slurm", "gke", "kubernetes", "vertex"]


def test_a_manifest_must_name_its_own_folder(extra_scheduler: Path) -> None:
    (extra_scheduler / "plugin.yaml").write_text("name: other\nkind: schedulers\norder: 1\nsummary: x\n")
    plugins.found.cache_clear()
    with pytest.raises(DataFileError, match="name and kind must be the folder's"):
        plugins.found("schedulers")


def test_deploy_takes_each_folders_fragment_and_only_when_its_key_is_set() -> None:
    def notify(conf: dict[str, object]) -> list[str]:
        steps = deploy.plan("demo-proj", "us-central1", {**deploy.load_config(None), **conf})
        return next(s.argv for s in steps if s.argv[:3] == ["functions", "deploy", "pitstop-notify"])

    plain = notify({})
    assert "--set-secrets=PITSTOP_WEBHOOK_URL=pitstop-webhook:latest" in plain
    assert any(a.startswith("--set-env-vars=") and "PITSTOP_WEBHOOK_FORMAT=chat" in a for a in plain)
    signed = notify({"generic_webhook": True})
    assert (
        "--set-secrets=PITSTOP_WEBHOOK_URL=pitstop-webhook:latest,"
        "PITSTOP_GENERIC_WEBHOOK_URL=pitstop-generic-webhook:latest,"
        "PITSTOP_GENERIC_WEBHOOK_KEY=pitstop-generic-webhook-key:latest"
    ) in signed
    steps = deploy.plan("demo-proj", "us-central1", {**deploy.load_config(None), "generic_webhook": True})
    lines = [s.line() for s in steps]
    assert any("secrets create pitstop-generic-webhook-key" in x for x in lines)
    assert any(
        "secrets add-iam-policy-binding pitstop-generic-webhook-key" in x and "pitstop-notify@" in x
        for x in lines
    )


def test_deploy_checks_the_keys_a_folder_declares(tmp_path: Path) -> None:
    conf = tmp_path / "deploy.yaml"
    conf.write_text("webhook_format: teams\n")
    with pytest.raises(ValueError, match="webhook_format"):
        deploy.load_config(str(conf))
    conf.write_text("generic_webhook: 'yes'\n")
    with pytest.raises(ValueError, match="generic_webhook"):
        deploy.load_config(str(conf))
