"""The deployed entry points under functions-framework: Pub/Sub push in, incident out, poison → 500."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import pytest
from functions_framework import create_app
from google.cloud import firestore

from pitstop.adapters.firestore import IncidentStore
from pitstop.local.executions_server import ExecutionsService
from tests.helpers import ops_agent_entry

ROOT = Path(__file__).resolve().parents[2]
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def _function_env(tmp_path: Path, project: str, workflows: str) -> dict[str, str]:
    """What deploy sets for a function, on the emulators: a policy file, Pitstop's own database."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: enforce\n")
    return {
        "GOOGLE_CLOUD_PROJECT": project,
        "PITSTOP_POLICY": str(policy),
        "PITSTOP_WORKFLOWS_ENDPOINT": workflows,
        "PITSTOP_FIRESTORE_DATABASE": "pitstop",  # as deploy sets it: Pitstop's own database
    }


@pytest.fixture
def ingest_app(
    firestore_host: str, pubsub_host: str, executions: tuple[ExecutionsService, str], tmp_path: Path
) -> Iterator[Any]:
    import main  # functions/main.py, as Cloud Functions loads it

    env = _function_env(tmp_path, "fn-entry-test", executions[1])
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


def test_an_instance_whose_first_deliveries_arrive_together_builds_one_ingest(
    ingest_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """functools.cache built the ingest service once per thread that asked first: two coalescers
    in one instance, and a redelivered line counted twice (issue 23). Both first callers here are
    held inside the build until the other arrives or 2 s pass: one build, one service."""
    import main
    from pitstop.core import policy as policy_mod  # main loads the policy through it

    real_load, met = policy_mod.load, threading.Barrier(2)

    def load_when_both_are_in() -> Any:
        with contextlib.suppress(threading.BrokenBarrierError):
            met.wait(timeout=2)  # the fixed build lets one thread in: the other waits outside
        return real_load()

    monkeypatch.setattr(policy_mod, "load", load_when_both_are_in)
    main._ingest.cache_clear()
    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda _: main._ingest(), range(2)))
    assert built[0] is built[1] is main._ingest()


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
    store = IncidentStore(firestore.Client(project="fn-entry-test", database="pitstop"))

    def counted() -> int:  # each incident with its count shards summed
        docs = [cast(Any, d) for d in store.query()]
        return sum(d["counts"]["events"] for d in docs if d["node"]["instance"] == "a3-node-043")

    assert counted() < lines  # a storm's counts wait in memory
    chained: list[int] = []
    monkeypatch.setattr(main, "_previous_sigterm", lambda signum, frame: chained.append(signum))
    main._on_sigterm(signal.SIGTERM, None)
    assert counted() == lines
    assert chained == [signal.SIGTERM]  # then the server's own SIGTERM handling goes on


_LOADED_BY = """
import json, sys
import main

def loaded():
    heavy = ("google.cloud.compute_v1", "google.cloud.monitoring_v3")
    return sorted(h for h in heavy if h in sys.modules)

seen = {"import": loaded()}
seen["result"] = main._ingest().handle_payload(json.loads(sys.argv[1])).result
main._ingest().coalescer.flush_all(0.0)
main._sweep().run()
seen["ingest_and_sweep"] = loaded()
main._actuator()
main._notify()
seen["actuate_and_notify"] = loaded()
print(json.dumps(seen))
"""


@pytest.mark.emulator
def test_an_ingest_instance_never_loads_the_clients_only_other_functions_need(
    firestore_host: str, pubsub_host: str, executions: tuple[ExecutionsService, str], tmp_path: Path
) -> None:
    """Every function is deployed from main.py; google-cloud-compute's types are ~94 MiB resident
    and monitoring's ~40 MiB. Ingest's instances hold a storm's state, so they load neither."""
    import subprocess
    import sys

    env = {
        **os.environ,
        **_function_env(tmp_path, "fn-entry-imports", executions[1]),
        "PITSTOP_COMPUTE_ENDPOINT": "http://127.0.0.1:9",  # built by actuate, never called here
        "PITSTOP_MONITORING_ENDPOINT": "http://127.0.0.1:9",
        "PITSTOP_KUBE_ENDPOINT": "http://127.0.0.1:9",
    }
    body = json.dumps(_push(ops_agent_entry(XID79, instance="a3-node-044")))
    proc = subprocess.run(
        [sys.executable, "-c", _LOADED_BY, body],
        cwd=ROOT / "functions",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["result"] == "opened"  # the whole ingest path ran: classify, store, start
    assert seen["import"] == [] and seen["ingest_and_sweep"] == []
    assert seen["actuate_and_notify"] == ["google.cloud.compute_v1", "google.cloud.monitoring_v3"]


@pytest.mark.emulator
def test_notifys_ledger_is_written_in_its_own_database_only(firestore_host: str, tmp_path: Path) -> None:
    """Issue 21 (12): deploy gives notify PITSTOP_NOTIFY_DATABASE and a datastore.user grant on
    that database alone (infra/iam.yaml notify-database); its ledger must land there, and nothing
    in Pitstop's incidents database, which its grant no longer reaches."""
    import http.server
    import threading

    import main

    posts: list[bytes] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posts.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        **_function_env(tmp_path, "fn-entry-notify", "127.0.0.1:9"),
        "PITSTOP_NOTIFY_DATABASE": "pitstop-notify",
        "PITSTOP_METRICS": "off",
        "PITSTOP_WEBHOOK_URL": f"http://127.0.0.1:{server.server_address[1]}/hook",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    main._notify.cache_clear()
    try:
        app = create_app("notify", str(ROOT / "functions" / "main.py"), "cloudevent")  # type: ignore[no-untyped-call]
        note = {"id": "n-ledger-1", "kind": "incident_opened", "severity": "warning", "summary": "Xid 79"}
        data = base64.b64encode(json.dumps(note).encode()).decode()
        event = {
            "specversion": "1.0",
            "type": "google.cloud.pubsub.topic.v1.messagePublished",
            "source": "//pubsub.googleapis.com/projects/fn-entry-notify/topics/pitstop-notifications",
            "id": "m-9",
            "data": {"message": {"data": data, "messageId": "m-9"}},
        }
        resp = app.test_client().post(
            "/", json=event, headers={"Content-Type": "application/cloudevents+json"}
        )
        assert resp.status_code == 200 and len(posts) == 1
    finally:
        main._notify.cache_clear()
        server.shutdown()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    own = firestore.Client(project="fn-entry-notify", database="pitstop-notify")
    assert [d.id for d in own.collection("pitstop_notifications").stream()] == ["n-ledger-1.webhook"]
    pitstop = firestore.Client(project="fn-entry-notify", database="pitstop")
    assert list(pitstop.collection("pitstop_notifications").stream()) == []
