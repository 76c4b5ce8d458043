"""Every incident ends, and storms cost little: the watchdog, closing by a person, FAILED incidents'
budget slots, and the coalescer's timer, cache and bounds (Firestore emulator, local Executions API).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any, cast

import pytest
from google.cloud import firestore

from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.slurm import SlurmAgentClient, SlurmScheduler
from pitstop.adapters.workflows import WorkflowStarter
from pitstop.core import policy
from pitstop.core.aggregate import CloseByPerson
from pitstop.core.domain import Draft, Incident
from pitstop.core.scheduling import StepRef, UnfenceAnswer
from pitstop.local.executions_server import ExecutionsService
from pitstop.services.ingest import Ingest
from pitstop.services.sweep import Sweep
from tests.helpers import ManualClock, RecordingTopic, hand_edit, ops_agent_entry, syslog_entry

pytestmark = pytest.mark.emulator

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
CLUSTER = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-node-*"}}
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
FIRST_LINES = 8  # more than a node's first lines, which the coalescer commits one by one
XID94 = (
    "NVRM: Xid (PCI:0000:1b:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No"
)


Clock = ManualClock


class Recorder(RecordingTopic):
    """An in-memory notifications topic."""

    def pages(self) -> list[dict[str, Any]]:
        return [n for n in self.published if n["kind"] == "page"]


def make_policy(**over: Any) -> policy.Policy:
    doc: dict[str, Any] = {"mode": "enforce", "clusters": [CLUSTER]}
    doc.update(over)
    return policy.from_doc(doc)


def entry(line: str, node: str, n: int, ts: str = "2027-01-15T08:00:00Z") -> dict[str, Any]:
    e = ops_agent_entry(line, instance=node, insert_id=f"{node}-{n}")
    e["timestamp"] = ts
    return e


def make_ingest(
    fs: firestore.Client,
    endpoint: str | None,
    pol: policy.Policy,
    clock: Clock,
    topic: Recorder | None = None,
) -> Ingest:
    starter = (
        WorkflowStarter("train-prod", "us-central1", "pitstop-remediate", endpoint) if endpoint else None
    )
    return Ingest(pol, IncidentStore(fs, "pitstop"), starter, topic, clock=clock)


def started(ing: Ingest, node: str, state: str = "FENCED") -> tuple[str, str]:
    """An incident whose step-1 execution started and moved it to ``state``: (incident, execution)."""
    out = ing.handle_payload(entry(XID79, node, 1))
    assert out.result == "opened" and out.incident is not None
    iid = str(out.incident["id"])
    inc: Any = ing.store.get(iid)
    assert inc is not None and inc["workflow"]["state"] == "started"
    hand_edit(ing.store, iid, lambda d: d.update({"state": state}))
    return iid, str(inc["workflow"]["execution"])


# -- B: the watchdog ---------------------------------------------------------------------------


def test_watchdog_fails_an_incident_whose_execution_ended_without_closing_it(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    clock, topic = Clock(), Recorder()
    ing = make_ingest(fs_client, endpoint, make_policy(), clock, topic)
    iid, name = started(ing, "a3-node-060")
    clock.t += 60
    assert Sweep(ing).run()["failed"] == 0  # running, well inside its deadline
    svc.finish(name, "FAILED", "actuate unreachable")
    clock.t += 60
    assert Sweep(ing).run()["failed"] == 1
    inc = ing.store.get(iid)
    assert inc is not None and inc["state"] == "FAILED"
    assert inc["failure"]["stage"] == "watchdog"
    assert "ended FAILED without closing the incident: actuate unreachable" in inc["failure"]["error"]
    (page,) = topic.pages()
    assert page["severity"] == "critical" and page["incident"]["id"] == iid
    assert page["incident"]["state"] == "FAILED" and "stays fenced" in page["summary"]
    budget = ing.store.records.budget("cluster-train")
    assert budget is not None and budget["slots"][iid]["active"] is True  # fenced: counts until closed
    assert Sweep(ing).run()["failed"] == 0  # once
    assert len(topic.pages()) == 1


def test_watchdog_cancels_and_fails_an_execution_past_its_deadline(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    clock, topic = Clock(), Recorder()
    pol = make_policy(watchdog={"deadline_s": {"REBOOT_NODE": 90000}})
    ing = make_ingest(fs_client, endpoint, pol, clock, topic)
    iid, name = started(ing, "a3-node-061", state="ACTING")
    clock.t = T0 + 89999
    assert Sweep(ing).run()["failed"] == 0
    assert svc.records[name].execution.state.name == "ACTIVE"
    clock.t = T0 + 90001
    assert Sweep(ing).run()["failed"] == 1
    inc = ing.store.get(iid)
    assert inc is not None and inc["state"] == "FAILED"
    assert "still ACTIVE after 90001 s (deadline 90000 s)" in inc["failure"]["error"]
    assert svc.records[name].execution.state.name == "CANCELLED"
    assert [p["incident"]["id"] for p in topic.pages()] == [iid]


def test_watchdog_waits_out_computes_maintenance_window_never_the_log_entrys(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    """Issue 35 (low): a maintenance incident's window_end is the log entry's windowEndTime, which
    a publisher to the events topic sets at will; it once stretched the deadline as far as it
    said. Only the window Compute gave act (its verify_wait_s from the VM's upcomingMaintenance)
    stretches it now."""
    from pitstop.core.domain import Maintenance, StepRecord
    from pitstop.core.ops import Op, step_key

    svc, endpoint = executions
    clock, topic = Clock(), Recorder()
    budgets = {"cluster": {"max_percent": 100}}
    pol = make_policy(watchdog={"deadline_s": {"REBOOT_NODE": 90000}}, budgets=budgets)
    ing = make_ingest(fs_client, endpoint, pol, clock, topic)
    forged, forged_ex = started(ing, "a3-node-064", state="ACTING")
    honest, honest_ex = started(ing, "a3-node-065", state="VERIFYING")
    year = "2028-01-15T08:00:00Z"  # a year past T0, as the entry said
    window: Maintenance = {"window_start": None, "window_end": year, "maintenance_status": "PENDING"}

    def as_the_entry_said(doc: Draft) -> Draft:
        doc["maintenance"] = window
        return doc

    for iid in (forged, honest):
        hand_edit(ing.store, iid, as_the_entry_said)  # as ingest kept what the entry said
    # act recorded Compute's own window for the honest one: it ends 2 days after T0
    acted: StepRecord = {
        "state": "done",
        "result": {"method": "wait_for_platform", "verify_wait_s": 2 * 86400.0},
        "at": T0,
    }
    assert ing.store.steps(honest).create(step_key(1, Op.ACT), acted)
    clock.t = T0 + 90001
    assert Sweep(ing).run()["failed"] == 1
    states = {i: cast(Any, ing.store.get(i) or {}).get("state") for i in (forged, honest)}
    assert states == {forged: "FAILED", honest: "VERIFYING"}
    assert svc.records[forged_ex].execution.state.name == "CANCELLED"
    clock.t = T0 + 2 * 86400 + 90001  # Compute's window and the step's own deadline after it
    assert Sweep(ing).run()["failed"] == 1
    assert svc.records[honest_ex].execution.state.name == "CANCELLED"


def test_watchdog_leaves_resolved_incidents_and_running_executions_alone(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    clock, topic = Clock(), Recorder()
    ing = make_ingest(
        fs_client, endpoint, make_policy(budgets={"cluster": {"max_percent": 100}}), clock, topic
    )
    done, done_ex = started(ing, "a3-node-062", state="VERIFYING")
    running, _ = started(ing, "a3-node-063", state="ACTING")
    hand_edit(ing.store, done, lambda d: d.update({"state": "RESOLVED"}))  # its execution closed it...
    svc.finish(done_ex, "SUCCEEDED")  # ... and ended
    clock.t += 1800  # inside REBOOT_NODE's default 45 minutes
    assert Sweep(ing).run()["failed"] == 0
    states = {i: cast(Any, ing.store.get(i) or {}).get("state") for i in (done, running)}
    assert states == {done: "RESOLVED", running: "ACTING"}
    assert topic.pages() == []


# -- A: FAILED incidents keep their budget slot until a person closes them ------------------------


def test_a_failed_incidents_node_counts_against_the_budget_until_a_person_closes_it(
    fs_client: firestore.Client,
) -> None:
    """Issue 21 (11): a FAILED incident leaves its node fenced, so it keeps its blast-radius slot past
    the window (else every failure would free a slot and fence one more node); the close frees it."""
    clock = Clock()
    topic = Recorder()
    ing = make_ingest(fs_client, None, make_policy(), clock, topic)  # cluster of 8: one node at a time
    first = ing.handle_payload(entry(XID79, "a3-node-070", 1)).incident
    assert first is not None

    def fail(d: dict[str, Any]) -> None:  # what actuate's fail op records
        d.update({"state": "FAILED", "failure": {"stage": "act", "error": "reset failed", "at": T0 + 60}})

    hand_edit(ing.store, first["id"], fail)
    clock.t = T0 + 1900  # the window slid past the failed incident's claim
    assert "settled" not in Sweep(ing).run()
    second = ing.handle_payload(entry(XID79, "a3-node-071", 1))
    assert second.result == "held" and second.incident is not None and second.start_step is None
    assert "failed incident no person has closed" in topic.pages()[-1]["summary"]
    assert Sweep(ing).run()["released"] == 0  # the sweep alone never frees it
    ing.store.decide(first["id"], CloseByPerson("alice", False), None, clock.t + 1)
    clock.t += 60
    assert Sweep(ing).run()["released"] == 1
    assert cast(Any, ing.store.get(second.incident["id"]) or {})["state"] == "OPEN"


def test_close_ends_failed_held_and_open_incidents_for_a_person(fs_client: firestore.Client) -> None:
    from pitstop.services.close import close_incident

    clock = Clock()
    ing = make_ingest(fs_client, None, make_policy(), clock)
    first = ing.handle_payload(entry(XID79, "a3-node-080", 1)).incident
    held = ing.handle_payload(entry(XID79, "a3-node-081", 1)).incident
    assert first is not None and held is not None and held["state"] == "HELD"
    hand_edit(ing.store, first["id"], lambda d: d.update({"state": "FAILED"}))
    store, now = ing.store, T0 + 3600
    done = close_incident(store, {}, first["id"], "alice", now, unfence=False)
    assert done.ok and "stays fenced" in done.lines[-1]
    inc = store.get(first["id"])
    assert inc is not None and inc["state"] == "RESOLVED" and inc["timeline"]["closed"] == now
    assert inc["closure"] == {"by": "alice", "at": now, "from_state": "FAILED", "unfence": False}
    assert close_incident(store, {}, held["id"], "bob", now, unfence=False).ok
    again = close_incident(store, {}, held["id"], "bob", now, unfence=False)
    assert not again.ok and "already RESOLVED" in again.lines[0]
    # a fault after the close is a new episode: a new incident, with the freed budget
    clock.t = T0 + 7200
    fresh = ing.handle_payload(entry(XID79, "a3-node-080", 2, ts="2027-01-15T10:00:00Z"))
    assert fresh.result == "opened" and fresh.incident is not None and fresh.incident["id"] != first["id"]


def test_close_refuses_an_incident_an_execution_works_on(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    from pitstop.services.close import close_incident

    _, endpoint = executions
    ing = make_ingest(fs_client, endpoint, make_policy(), Clock())
    iid, _ = started(ing, "a3-node-082", state="OPEN")  # claimed, about to fence
    refused = close_incident(ing.store, {}, iid, "alice", T0 + 10, unfence=False)
    assert not refused.ok and "working on it" in refused.lines[0]
    inc = ing.store.get(iid)
    assert inc is not None and inc["state"] == "OPEN"


class _Agent:
    """A Pub/Sub publisher and the cluster's Slurm agent behind it: answers each command at once."""

    def __init__(self, results: Any, answer: Mapping[str, Any]) -> None:
        self.results, self.answer = results, answer
        self.commands: list[dict[str, Any]] = []

    def topic_path(self, project: str, topic: str) -> str:
        return f"projects/{project}/topics/{topic}"

    def publish(self, topic: str, data: bytes, **attrs: str) -> Any:
        cmd = json.loads(data)
        self.commands.append({"topic": topic, **cmd})
        self.results.document(cmd["id"]).set({"state": "done", "result": dict(self.answer)})
        return type("Done", (), {"result": lambda self, timeout=None: "1"})()


def test_close_unfence_sends_the_resume_actuate_would_and_records_the_answer(
    fs_client: firestore.Client,
) -> None:
    from pitstop.services.close import close_incident

    ing = make_ingest(fs_client, None, make_policy(), Clock())
    first = ing.handle_payload(entry(XID79, "a3-node-090", 1)).incident
    assert first is not None
    hand_edit(ing.store, first["id"], lambda d: d.update({"state": "FAILED"}))
    results = fs_client.collection("pitstop_slurm_results")
    agent = _Agent(results, {"resumed": True})
    client = SlurmAgentClient(agent, agent.topic_path("train-prod", "pitstop-slurm-train"), results, wait_s=5)
    done = close_incident(ing.store, {"train": SlurmScheduler(client)}, first["id"], "carol", T0 + 60, True)
    assert done.ok and done.lines[-1].endswith("unfence done: a3-node-090 resumed")
    (cmd,) = agent.commands
    assert cmd["op"] == "resume" and cmd["args"] == {"node": "a3-node-090", "incident": first["id"]}
    assert cmd["topic"].endswith("/pitstop-slurm-train")
    inc = ing.store.get(first["id"])
    assert inc is not None and inc["closure"]["unfence"] == {
        "outcome": "done",
        "detail": "a3-node-090 resumed",
    }
    # someone else's drain stays; an agent that does not answer yet has the request all the same
    other = make_ingest(fs_client, None, make_policy(), Clock(T0 + 7200))
    second = other.handle_payload(entry(XID79, "a3-node-091", 1)).incident
    assert second is not None
    hand_edit(other.store, second["id"], lambda d: d.update({"state": "FAILED"}))

    class Silent(SlurmScheduler):
        def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
            raise ActuatorError(503, "slurm agent has not answered resume yet", True)

    silent = Silent(client)
    sent = close_incident(other.store, {"train": silent}, second["id"], "carol", T0 + 7260, True)
    assert sent.ok and "unfence sent: the agent has not answered yet" in sent.lines[-1]


def test_incidents_cli_close(fs_client: firestore.Client, firestore_host: str, tmp_path: Any) -> None:
    ing = make_ingest(fs_client, None, make_policy(), Clock())
    first = ing.handle_payload(entry(XID79, "a3-node-095", 1)).incident
    assert first is not None
    hand_edit(
        ing.store,
        first["id"],
        lambda d: d.update(cast(Incident, {"state": "FAILED", "failure": {"stage": "verify", "error": "x"}})),
    )
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(  # the cluster runs no scheduler Pitstop fences: nothing to lift
        "mode: enforce\nclusters:\n- {name: train, scheduler: none, size: 8, match: {name_pattern: 'a3-*'}}\n"
    )
    env = {
        **os.environ,
        "GOOGLE_CLOUD_PROJECT": fs_client.project,
        "FIRESTORE_EMULATOR_HOST": firestore_host,
        "PITSTOP_POLICY": str(policy_file),
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "pitstop.tools.cli", "incidents", *args]
        return subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=60, check=False)

    listed = run("--open")
    assert listed.returncode == 0 and "failed at verify: x" in listed.stdout
    assert run("--close", first["id"]).returncode == 2  # who closes it is recorded: --by is required
    closed = run("--close", first["id"], "--unfence", "--by", "dave")
    assert closed.returncode == 0, closed.stderr
    assert f"{first['id']}: closed by dave (was FAILED)" in closed.stdout
    assert "unfence not needed" in closed.stdout
    inc = ing.store.get(first["id"])
    assert inc is not None and inc["state"] == "RESOLVED" and inc["closure"]["by"] == "dave"
    assert "closed" in inc["timeline"]
    assert run("--close", first["id"], "--by", "dave").returncode == 1


# -- C: the coalescer: no per-line reads, a timer that merges, bounded memory ---------------------


def _counting(store: Any) -> dict[str, int]:
    """Count every call the ingest side makes to the store (each is at least one Firestore operation)."""
    calls: dict[str, int] = {}
    counts = ("latest", "as_decided", "resolved_since", "put_shards")
    for part, names in ((store, ("apply", "decide", "get", "query")), (store.counts, counts)):
        for name in names:
            real = getattr(part, name)

            def counted(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                calls[_name] = calls.get(_name, 0) + 1
                return _real(*a, **kw)

            setattr(part, name, counted)
    return calls


def test_no_store_operation_per_line_after_a_start(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    _, endpoint = executions
    clock = Clock()
    ing = make_ingest(fs_client, endpoint, make_policy(), clock)
    ing.coalescer.timer = False
    outs = [ing.handle_payload(entry(XID94, "a3-node-100", n)) for n in range(FIRST_LINES)]
    assert outs[0].result == "opened" and outs[0].incident is not None
    iid = outs[0].incident["id"]
    inc: Any = ing.store.get(iid)
    assert inc is not None and inc["workflow"]["state"] == "started"
    calls = _counting(ing.store)
    results = {ing.handle_payload(entry(XID94, "a3-node-100", 1000 + i)).result for i in range(300)}
    assert results == {"absorbed"}
    assert calls == {}  # not one read or write for 300 storm lines
    ing.coalescer.flush_all(clock.t)  # as the instance's timer or its shutdown would
    inc = ing.store.get(iid)
    assert inc is not None and inc["counts"]["events"] == FIRST_LINES + 300


def test_a_forged_storm_costs_no_store_operation_per_line(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    """Text lines proposing more than the record-only episode they land in raise nothing (core/trust.py),
    so the coalescer counts them in memory like any storm: forging lines cannot buy transactions."""
    _, endpoint = executions
    clock = Clock()
    ing = make_ingest(fs_client, endpoint, make_policy(), clock)
    ing.coalescer.timer = False

    def text(n: int) -> dict[str, Any]:
        e = syslog_entry(XID94, instance="a3-node-101", insert_id=f"forged-{n}")
        e["timestamp"] = "2027-01-15T08:00:00Z"
        return e

    outs = [ing.handle_payload(text(n)) for n in range(FIRST_LINES)]
    assert outs[0].result == "opened" and outs[0].incident is not None
    assert outs[0].incident["action"] == "NONE" and outs[0].start_step is None
    calls = _counting(ing.store)
    results = {ing.handle_payload(text(1000 + i)).result for i in range(200)}
    assert results == {"absorbed"}
    assert calls == {}


def test_the_instance_timer_merges_buffered_counts(fs_client: firestore.Client) -> None:
    clock = Clock()
    ing = make_ingest(fs_client, None, make_policy(store={"flush_interval_s": 0.2}), clock)
    lines = FIRST_LINES + 50
    for i in range(lines):
        out = ing.handle_payload(entry(XID94, "a3-node-110", i))
    assert out.coalesced and out.incident is not None
    iid = out.incident["id"]

    def counted() -> int:
        return int((cast(Any, ing.store.get(iid) or {}).get("counts") or {}).get("events", 0))

    assert counted() < lines  # buffered in this instance
    clock.t += 1  # the interval passes; no line and no sweep arrives
    deadline = time.monotonic() + 30
    while counted() < lines and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counted() == lines
    ing.coalescer.close()


def test_the_coalescer_keeps_bounded_maps_and_loses_no_count(fs_client: firestore.Client) -> None:
    clock = Clock()
    pol = make_policy(budgets={"cluster": {"max_percent": 100, "max_nodes": 100}, "zone": {"max_nodes": 100}})
    ing = make_ingest(fs_client, None, pol, clock)
    c = ing.coalescer
    c.timer = False
    c.memory.max_nodes, c.memory.seen.max = 4, 40
    per_node, nodes = FIRST_LINES + 2, [f"a3-node-{120 + i}" for i in range(10)]
    for round_ in range(per_node):
        for node in nodes:
            ing.handle_payload(entry(XID94, node, round_))
        assert c.stats()["nodes"] <= 4 and c.stats()["seen"] <= 40
        assert len(c.memory.seen.order) == len(
            c.memory.seen.keys
        )  # the order and the set forget the same keys
    c.flush_all(clock.t)
    incidents = ing.store.query()  # with the count shards summed
    assert len(incidents) == len(nodes)
    assert sum(i["counts"]["events"] for i in incidents) == per_node * len(nodes)


def test_a_deadline_shorter_than_the_workflows_own_waits_is_raised() -> None:
    """Issue 21 (7): 45 min / 2 h deadlines failed steps the workflow was rightly still waiting on
    (verify alone may take 2,700 s). The deadline is never shorter than the workflow's waits."""
    from pitstop.core import watchdog

    pol = make_policy(watchdog={"deadline_s": {"default": 2700, "REPLACE_NODE": 7200}})
    for action in ("RESET_GPU", "REBOOT_NODE", "DRAIN_NODE", "REPLACE_NODE"):
        waits = sum(watchdog.WORKFLOW_WAITS.values())
        assert pol.watchdog_deadline_s(action) > waits, action
    assert pol.watchdog_deadline_s("REPLACE_NODE") > pol.watchdog_deadline_s("REBOOT_NODE")


def test_the_watchdogs_view_of_the_workflows_waits_is_what_deploy_sets() -> None:
    import yaml

    from pitstop.core import watchdog
    from pitstop.tools.deploy import RESOURCES

    doc = yaml.safe_load(RESOURCES.read_text())
    (wf,) = [r for r in doc["resources"] if r.get("kind") == "workflow"]
    deployed = {k: float(v) for k, v in wf["env"].items() if k in watchdog.WORKFLOW_WAITS}
    assert deployed == dict(watchdog.WORKFLOW_WAITS)
