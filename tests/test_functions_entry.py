"""The deployed entry points under functions-framework: Pub/Sub push in, incident out, poison → 500."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from functions_framework import create_app
from google.cloud import firestore

from pitstop.local.executions_server import ExecutionsService

from .helpers import ops_agent_entry

ROOT = Path(__file__).resolve().parents[1]
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@pytest.fixture
def ingest_app(
    firestore_host: str, pubsub_host: str, executions: tuple[ExecutionsService, str], tmp_path: Path
) -> Iterator[Any]:
    import main  # functions/main.py, as Cloud Functions loads it

    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: enforce\n")
    env = {
        "GOOGLE_CLOUD_PROJECT": "fn-entry-test",
        "PITSTOP_POLICY": str(policy),
        "PITSTOP_WORKFLOWS_ENDPOINT": executions[1],
        "PITSTOP_FIRESTORE_DATABASE": "pitstop",  # as deploy sets it: Pitstop's own database
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    main._ingest.cache_clear()
    try:
        app = create_app("ingest", str(ROOT / "functions" / "main.py"), "cloudevent")  # type: ignore[no-untyped-call]
        yield app.test_client()
    finally:
        main._ingest.cache_clear()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _push(entry: dict[str, Any] | None, data: str | None = None) -> dict[str, Any]:
    payload = data if data is not None else base64.b64encode(json.dumps(entry).encode()).decode()
    return {
        "subscription": "projects/fn-entry-test/subscriptions/pitstop-ingest",
        "message": {"data": payload, "messageId": "m-1", "publishTime": "2027-01-15T08:00:00Z"},
    }


def test_push_delivery_opens_incident_and_starts_workflow(
    ingest_app: Any, executions: tuple[ExecutionsService, str]
) -> None:
    resp = ingest_app.post(
        "/projects/fn-entry-test/topics/pitstop-events",
        json=_push(ops_agent_entry(XID79, instance="a3-node-042")),
    )
    assert resp.status_code == 200
    db = firestore.Client(project="fn-entry-test", database="pitstop")
    docs = [d.to_dict() for d in db.collection("pitstop_incidents").stream()]
    assert len(docs) == 1 and docs[0] is not None
    default = firestore.Client(project="fn-entry-test").collection("pitstop_incidents")
    assert list(default.stream()) == []  # nothing in the project's default database
    assert docs[0]["node"]["instance"] == "a3-node-042"
    assert executions[0].created == 1


def test_unrelated_is_acknowledged(ingest_app: Any) -> None:
    resp = ingest_app.post(
        "/projects/fn-entry-test/topics/pitstop-events", json=_push(ops_agent_entry("systemd[1]: hi"))
    )
    assert resp.status_code == 200


def test_poison_is_retried_for_dead_lettering(ingest_app: Any) -> None:
    resp = ingest_app.post("/projects/fn-entry-test/topics/pitstop-events", json=_push(None, data="%%%"))
    assert resp.status_code == 500


def test_sigterm_merges_counts_buffered_by_handlers_in_worker_threads(
    ingest_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handlers run in worker threads (where no signal handler can be installed); the hook is
    installed when main.py is imported, in the main thread, and flushes what they buffered."""
    import signal
    from concurrent.futures import ThreadPoolExecutor

    import main

    assert signal.getsignal(signal.SIGTERM) is main._on_sigterm
    lines = 40

    def deliver() -> None:
        main._ingest().coalescer.timer = False  # only the shutdown hook merges here
        for i in range(lines):
            e = ops_agent_entry(XID79, instance="a3-node-043", insert_id=f"term-{i}")
            body = _push(e)
            body["message"]["messageId"] = f"term-{i}"
            assert (
                ingest_app.post("/projects/fn-entry-test/topics/pitstop-events", json=body).status_code == 200
            )

    with ThreadPoolExecutor(1) as pool:
        pool.submit(deliver).result()
    incidents = firestore.Client(project="fn-entry-test", database="pitstop").collection("pitstop_incidents")

    def counted() -> int:
        docs = [d.to_dict() or {} for d in incidents.stream()]
        return sum(d["counts"]["events"] for d in docs if d["node"]["instance"] == "a3-node-043")

    assert counted() < lines  # a storm's counts wait in memory
    chained: list[int] = []
    monkeypatch.setattr(main, "_previous_sigterm", lambda signum, frame: chained.append(signum))
    main._on_sigterm(signal.SIGTERM, None)
    assert counted() == lines
    assert chained == [signal.SIGTERM]  # then the server's own SIGTERM handling goes on
