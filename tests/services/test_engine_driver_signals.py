"""The engine on what the drivers say beyond one Xid: the 154 verdict back to None, NVSwitch SXids
(fatal: reset the node, again: replace; non-fatal: recorded, counted toward a lemon), and the
per-GPU ties, all as the XID policy's data says; and ingest logging an undecodable line against
the node its envelope names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, cast

import yaml

from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import engine, resources
from pitstop.core.catalog import load_xid_policy
from pitstop.core.domain import NodeRef
from pitstop.core.states import State
from pitstop.services.coalesce import Coalescer
from pitstop.services.ingest import Ingest
from tests.core.test_engine import ROOMY, T0, XID79, World, ev, pol
from tests.helpers import ops_agent_entry

GPU = "0000:ab:00"
TO_RESET = (
    f"NVRM: Xid (PCI:{GPU}): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
)
TO_NONE = (
    f"NVRM: Xid (PCI:{GPU}): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
)
# Fabric Manager user guide SXid forms, as the NVSwitch driver prints them (nvswitch_event.h)
SXID_FATAL = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error"
SXID_NONFATAL = (
    "nvidia-nvswitch2: SXid (PCI:0000:87:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error"
)


def test_154_back_to_none_pages_and_ends_nothing_while_it_waits() -> None:
    """Issue 35 (6): a log line saying the driver recovered is a hint anyone who writes logs can
    forge; it must not silently end a real fault that waits. It is recorded and paged, once."""
    w = World(pol(mode="observe"))
    opened = w.feed(ev(TO_RESET))
    assert opened.incident is not None and opened.incident["action"] == "RESET_GPU"
    out = w.feed(ev(TO_NONE, ts=T0 + 20))
    inc = w.incidents[opened.incident["id"]]
    assert out.result == "absorbed" and inc["state"] == "OPEN" and out.page and "not acted on" in out.page
    assert inc["gpus"]["0000_ab_00"]["recovery_to"] == 0
    assert any(s["active"] for b in w.budgets.values() for s in b["slots"].values())  # its slot held
    again = w.feed(ev(TO_NONE, ts=T0 + 21))
    assert again.result == "absorbed" and again.page is None  # paged once


def test_154_back_to_none_leaves_a_held_fault_held() -> None:
    w = World(pol(enabled_actions=["RESTART_JOB"]))  # a GPU reset waits for a human
    held = w.feed(ev(TO_RESET)).incident
    assert held is not None and held["state"] == "HELD"
    out = w.feed(ev(TO_NONE, ts=T0 + 5))
    assert out.result == "absorbed" and out.page is not None
    assert w.incidents[held["id"]]["state"] == "HELD"


def test_154_back_to_none_leaves_a_remediation_under_way() -> None:
    w = World(pol())
    opened = w.feed(ev(TO_RESET)).incident
    assert opened is not None and (opened["workflow"] or {}).get("state") == "pending"  # due: it goes on
    assert w.feed(ev(TO_NONE, ts=T0 + 5)).result == "absorbed"
    w.incidents[opened["id"]]["state"] = State.ACTING
    assert w.feed(ev(TO_NONE, ts=T0 + 6)).result == "absorbed"
    assert w.incidents[opened["id"]]["state"] == "ACTING"


def test_154_back_to_none_for_one_gpu_does_not_end_another_gpus_fault() -> None:
    w = World(pol(mode="observe"))
    opened = w.feed(ev(TO_RESET)).incident
    assert opened is not None
    w.feed(ev(XID79, ts=T0 + 2))  # another GPU fell off the bus: the driver said nothing about it
    out = w.feed(ev(TO_NONE, ts=T0 + 5))
    assert out.result == "absorbed" and w.incidents[opened["id"]]["state"] == "OPEN"


def test_a_fatal_sxid_reboots_the_node_and_a_repeat_replaces_it() -> None:
    w = World(pol(budgets=ROOMY))
    first = w.feed(ev(SXID_FATAL))
    assert first.result == "opened" and first.incident is not None
    inc = first.incident
    assert (inc["kind"], inc["xid"], inc["action"]) == ("nvswitch_sxid", None, "REBOOT_NODE")
    assert inc["counts"] == {"events": 1, "sxid_24007": 1} and inc["gpus"] == {}
    node = w.nodes[inc["node_key"]]
    assert node["remediations"][-1]["kind"] == "nvswitch_sxid"
    w.resolve(inc["id"], T0 + 900)
    again = w.feed(ev(SXID_FATAL, ts=T0 + 7200))
    assert again.result == "opened" and again.incident is not None
    assert again.incident["action"] == "REPLACE_NODE"
    assert "fatal NVSwitch error again" in again.incident["reason"]


def test_a_fatal_sxid_after_an_unrelated_remediation_is_not_a_repeat() -> None:
    p = pol(budgets=ROOMY, ladder={"window_h": 24, "steps": ["RESET_GPU", "REBOOT_NODE"]})
    w = World(p)
    first = w.feed(ev(XID79))
    assert first.incident is not None
    w.resolve(first.incident["id"], T0 + 900)
    out = w.feed(ev(SXID_FATAL, ts=T0 + 7200))
    assert out.incident is not None and out.incident["action"] == "REBOOT_NODE"


def test_non_fatal_sxid_episodes_are_recorded_but_log_lines_alone_make_no_lemon() -> None:
    """Issue 35 (7): three non-fatal SXid lines (which anyone who writes logs can forge) are three
    recorded episodes; they do not make the node a lemon, so its next fault is not a host report.
    Strikes a node check confirmed do count."""
    w = World(pol(budgets=ROOMY))
    for day in range(3):  # three episodes on three days: no action, each one recorded
        out = w.feed(ev(SXID_NONFATAL, ts=T0 + day * 86400))
        assert out.result == "opened" and out.incident is not None
        assert out.incident["action"] == "NONE" and out.start_step is None
        assert w.feed(ev(SXID_NONFATAL, ts=T0 + day * 86400 + 10)).result == "absorbed"  # same episode
    node = next(iter(w.nodes.values()))
    assert len(node["strikes"]) == 3 and node.get("remediations") == []
    fault = w.feed(ev(XID79, ts=T0 + 3 * 86400))
    assert fault.incident is not None and fault.incident["action"] == "REBOOT_NODE"
    w.resolve(fault.incident["id"], T0 + 3 * 86400 + 60)
    for strike in w.nodes[fault.incident["node_key"]]["strikes"]:  # as a node check would confirm them
        strike["confirmed"] = True
    again = w.feed(ev(XID79, ts=T0 + 5 * 86400))  # past the ladder's window, within the lemon's
    assert again.incident is not None and again.incident["action"] == "REPLACE_NODE"
    assert "3 recorded fault episodes" in again.incident["reason"]


def _policy_without(tmp_path: Path, tie_of: int) -> Any:
    """The shipped policy with the tie of one code's rule taken out of the data."""
    doc = yaml.safe_load((resources.schema_dir() / "xid-policy.yaml").read_text())
    for rule in doc["rules"]:
        if tie_of in rule["codes"]:
            rule.pop("tie")
    path = tmp_path / "xid-policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return dataclasses.replace(pol(mode="observe"), xids=load_xid_policy(path))


def test_the_ties_come_from_the_policy_data(tmp_path: Path) -> None:
    primary = "NVRM: Xid (PCI:0000:ed:00): 119, pid=1, name=x, Timeout waiting for RPC from GSP!"
    secondary = "NVRM: Xid (PCI:0000:ed:00): 45, pid=1, name=python3, Ch 0000000c caused by previous Xid 119"
    for p, tied in ((pol(mode="observe"), True), (_policy_without(tmp_path, 45), False)):
        w = World(p)
        first = w.feed(ev(primary)).incident
        assert first is not None
        w.feed(ev(secondary, ts=T0 + 3))
        assert ("secondary" in w.incidents[first["id"]]["gpus"]["0000_ed_00"]) is tied
    w = World(_policy_without(tmp_path, 154))
    opened = w.feed(ev(TO_RESET)).incident
    assert opened is not None
    assert w.feed(ev(TO_NONE, ts=T0 + 5)).result == "absorbed"  # without the tie, no verdict is kept
    assert "recovery_to" not in w.incidents[opened["id"]]["gpus"]["0000_ab_00"]


def test_engine_decisions_stay_pure_for_a_node_document_without_new_fields() -> None:
    w = World(pol())
    key = engine.node_key(cast(NodeRef, ev(XID79)["node"]))
    w.nodes[key] = {
        "node": ev(XID79)["node"],
        "latest_incident": None,
        "remediations": [],
        "last_action_at": {},
    }
    out = w.feed(ev(SXID_FATAL))
    assert out.incident is not None and out.incident["action"] == "REBOOT_NODE"


def test_the_coalescer_never_buffers_what_ends_or_records_an_episode() -> None:
    """In a storm the coalescer counts lines in memory; a 154 back to None (which may end the episode)
    and a non-fatal SXid on a quiet node (which opens a record) still go through the store."""
    store = MemoryStore()
    c = Coalescer(store, pol(mode="observe"), clock=lambda: T0)
    c.timer = False
    assert c.handle(ev(TO_RESET), T0).result == "opened"
    for i in range(1, 8):  # past the direct lines: counted in memory
        c.handle(ev(TO_RESET, ts=T0 + i), T0 + i)
    assert c.coalesced > 0
    out = c.handle(ev(TO_NONE, ts=T0 + 9), T0 + 9)
    assert out.result == "absorbed" and not out.coalesced and out.page is not None  # decided, paged
    first = c.handle(ev(SXID_NONFATAL, node="a3-node-002"), T0 + 10)
    assert first.result == "opened" and first.incident is not None and first.incident["action"] == "NONE"
    assert len(store.docs.nodes[first.incident["node_key"]]["strikes"]) == 1


def test_an_undecodable_line_is_logged_against_the_node_its_envelope_names(capsys: Any) -> None:
    ingest = Ingest(pol(), MemoryStore(), None, None, clock=lambda: T0)
    entry = ops_agent_entry(
        "NVRM: Xid (PCI:0000:a1:00): 0, pid=1, name=x, zero is no code", instance="a3-node-009"
    )
    assert ingest.handle_payload(entry).result == "ignored"
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["message"] == "invalid entry acknowledged" and record["node"] == "a3-node-009"
    assert "xid 0 is out of range" in record["reason"]
