"""core/aggregate.decide alone (no store): the one writer of an incident, as properties and tables.

Every change to an incident is a command; these tests drive ``decide`` with sequences of commands
and check what must hold whatever the sequence: the state only moves along the table
(core/lifecycle.ALLOWED), the input is never changed, a refused command changes nothing, a step
command only lands on its own step from its owner, an ended incident stays ended, and an incident
that ends through its step lets its blast-radius slots go.
"""

from __future__ import annotations

import copy
import typing
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pitstop.core import aggregate, engine, lifecycle
from pitstop.core import policy as policy_mod
from pitstop.core.aggregate import (
    At,
    ClaimStep,
    Command,
    FailStep,
    Given,
    LeaseStart,
    RecordActed,
    RecordChoice,
    RecordCorroboration,
    RecordFence,
    RecordGang,
    RecordStarted,
    RecordValidation,
    RecordVerified,
    RecordVertex,
    RefuseStart,
    RejectStep,
    ResolveStep,
    decide,
)
from pitstop.core.domain import (
    Budget,
    Draft,
    FaultEvent,
    Incident,
    Measurement,
    MoveChoice,
    Place,
    VertexRecord,
)
from pitstop.core.ops import AFTER_FENCE, FENCED_ONLY, OPEN_ONLY, WORKING
from pitstop.core.states import RunState, State

T0 = 1_750_000_000.0
POLICY = policy_mod.from_doc(
    {
        "mode": "enforce",
        "clusters": [{"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-*"}}],
    }
)
EXECUTIONS = ("", "ex-a", "ex-b")


def _event(xid: int = 79, action: str = "REBOOT_NODE") -> FaultEvent:
    return cast(
        FaultEvent,
        {
            "kind": "gpu_xid",
            "action": action,
            "xid": xid,
            "node": {"project": "p", "zone": "us-central1-a", "instance": "a3-node-001", "instance_id": "1"},
            "gpu": {"pci": "0000:a1:00", "mig": None},
            "observed_at": None,
            "source": {
                "log_name": "l",
                "insert_id": "ins-1",
                "message_id": None,
                "trust": "verified",
                "trust_reason": None,
            },
            "reason": "Xid 79",
            "detail": {},
            "_observed_ts": T0,
        },
    )


def _opened() -> tuple[Incident, dict[str, Budget | None]]:
    """A node action's incident as the engine opens it (step 1 decided, a slot in each budget)."""
    out = decide(None, aggregate.FoldEvent(_event(), "k1"), Given(T0, POLICY, None, {}))
    assert out.result == "opened" and out.incident is not None
    return out.incident, dict(out.budgets)


def _measurement(confirmed: bool) -> Measurement:
    return {"kind": "corroborate", "at": T0, "step": 1, "confirmed": confirmed, "why": "test"}


def _step_commands(step: int, execution: str) -> list[Command]:
    """Each step command as actuate sends it: with its op's states (services/actuate/registry.OPS)."""

    def at(states: frozenset[State] | None = None) -> At:
        return At(step, execution, states)

    return [
        ClaimStep(at()),
        RecordFence(at(frozenset({State.OPEN, State.FENCED})), (), {}),
        RecordCorroboration(at(FENCED_ONLY), _measurement(True)),
        RecordActed(at(frozenset({State.FENCED, State.ACTING}))),
        RecordVerified(at(), True),
        RecordGang(at(), "job_requeued"),
        RecordValidation(at(AFTER_FENCE), {"kind": "validate", "at": T0, "passed": True}, True, None),
        ResolveStep(at(WORKING), {}),
        FailStep(at(), "act", "boom", {}),
        RejectStep(at(), "not the live VM"),
        RecordChoice(at(), {"decision": "wait", "why": "waited", "page": True}),
        RecordVertex(
            at(OPEN_ONLY),
            {
                "job": "projects/p/locations/us-central1/customJobs/7",
                "outcome": "resubmitted",
                "resubmitted_as": "x",
            },
        ),
    ]


commands = (
    st.builds(
        lambda step, execution, k: _step_commands(step, execution)[k],
        st.integers(0, 2),
        st.sampled_from(EXECUTIONS),
        st.integers(0, 10),
    )
    | st.builds(LeaseStart, st.integers(0, 2))
    | st.builds(RecordStarted, st.integers(0, 2), st.sampled_from(EXECUTIONS[1:]))
    | st.builds(RefuseStart, st.integers(0, 2), st.just("quota"), st.booleans())
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(commands, max_size=12))
def test_any_sequence_of_commands_keeps_the_aggregate_s_rules(cmds: list[Command]) -> None:
    inc, budgets = _opened()
    now = T0
    for cmd in cmds:
        now += 1
        before = copy.deepcopy(inc)
        out = decide(inc, cmd, Given(now, POLICY, None, budgets))
        assert inc == before, "decide changed its input"
        after = out.incident
        assert after is not None
        if out.result == "refused":
            assert after == before and out.refused and not out.notices and not out.budgets
            continue
        assert lifecycle.allowed(before["state"], after["state"]), (before["state"], after["state"], cmd)
        if before["state"] in (State.RESOLVED, State.FAILED):
            assert after["state"] == before["state"] or isinstance(cmd, (LeaseStart, RecordStarted))
        if isinstance(cmd, aggregate.StepCommand):
            assert cmd.at.step == before["step"]
            owner = (before.get("workflow") or {}).get("claimed_by")
            assert not (owner and cmd.at.execution and owner not in (cmd.at.execution, "unknown"))
        if after["state"] == State.RESOLVED and before["state"] != State.RESOLVED:
            slots = [b["slots"][inc["id"]]["active"] for b in out.budgets.values()]
            assert slots and not any(slots), "an incident that ended kept its blast-radius slots"
            budgets = {**budgets, **out.budgets}
        inc = after


def test_a_step_command_from_another_execution_is_refused_once_the_step_is_claimed() -> None:
    inc, budgets = _opened()
    claimed = decide(inc, ClaimStep(At(1, "ex-a")), Given(T0 + 1, budgets=budgets))
    assert claimed.result == "claimed" and claimed.incident is not None
    late = decide(claimed.incident, RecordFence(At(1, "ex-b"), (), {}), Given(T0 + 2))
    assert late.result == "refused" and "ex-a" in str(late.refused)
    ours = decide(claimed.incident, RecordFence(At(1, "ex-a"), (), {}), Given(T0 + 2))
    assert ours.result == "fenced" and ours.incident is not None and ours.incident["state"] == State.FENCED


def test_a_late_act_of_an_earlier_step_does_not_move_a_newer_step() -> None:
    """The window the decider closes: a step-up made the incident OPEN at step 2; step 1's act
    must not move it to ACTING (the table alone allows OPEN -> ... it is the step that refuses)."""
    inc, _ = _opened()
    stepped: Incident = {**inc, "step": 2}
    out = decide(stepped, RecordActed(At(1, "ex-a")), Given(T0 + 5))
    assert out.result == "refused" and out.refused == "superseded by step 2"


def test_a_lease_is_taken_once_until_it_runs_out() -> None:
    inc, _ = _opened()
    assert (inc["workflow"] or {}).get("state") == RunState.PENDING
    first = decide(inc, LeaseStart(1, lease_s=60), Given(T0))
    assert first.result == "leased" and first.incident is not None
    assert decide(first.incident, LeaseStart(1, lease_s=60), Given(T0 + 30)).result == "refused"
    assert decide(first.incident, LeaseStart(1, lease_s=60), Given(T0 + 61)).result == "leased"
    started = decide(first.incident, RecordStarted(1, "exec-1"), Given(T0 + 2))
    assert started.incident is not None and (started.incident["workflow"] or {})["state"] == RunState.STARTED
    assert decide(started.incident, LeaseStart(1), Given(T0 + 100)).result == "refused"


def test_resolving_a_step_records_its_notification_and_lets_its_slots_go() -> None:
    inc, budgets = _opened()
    out = decide(inc, ResolveStep(At(1), {}), Given(T0 + 9, budgets=budgets))
    assert out.result == "resolved" and out.release_slots
    assert [n["kind"] for n in out.notices] == ["incident"]
    assert all(not b["slots"][inc["id"]]["active"] for b in out.budgets.values()) and out.budgets


def test_a_failed_step_pages_and_keeps_the_slots_of_the_fenced_node() -> None:
    inc, budgets = _opened()
    out = decide(inc, FailStep(At(1), "act", "reset failed", {}), Given(T0 + 9, budgets=budgets))
    assert out.result == "failed" and out.incident is not None and out.incident["state"] == State.FAILED
    assert [n["severity"] for n in out.notices] == ["critical"] and not out.budgets


def test_the_third_refused_start_fails_the_incident_with_a_page() -> None:
    inc, _ = _opened()
    for n in range(1, aggregate.START_REFUSALS + 1):
        out = decide(inc, RefuseStart(1, "quota", permanent=False), Given(T0 + n))
        assert out.incident is not None
        inc = out.incident
    assert inc["state"] == State.FAILED and out.notices


def test_a_vertex_job_s_close_names_both_jobs_and_pages_only_when_a_person_must_decide() -> None:
    """The record of a Vertex AI job's step stamps ``job_requeued`` once resubmitted; the close's
    notification links the failed job and its resubmission, or pages with what to do."""
    inc, budgets = _opened()
    old = "projects/p/locations/us-central1/customJobs/7"
    done: VertexRecord = {"job": old, "state": "JOB_STATE_FAILED", "reason": "the platform failed it"}
    done.update({"outcome": "resubmitted", "resubmitted_as": old[:-1] + "8", "checkpoint": "gs://c/r"})
    out = decide(inc, RecordVertex(At(1), done), Given(T0 + 5))
    assert out.incident is not None and out.incident["timeline"].get("job_requeued") == T0 + 5
    closed = decide(out.incident, ResolveStep(At(1), {}), Given(T0 + 6, budgets=budgets))
    [note] = closed.notices
    assert (
        note["severity"] == "warning"
        and note.get("jobs") == [old, old[:-1] + "8"]
        and "gs://c/r" in note["summary"]
    )
    left: VertexRecord = {**done, "outcome": "left", "why": "a user error", "page": True}
    left.pop("resubmitted_as")
    out = decide(inc, RecordVertex(At(1), left), Given(T0 + 5))
    assert out.incident is not None and "job_requeued" not in out.incident["timeline"]
    [page] = decide(out.incident, ResolveStep(At(1), {}), Given(T0 + 6, budgets=budgets)).notices
    assert page["severity"] == "critical" and "a user error" in str(page.get("todo"))


def test_engine_commands_need_the_policy() -> None:
    inc, _ = _opened()
    with pytest.raises(TypeError, match="policy"):
        decide(inc, aggregate.StepUp(), Given(T0))


def test_draft_and_incident_have_the_same_fields() -> None:
    """Incident is read-only (ReadOnly items: mypy refuses a write); Draft is its writable twin,
    used only by core/aggregate and the engine it calls. They must not drift apart."""

    def fields(kind: type) -> dict[str, Any]:
        hints = typing.get_type_hints(kind, include_extras=True)
        return {name: _bare(hint) for name, hint in hints.items()}

    assert fields(Incident) == fields(Draft)
    assert kind_is_read_only(Incident)
    assert not any(_is_read_only(h) for h in typing.get_type_hints(Draft, include_extras=True).values())


def _bare(hint: Any) -> Any:
    """A field's type without ReadOnly/NotRequired."""
    while typing.get_origin(hint) in (typing.NotRequired, typing.Required) or _is_read_only(hint):
        hint = typing.get_args(hint)[0]
    return hint


def _is_read_only(hint: Any) -> bool:
    import typing_extensions

    return typing.get_origin(hint) is typing_extensions.ReadOnly


def kind_is_read_only(kind: type) -> bool:
    """Every item of the TypedDict is ReadOnly (inside NotRequired or not)."""
    hints = typing.get_type_hints(kind, include_extras=True).values()
    unwrapped = [typing.get_args(h)[0] if typing.get_origin(h) is typing.NotRequired else h for h in hints]
    return all(_is_read_only(h) for h in unwrapped)


def test_the_engine_works_on_a_copy() -> None:
    inc, _ = _opened()
    before = copy.deepcopy(inc)
    draft: Draft = engine.as_incident(inc)
    draft["state"] = State.FENCED
    assert inc == before


def test_the_gang_s_choice_is_recorded_with_its_numbers_and_pages_once() -> None:
    """An NVL72 gang with no spare in its NVLink domain waits: the choice is kept on the incident
    (its numbers read back as recorded) and a person is paged the first time, not on a retry."""
    inc, budgets = _opened()
    choice: MoveChoice = {
        "decision": "wait",
        "why": "waited for the reboot: 3.6 GPU-h expected (no spare in the gang's NVLink domain c/b/r1)",
        "options": [{"option": "wait", "gpu_h": 3.6, "how": "wait for the reboot, then restart"}],
        "page": True,
    }
    first = decide(inc, RecordChoice(At(1), choice), Given(T0 + 5, POLICY, None, budgets))
    assert first.result == "changed" and first.incident is not None
    assert first.incident.get("choice") == choice
    assert [n.get("kind") for n in first.notices] == ["page"]
    again = decide(first.incident, RecordChoice(At(1), choice), Given(T0 + 6, POLICY, None, budgets))
    assert again.result == "changed" and again.notices == []
    late = decide(first.incident, RecordChoice(At(0), choice), Given(T0 + 7, POLICY, None, budgets))
    assert late.result == "refused"  # a superseded step's choice lands nowhere


def test_the_node_s_place_is_cached_in_its_document_when_it_joins_its_block() -> None:
    """The claim reads the VM (Compute's physicalHostTopology) and JoinBlock caches where the node
    sits in its node document; the same place again changes nothing, a new place is written."""
    inc, budgets = _opened()
    node = engine.new_node(inc["node"], None)
    place: Place = {"source": "compute", "cluster": "c1", "block": "b1", "subblock": "s1", "host": "h1"}
    joined = decide(inc, aggregate.JoinBlock("c1/b1", place), Given(T0 + 1, POLICY, node, budgets))
    assert joined.result == "joined" and joined.node is not None
    assert joined.node.get("topology") == place and joined.node.get("block") == "c1/b1"
    assert joined.incident is not None
    same = decide(
        joined.incident, aggregate.JoinBlock("c1/b1", place), Given(T0 + 2, POLICY, joined.node, budgets)
    )
    assert same.result == "ignored"
    moved: Place = {**place, "host": "h2"}
    again = decide(
        joined.incident, aggregate.JoinBlock("c1/b1", moved), Given(T0 + 3, POLICY, joined.node, budgets)
    )
    assert again.result == "joined" and again.node is not None and again.node.get("topology") == moved
