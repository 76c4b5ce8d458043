"""Shared fixtures: Google's emulators (started once per session) and a local Executions API."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.cloud import firestore
from google.cloud.pubsub_v1 import PublisherClient, SubscriberClient

from pitstop.local import executions_server, procs

MODULE_SECONDS = Path(__file__).with_name("module-seconds.yaml")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first, so the run does not end on one long module while workers idle.

    With `-n 4 --dist loadfile --no-loadscope-reorder` (Makefile) xdist hands out files in this
    order; the sort is stable, so a module's tests keep their order and stay together.
    """
    seconds: dict[str, float] = yaml.safe_load(MODULE_SECONDS.read_text())
    root = MODULE_SECONDS.parent.parent
    items.sort(key=lambda item: -seconds.get(item.path.relative_to(root).as_posix(), 0.0))


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack")


@pytest.fixture(scope="session")
def firestore_host(workdir: Path) -> Iterator[str]:
    proc, host = procs.start_emulator("firestore", workdir)
    os.environ["FIRESTORE_EMULATOR_HOST"] = host
    try:
        yield host
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def pubsub_host(workdir: Path) -> Iterator[str]:
    proc, host = procs.start_emulator("pubsub", workdir)
    os.environ["PUBSUB_EMULATOR_HOST"] = host
    try:
        yield host
    finally:
        proc.stop()


@pytest.fixture
def fs_client(firestore_host: str) -> firestore.Client:
    """A Firestore client on a project of its own, so tests never see each other's documents."""
    return firestore.Client(project=f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def executions() -> Iterator[tuple[executions_server.ExecutionsService, str]]:
    svc = executions_server.ExecutionsService(runner=None)
    server, port = executions_server.serve(svc)
    try:
        yield svc, f"127.0.0.1:{port}"
    finally:
        server.stop(0)


@pytest.fixture
def notifications(pubsub_host: str) -> Iterator[tuple[str, str, SubscriberClient]]:
    """A fresh notifications topic with a pull subscription: (project, topic, subscriber)."""
    project = f"t-{uuid.uuid4().hex[:10]}"
    pub = PublisherClient()
    sub = SubscriberClient()
    topic = pub.topic_path(project, "pitstop-notifications")
    pub.create_topic(name=topic)
    sub.create_subscription(name=sub.subscription_path(project, "pull"), topic=topic)
    yield project, "pitstop-notifications", sub
    sub.close()


@pytest.fixture
def api(kube: Any, tmp_path: Path) -> Any:
    """The official Kubernetes client against the module's fake API server (its ``kube`` fixture)."""
    from kubernetes import config

    path = tmp_path / "kubeconfig"
    kube.write_kubeconfig(path)
    return config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
