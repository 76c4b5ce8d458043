"""What evidence may start, through the incident engine and the coalescer (core/trust.py wired in).

Unverified lines (text syslog, a journal entry that did not come from the kernel) are recorded
in a record-only incident and page once per episode; they never raise an episode, and history
(ladder, lemon host) never turns them into more than ``trust.text_syslog`` allows.
"""

from __future__ import annotations

from typing import Any

from pitstop.core import engine, policy
from pitstop.core.classify import Classifier
from pitstop.core.domain import FaultEvent
from tests.core.test_engine import CLUSTER, T0, XID13, XID48, XID79, World
from tests.helpers import ops_agent_entry, syslog_entry

CLF = Classifier.default()


def pol(**over: Any) -> policy.Policy:
    doc: dict[str, Any] = {"mode": "enforce", "clusters": [CLUSTER]}
    doc.update(over)
    return policy.from_doc(doc)


def forged(line: str, ts: float, node: str = "a3-node-001") -> FaultEvent:
    e = CLF.classify(syslog_entry(line, instance=node, insert_id=f"forged-{line[:20]}-{ts}"))
    e["_observed_ts"] = ts
    return e


def kernel(line: str, ts: float, node: str = "a3-node-001") -> FaultEvent:
    e = CLF.classify(ops_agent_entry(line, instance=node, insert_id=f"kernel-{line[:20]}-{ts}"))
    e["_observed_ts"] = ts
    return e


def test_a_forged_line_is_recorded_and_paged_once_and_starts_nothing() -> None:
    w = World(pol())
    first = w.feed(forged(XID79, T0))
    assert first.result == "opened" and first.start_step is None
    inc = first.incident
    assert inc is not None and inc["action"] == "NONE" and inc["trust"] == "unverified"
    assert "REBOOT_NODE proposed" in inc["reason"] and "not acted on" in inc["reason"]
    assert first.page is not None and inc["id"] in first.page
    again = w.feed(forged(XID79, T0 + 5))
    assert again.result == "absorbed" and again.page is None and again.start_step is None
    assert w.incidents[inc["id"]]["counts"]["events"] == 2
    assert w.nodes[engine.subject_key(inc)]["remediations"] == []


def test_a_verified_line_of_the_same_episode_acts() -> None:
    w = World(pol())
    iid = w.feed(forged(XID79, T0)).incident["id"]  # type: ignore[index]
    out = w.feed(kernel(XID79, T0 + 3))
    assert out.result == "raised" and out.start_step == 1
    inc = w.incidents[iid]
    assert inc["action"] == "REBOOT_NODE" and inc["trust"] == "verified"


def test_a_forged_stronger_line_does_not_raise_a_verified_episode() -> None:
    w = World(pol())
    opened = w.feed(kernel(XID13, T0))
    assert opened.incident is not None and opened.incident["action"] == "RESTART_JOB"
    out = w.feed(forged(XID79, T0 + 2))
    assert out.result == "absorbed" and out.start_step is None
    assert w.incidents[opened.incident["id"]]["action"] == "RESTART_JOB"


def test_act_mode_resets_on_text_but_history_never_makes_it_a_replacement() -> None:
    """The ladder (RESET_GPU → REBOOT_NODE → REPLACE_NODE) would replace this host; text stops at reboot."""
    w = World(pol(trust={"text_syslog": "act"}))
    first = w.feed(forged(XID48, T0))
    assert first.incident is not None and first.incident["action"] == "RESET_GPU" and first.start_step == 1
    w.resolve(first.incident["id"], T0 + 600)
    second = w.feed(forged(XID79, T0 + 3600))
    assert second.incident is not None and second.incident["action"] == "REBOOT_NODE"
    w.resolve(second.incident["id"], T0 + 4200)
    third = w.feed(forged(XID79, T0 + 7200))
    inc = third.incident
    assert inc is not None
    assert inc["action"] == "REBOOT_NODE", inc["escalations"]
    assert any("never replaces a host" in why for e in inc["escalations"] for why in e["why"])
    fourth = w.feed(kernel(XID79, T0 + 90_000 + 7200, node="a3-node-001"))
    assert fourth.incident is not None  # a verified line of a new episode is not capped
    assert fourth.incident["trust"] == "verified"


def test_the_same_history_with_a_kernel_line_replaces() -> None:
    w = World(pol(trust={"text_syslog": "act"}))
    for i, line in enumerate((XID48, XID79)):
        out = w.feed(forged(line, T0 + i * 3600))
        assert out.incident is not None
        w.resolve(out.incident["id"], T0 + i * 3600 + 600)
    inc = w.feed(kernel(XID79, T0 + 7200)).incident
    assert inc is not None and inc["action"] == "REPLACE_NODE"
