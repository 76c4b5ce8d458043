"""The runtime control on the whole local pipeline, changed by the operator's CLI while it runs (no
redeploy: the functions keep running as they are): `pitstop pause` stops actuation within a minute
and `pitstop resume` restarts it; a silenced node's Xid 79 is recorded and paged, nothing else.

Each function instance reads the control document at most once per ``store.control_cache_s`` (the
shipped 30 s, as in production), so a change is in force everywhere once that long has passed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pitstop.core import policy
from pitstop.core.domain import Incident
from pitstop.local.stack import PROJECT, ClusterSpec, Stack, emulator_env, webhook_records
from pitstop.tools import cli
from tests.pipeline import XID79, Pipeline, stack_up

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # the sweep every 15 s (production: every minute) and bursts of 20 s keep the module short
    over = {"windows": {"burst_silence_s": 20}}
    with stack_up("control", ClusterSpec(nodes=4), sweep_interval=15, policy_over=over) as s:
        yield s


@pytest.fixture(scope="module")
def sc(stack: Stack) -> Pipeline:
    return Pipeline(stack)


def pitstop(sc: Pipeline, monkeypatch: pytest.MonkeyPatch, *argv: str) -> None:
    """The operator's command, against the stack's Firestore, as `pitstop` run beside it would."""
    monkeypatch.setenv("PITSTOP_POLICY", str(Path(sc.state.workdir, "policy.yaml")))
    monkeypatch.delenv("PITSTOP_FIRESTORE_DATABASE", raising=False)
    with emulator_env(sc.state.endpoints):
        assert cli.main([*argv, "--by", "e2e-operator", "--project", PROJECT]) == 0


def cache_s(sc: Pipeline) -> float:
    """How long until every function instance has read the control document again."""
    return float(policy.load(Path(sc.state.workdir, "policy.yaml")).doc["store"]["control_cache_s"])


def latest(sc: Pipeline, node: str) -> Incident | None:
    found = sc.incidents(node)
    return found[-1] if found else None


def pages(sc: Pipeline, iid: str, words: str) -> list[Any]:
    return [w for w in webhook_records(sc.state) if iid in w["body"]["text"] and words in w["body"]["text"]]


def test_pause_stops_actuation_within_a_minute_and_resume_restarts_it(
    sc: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    sc.settle()
    (node,) = sc.take()
    pitstop(sc, monkeypatch, "pause", "--reason", "reset storm under investigation")
    try:
        time.sleep(cache_s(sc))  # 30 s: every instance has the pause by now, no redeploy
        sc.fault(node, XID79)
        inc = sc.wait(lambda: (i := latest(sc, node)) and i["state"] == "HELD" and i, 60, "the held incident")
        assert (
            inc["held"]["control"] == "pause" and "reset storm under investigation" in inc["held"]["reason"]
        )
        sc.wait(lambda: pages(sc, inc["id"], "paused (everything) by e2e-operator"), 30, "the page")
        assert inc["workflow"] is None and not sc.calls("reset", node) and not sc.drained(node)
    finally:
        pitstop(sc, monkeypatch, "resume", "--reason", "understood")
    done = sc.finished(node, timeout=180)  # the cache, then the sweep, lets it go on
    assert done["id"] == inc["id"] and (done["state"], done["action"]) == ("RESOLVED", "REBOOT_NODE")
    assert len(sc.calls("reset", node)) == 1 and not sc.drained(node)
    assert [(h["control"], h["by"]) for h in done["holds"]] == [("pause", "sweep")]


def test_a_silenced_nodes_xid79_is_recorded_and_paged_nothing_else(
    sc: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    sc.settle()
    (node,) = sc.take()
    pitstop(sc, monkeypatch, "silence", "--node", node, "--for", "1h", "--reason", "firmware roll")
    time.sleep(cache_s(sc))
    sc.fault(node, XID79)
    inc = sc.finished(node, timeout=120)  # recorded only: it ends with its burst
    assert (
        inc["state"] == "RESOLVED"
        and inc["silenced"]["value"] == node
        and inc["silenced"]["by"] == "e2e-operator"
    )
    assert inc["workflow"] is None and inc["step"] == 0 and not inc["timeline"].get("fenced")
    (page,) = sc.wait(lambda: pages(sc, inc["id"], "not acted on, silenced"), 30, "the page")
    assert "firmware roll" in page["body"]["text"]
    assert not sc.calls("reset", node) and not sc.drained(node)  # nothing else
    assert len(sc.incidents(node)) == 1
