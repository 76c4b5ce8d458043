"""The incident state table (core/lifecycle.py): what may follow what, and what is refused."""

from __future__ import annotations

from typing import cast

import pytest

from pitstop.core import lifecycle
from pitstop.core.domain import Draft
from pitstop.core.states import State


def _inc(state: State) -> Draft:
    return cast(Draft, {"id": "iabcdefghi", "state": state})  # the fields a move reads


@pytest.mark.parametrize(
    ("frm", "to"),
    [
        (State.OPEN, State.FENCED),
        (State.FENCED, State.ACTING),
        (State.ACTING, State.VERIFYING),
        (State.VERIFYING, State.RESOLVED),
        (State.VERIFYING, State.OPEN),  # a step-up before unfence
        (State.OPEN, State.HELD),
        (State.HELD, State.OPEN),
        (State.FAILED, State.RESOLVED),  # closed by a person
        (State.RESOLVED, State.OPEN),  # a record-only burst reopened by a stronger late line
        (State.ACTING, State.ACTING),  # a retried step
    ],
)
def test_the_remediation_path_is_allowed(frm: State, to: State) -> None:
    inc = _inc(frm)
    lifecycle.move(inc, to, "test")
    assert inc["state"] == to


@pytest.mark.parametrize(
    ("frm", "to"),
    [
        (State.RESOLVED, State.ACTING),  # a late act after a person closed the incident
        (State.RESOLVED, State.FENCED),
        (State.FAILED, State.ACTING),  # a still-running execution after the watchdog failed it
        (State.FAILED, State.OPEN),
        (State.HELD, State.FENCED),  # a held incident is not fenced before it is released
        (State.RESOLVED, State.FAILED),
    ],
)
def test_a_move_the_table_does_not_name_is_refused_and_changes_nothing(frm: State, to: State) -> None:
    inc = _inc(frm)
    with pytest.raises(lifecycle.IllegalTransitionError, match=f"{frm} -> {to}"):
        lifecycle.move(inc, to, "test")
    assert inc["state"] == frm


def test_every_state_has_a_row() -> None:
    assert set(lifecycle.ALLOWED) == set(State)
    assert not lifecycle.allowed("NOT-A-STATE", State.OPEN)
