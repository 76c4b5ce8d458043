"""First contacts asked at once share one live incident query (adapters/firestore_live.py)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.types import StructuredQuery

from pitstop.adapters.firestore import IncidentStore as FirestoreStore
from pitstop.adapters.firestore_live import Grouped
from tests.adapters.test_store_port import POLICY, T0, XID79, _any, _event

WAIT_S = 30.0  # a failsafe only: every wait below is on a condition that the code under test sets


class Held:
    """A fetch whose first call waits until released, so that asks pile up behind it."""

    def __init__(self, answer: Callable[[list[str]], Mapping[str, Any]] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.started, self.release = threading.Event(), threading.Event()
        self.answer = answer or (lambda keys: {k: k.upper() for k in keys if k != "none"})

    def __call__(self, keys: list[str]) -> Mapping[str, Any]:
        self.calls.append(keys)
        if len(self.calls) == 1:
            self.started.set()
            assert self.release.wait(WAIT_S)
        return self.answer(keys)


def _ask_all(grouped: Grouped[str, Any], first: str, rest: list[str]) -> dict[str, list[Any]]:
    """``first`` asked alone (its fetch held), ``rest`` asked while it runs; every answer by key."""
    answers: dict[str, list[Any]] = {}

    def ask(key: str) -> None:
        try:
            value: Any = grouped.get(key)
        except BaseException as exc:  # SystemExit too: the assertions look at it
            value = exc
        answers.setdefault(key, []).append(value)

    threads = [threading.Thread(target=ask, args=(first,))]
    threads[0].start()
    fetch = grouped._fetch
    assert isinstance(fetch, Held)
    assert fetch.started.wait(WAIT_S)  # the first fetch is under way: its ask has left the queue
    threads += [threading.Thread(target=ask, args=(k,)) for k in rest]
    for queued, t in enumerate(threads[1:], 1):
        t.start()  # each queued before the next starts: the queue's order is the list's
        with grouped._cond:
            assert grouped._cond.wait_for(lambda n=queued: len(grouped._queue) == n, WAIT_S)  # type: ignore[misc]
    fetch.release.set()
    for t in threads:
        t.join(WAIT_S)
    return answers


def test_asks_made_while_a_lookup_runs_go_together_in_the_next() -> None:
    held = Held()
    grouped: Grouped[str, str] = Grouped(held)
    answers = _ask_all(grouped, "a", ["b", "c", "b", "none"])
    assert held.calls == [["a"], ["b", "c", "none"]]  # one fetch for the four, each key once
    assert answers == {"a": ["A"], "b": ["B", "B"], "c": ["C"], "none": [None]}


def test_an_ask_is_never_answered_by_a_fetch_that_started_before_it() -> None:
    """A decision that waited its turn asks again to see what another instance opened meanwhile:
    the fetch already under way for its node may predate that, so the ask waits for the next."""
    held = Held()
    grouped: Grouped[str, str] = Grouped(held)
    answers = _ask_all(grouped, "a", ["a"])
    assert held.calls == [["a"], ["a"]] and answers == {"a": ["A", "A"]}


def test_a_stopping_process_fails_the_group_and_leaves_the_lookups_usable() -> None:
    """SystemExit in a fetch (a worker told to stop) fails its group's asks and the thread that
    ran it; the next lookup still runs (nothing is left marked busy)."""

    def answer(keys: list[str]) -> Mapping[str, str]:
        if keys == ["b"]:
            raise SystemExit(1)
        return {k: k for k in keys}

    held = Held(answer)
    grouped: Grouped[str, str] = Grouped(held)
    answers = _ask_all(grouped, "a", ["b"])
    assert answers["a"] == ["a"] and isinstance(answers["b"][0], SystemExit)
    assert grouped.get("c") == "c" and not grouped._busy


def test_a_lone_ask_is_fetched_at_once_and_alone() -> None:
    calls: list[list[str]] = []

    def fetch(keys: list[str]) -> Mapping[str, str]:
        calls.append(keys)
        return {k: "x" for k in keys}

    grouped: Grouped[str, str] = Grouped(fetch)
    assert grouped.get("a") == "x" and grouped.get("b") == "x"
    assert calls == [["a"], ["b"]]


def test_a_group_holds_at_most_as_many_keys_as_an_in_filter() -> None:
    held = Held()
    grouped: Grouped[str, str] = Grouped(held, most=2)
    answers = _ask_all(grouped, "a", ["b", "c", "d", "b"])
    assert held.calls == [["a"], ["b", "c"], ["d"]]  # the oldest first, a key's asks together
    assert answers == {"a": ["A"], "b": ["B", "B"], "c": ["C"], "d": ["D"]}


def test_a_failed_fetch_fails_every_ask_of_its_group_and_no_other() -> None:
    def answer(keys: list[str]) -> Mapping[str, str]:
        if "b" in keys:
            raise gexc.FailedPrecondition("The query requires an index.")  # type: ignore[no-untyped-call]
        return {k: k for k in keys}

    held = Held(answer)
    grouped: Grouped[str, str] = Grouped(held, most=2)
    answers = _ask_all(grouped, "a", ["b", "c", "d"])
    assert held.calls == [["a"], ["b", "c"], ["d"]]
    assert answers["a"] == ["a"] and answers["d"] == ["d"]
    assert all(isinstance(v[0], gexc.FailedPrecondition) for v in (answers["b"], answers["c"]))


@pytest.fixture
def fs(firestore_host: str) -> FirestoreStore:
    return FirestoreStore(firestore.Client(project=f"t-{uuid.uuid4().hex[:12]}"))


def _opened(fs: FirestoreStore, node: str) -> dict[str, Any]:
    out = fs.apply(_event(XID79, node), POLICY, T0)
    assert out.incident is not None
    return dict(out.incident)


def _op(q: firestore.Query) -> str:
    """The operator of a query's first filter (the node's: ``EQUAL`` or ``IN``)."""
    return str(StructuredQuery.FieldFilter.Operator(q._field_filters[0].op).name)


def _queries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every query run, by the operator of its node filter."""
    ran: list[str] = []
    stream = firestore.Query.stream

    def counted(q: firestore.Query, *a: Any, **kw: Any) -> Any:
        ran.append(_op(q))
        return stream(q, *a, **kw)

    monkeypatch.setattr(firestore.Query, "stream", counted)
    return ran


def test_one_in_query_finds_each_nodes_live_incident(
    fs: FirestoreStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the emulator: a node with a live incident, one whose incident is closed, one never
    seen: the grouped query answers each as its own query would."""
    live, closed = _opened(fs, "a3-node-101"), _opened(fs, "a3-node-102")
    assert fs.close(closed["id"], "ops", T0 + 1, unfence=False).result == "closed"
    ran = _queries(monkeypatch)
    found = fs._live_of([live["node_key"], closed["node_key"], "a3-node-103"])
    assert {k: _any(v.to_dict())["id"] for k, v in found.items()} == {live["node_key"]: live["id"]}
    assert ran == ["IN"]


def test_concurrent_first_contacts_share_queries(fs: FirestoreStore, monkeypatch: pytest.MonkeyPatch) -> None:
    incs = [_opened(fs, f"a3-node-2{i:02d}") for i in range(6)]
    held = Held(fs._live_of)
    fs.live_lookups = Grouped(held)
    answers = _ask_all(fs.live_lookups, incs[0]["node_key"], [i["node_key"] for i in incs[1:]])
    assert len(held.calls) == 2
    assert {k: _any(v[0].to_dict())["id"] for k, v in answers.items()} == {
        i["node_key"]: i["id"] for i in incs
    }
    assert fs.live_incident(incs[3]["node_key"]) == fs.get(incs[3]["id"])  # through the store's own


def test_a_refused_in_query_falls_back_to_one_query_a_node(
    fs: FirestoreStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should Firestore ever want an index for the ``in`` form, each node is asked on its own
    from then on (and the live query itself stays on)."""
    incs = [_opened(fs, f"a3-node-3{i:02d}") for i in range(3)]
    stream = firestore.Query.stream
    ran: list[str] = []

    def refuse_in(q: firestore.Query, *a: Any, **kw: Any) -> Any:
        op = _op(q)
        ran.append(op)
        if op == "IN":
            raise gexc.FailedPrecondition("The query requires an index.")  # type: ignore[no-untyped-call]
        return stream(q, *a, **kw)

    monkeypatch.setattr(firestore.Query, "stream", refuse_in)
    keys = [i["node_key"] for i in incs]
    for _ in range(2):
        found = fs._live_of(keys)
        assert {k: _any(v.to_dict())["id"] for k, v in found.items()} == {
            i["node_key"]: i["id"] for i in incs
        }
    assert ran == ["IN", "EQUAL", "EQUAL", "EQUAL", "EQUAL", "EQUAL", "EQUAL"]
    assert fs.live_in is False and fs.live_query is True


def test_should_a_node_have_two_live_incidents_the_newer_is_its_live_one(fs: FirestoreStore) -> None:
    """Not a state the store makes (core/lifecycle.move keeps one), but an older version's resolve
    may leave one marked: whichever query finds them, the one created last is the node's."""
    old = _opened(fs, "a3-node-401")
    nkey = old["node_key"]
    fs.incidents.document("newer").set({**old, "id": "newer"})  # created after ``old``
    assert fs._live_of([nkey])[nkey].id == "newer"
    assert fs._live_of([nkey, "a3-node-402"])[nkey].id == "newer"
