"""The sweep isolates each incident's failure (issue 21 (8)): a workflow start Workflows refuses
(quota, permission, a wrong name) fails that incident with a page; the other incidents' starts, the
watchdog and the outbox still run. On the memory store (tests/adapters/test_store_port.py: same semantics)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import aggregate, policy
from pitstop.services import sweep as sweep_mod
from pitstop.services.ingest import Ingest
from pitstop.services.sweep import Sweep
from tests.helpers import ManualClock as Clock
from tests.helpers import RecordingTopic as Recorder
from tests.helpers import ops_agent_entry

T0 = 1_800_000_000.0
CLUSTER = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-node-*"}}
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


class Starter:
    """Workflows' executions.create, refusing for the incidents named in ``refuse``."""

    def __init__(self) -> None:
        self.refuse: dict[str, Exception] = {}
        self.started: list[str] = []

    def find(self, incident_id: str, step: int) -> str | None:
        return None

    def start(self, incident_id: str, step: int, argument: Mapping[str, Any]) -> str:
        if incident_id in self.refuse:
            raise self.refuse[incident_id]
        self.started.append(incident_id)
        return f"executions/{incident_id}-{step}"


def _rig() -> tuple[Ingest, Starter, Recorder, Clock]:
    clock, starter, topic = Clock(), Starter(), Recorder()
    wide = {"max_nodes": 8, "max_percent": 100}
    pol = policy.from_doc(
        {"mode": "enforce", "clusters": [CLUSTER], "budgets": {"cluster": wide, "zone": wide}}
    )
    return Ingest(pol, MemoryStore(), starter, topic, clock=clock), starter, topic, clock


def _open(ing: Ingest, node: str, starter: Starter, refuse: Exception | None) -> str:
    """An incident decided with its start left pending (as when ingest's own start was refused)."""
    ops = ops_agent_entry(XID79, instance=node, insert_id=f"{node}-1")
    out = ing.store.apply(
        {**ing.classifier.classify(ops), "_observed_ts": ing.clock()}, ing.policy, ing.clock()
    )
    assert out.incident is not None and out.start_step == 1
    iid = str(out.incident["id"])
    if refuse is not None:
        starter.refuse[iid] = refuse
    return iid


def _lease_out(ing: Ingest, clock: Clock) -> None:
    clock.t += 3600  # every start lease has run out: the sweep starts what is pending


def test_a_refused_start_fails_its_incident_with_a_page_and_the_rest_go_on() -> None:
    ing, starter, topic, clock = _rig()
    bad = _open(ing, "a3-node-001", starter, gexc.PermissionDenied("workflows.executions.create denied"))  # type: ignore[no-untyped-call]
    good = _open(ing, "a3-node-002", starter, None)
    _lease_out(ing, clock)
    counts = Sweep(ing).run()
    assert counts["restarted"] == 1 and starter.started == [good]
    inc = ing.store.get(bad)
    assert inc is not None and inc["state"] == "FAILED" and inc["failure"]["stage"] == "start"
    assert "PermissionDenied" in inc["failure"]["error"]
    pages = [n for n in topic.published if n["kind"] == "page"]
    assert [p["incident"]["id"] for p in pages] == [bad] and "could not start" in pages[0]["summary"]


def test_a_transient_refusal_is_retried_then_pages_on_the_third() -> None:
    ing, starter, topic, clock = _rig()
    iid = _open(ing, "a3-node-003", starter, gexc.TooManyRequests("quota"))  # type: ignore[no-untyped-call]
    for n in range(1, aggregate.START_REFUSALS + 1):
        _lease_out(ing, clock)
        Sweep(ing).run()
        inc = ing.store.get(iid)
        assert inc is not None and inc["start_refusals"] == n
        assert inc["state"] == ("FAILED" if n == aggregate.START_REFUSALS else "OPEN"), n
    assert [p["incident"]["id"] for p in topic.published if p["kind"] == "page"] == [iid]


def test_a_broken_phase_does_not_stop_the_watchdog_or_the_outbox(monkeypatch: pytest.MonkeyPatch) -> None:
    ing, starter, _, clock = _rig()

    def broken(store: object, now: float) -> int:
        raise RuntimeError("the store's query failed")

    monkeypatch.setattr(sweep_mod, "close_bursts", broken)
    good = _open(ing, "a3-node-004", starter, None)
    _lease_out(ing, clock)
    counts = Sweep(ing).run()
    assert counts["closed"] == 0 and counts["restarted"] == 1 and starter.started == [good]
