"""The whole pipeline on one machine: every demo scenario, plus fault injection, on one shared stack.

Sink router -> Pub/Sub emulator push -> ingest (functions-framework) -> Firestore emulator ->
Workflows runner -> actuate -> fake Compute + real Slurm via the agent -> notify -> webhook.
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pitstop.local.stack import ClusterSpec, Stack, admin, webhook_records
from pitstop.tools.demo import XID79, Scenarios

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def sc() -> Iterator[Scenarios]:
    stack = Stack(Path(tempfile.mkdtemp(prefix="pitstop-e2e-")), ClusterSpec(nodes=12))
    try:
        stack.up()
        yield Scenarios(stack)
    except BaseException:
        for name in ("ingest", "actuate", "notify", "executions", "slurm-agent"):
            log = stack.workdir / f"{name}.log"
            if log.exists():
                print(f"--- {name}.log ---\n" + "\n".join(log.read_text().splitlines()[-20:]))
        raise
    finally:
        stack.down()


@pytest.mark.parametrize(
    "name",
    [
        "xid79_gang",
        "xid13_storm",
        "preemption",
        "maintenance",
        "duplicate_storm",
        "lemon",
        "blast_radius",
        "poison",
    ],
)
def test_scenario(sc: Scenarios, name: str) -> None:
    if name != "xid13_storm" and name != "poison":
        sc.settle()
    result = getattr(sc, name)()
    assert result.passed, result.detail


def _fault(sc: Scenarios, node: str) -> dict[str, object]:
    sc.settle()
    sc.router.publish(sc.entry(node, XID79))
    return sc.finished(node)


def test_actuate_answering_503_twice_is_retried(sc: Scenarios) -> None:
    node = sc.nodes[8]
    admin(sc.state, "/_admin/inject", {"method": "reset", "code": 503, "reason": "backendError", "count": 2})
    inc = _fault(sc, node)
    assert inc["state"] == "RESOLVED"
    assert len(sc.calls("reset", node)) == 3


def test_compute_rate_limit_is_backed_off(sc: Scenarios) -> None:
    node = sc.nodes[9]
    admin(
        sc.state,
        "/_admin/inject",
        {"method": "reset", "code": 403, "reason": "rateLimitExceeded", "count": 1},
    )
    inc = _fault(sc, node)
    assert inc["state"] == "RESOLVED"
    assert len(sc.calls("reset", node)) == 2


def test_webhook_down_does_not_block_remediation(sc: Scenarios) -> None:
    node = sc.nodes[10]
    hook = sc.state.endpoints["webhook"].rsplit("/", 1)[0]
    urllib.request.urlopen(urllib.request.Request(hook + "/_down", data=b"{}", method="POST"), timeout=5)
    try:
        inc = _fault(sc, node)
        assert inc["state"] == "RESOLVED"  # remediation finished while the webhook was down
        time.sleep(3)
        assert not sc.notes_for(str(inc["id"]))
    finally:
        urllib.request.urlopen(urllib.request.Request(hook + "/_up", data=b"{}", method="POST"), timeout=5)
    notes = sc.wait(lambda: sc.notes_for(str(inc["id"])), 60, "the notification after the webhook returned")
    assert len(notes) == 1
    metrics = [json.loads(x) for x in Path(sc.state.workdir, "metrics.jsonl").read_text().splitlines()]
    assert any(m["type"].endswith("/incidents_resolved") for m in metrics)
    assert any(m["type"].endswith("/time_to_remediate_s") for m in metrics)
    assert webhook_records(sc.state)


def test_firestore_restarted_mid_incident_completes_exactly_once(sc: Scenarios) -> None:
    node = sc.nodes[11]
    sc.settle()
    sc.router.publish(sc.entry(node, XID79))
    sc.wait(
        lambda: [i for i in sc.incidents(node) if i["state"] in ("FENCED", "ACTING", "VERIFYING")],
        60,
        "the incident to be under way",
    )
    sc.stack.restart_firestore(down_s=3.0)  # every function and the agent lose Firestore for a while
    inc = sc.wait(
        lambda: next((i for i in sc.incidents(node)[-1:] if i["state"] in ("RESOLVED", "FAILED")), None),
        180,
        "the incident to finish after the restart",
    )
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert len([i for i in sc.incidents(node) if i["action"] in ("REBOOT_NODE", "REPLACE_NODE")]) == 1
    assert len(sc.calls("reset", node)) + len(sc.calls("report_host_as_faulty", node)) == 1
