"""First contacts asked at once share their reads (adapters/firestore_latest.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.adapters.firestore import IncidentStore as FirestoreStore
from pitstop.adapters.firestore_latest import Grouped
from pitstop.adapters.firestore_snaps import SnapCache
from pitstop.core.aggregate import CloseByPerson
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


def _until(met: Callable[[], bool]) -> None:
    """Wait for what another thread does (the lookups wake no one when an ask queues)."""
    deadline = time.monotonic() + WAIT_S
    while not met():
        assert time.monotonic() < deadline
        time.sleep(0.001)


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
        _until(lambda n=queued: len(grouped._queue) == n)  # type: ignore[misc]
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


def test_a_group_holds_at_most_its_bound_of_keys_oldest_first() -> None:
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


def _gets(fs: FirestoreStore) -> list[list[str]]:
    """Every batched get the store's client sends, as the collections of the documents it names."""
    sent: list[list[str]] = []
    get_all = fs.db.get_all

    def counted(refs: list[Any], *a: Any, **kw: Any) -> Any:
        sent.append([r.parent.id for r in refs])
        return get_all(refs, *a, **kw)

    fs.db.get_all = counted
    return sent


def test_a_lookup_finds_each_nodes_latest_incident_in_two_gets(fs: FirestoreStore) -> None:
    """Against the emulator: a node with an open incident, one whose incident is closed (still its
    latest), one never seen: the group answers each as its own reads would, in two batched gets
    (the nodes, then the incidents they name), and keeps what it read for the decision that may
    follow."""
    live, closed = _opened(fs, "a3-node-101"), _opened(fs, "a3-node-102")
    assert fs.decide(closed["id"], CloseByPerson("ops", False), None, T0 + 1).result == "closed"
    fs.snaps = SnapCache()
    sent = _gets(fs)
    found = fs._latest_of([live["node_key"], closed["node_key"], "a3-node-103"])
    answers = {
        k: (_any(inc.to_dict())["id"], _any(inc.to_dict())["state"]) if inc is not None else None
        for k, (_, inc) in found.items()
    }
    assert answers == {
        live["node_key"]: (live["id"], "OPEN"),
        closed["node_key"]: (closed["id"], "RESOLVED"),
        "a3-node-103": None,
    }
    assert not found["a3-node-103"][0].exists
    assert sent == [["pitstop_nodes"] * 3, ["pitstop_incidents"] * 2]
    for path in (fs.nodes.document(live["node_key"]).path, fs.incidents.document(live["id"]).path):
        assert fs.snaps.younger(path, 60.0)


def test_concurrent_first_contacts_share_gets(fs: FirestoreStore) -> None:
    incs = [_opened(fs, f"a3-node-2{i:02d}") for i in range(6)]
    held = Held(fs._latest_of)
    fs.latest_lookups = Grouped(held)
    sent = _gets(fs)
    answers = _ask_all(fs.latest_lookups, incs[0]["node_key"], [i["node_key"] for i in incs[1:]])
    assert len(held.calls) == 2 and [len(refs) for refs in sent] == [1, 1, 5, 5]
    assert {k: _any(v[0][1].to_dict())["id"] for k, v in answers.items()} == {
        i["node_key"]: i["id"] for i in incs
    }
    assert fs.latest_incident(incs[3]["node_key"]) == fs.get(incs[3]["id"])  # through the store's own


def test_a_first_contact_is_billed_a_read_for_the_node_and_one_for_its_incident(
    firestore_host: str,
) -> None:
    """What the bench counts (tools/firestore_ops.py): a get is billed per document, found or
    missing; a node never seen costs one read, a node with an incident two."""
    from pitstop.tools.firestore_ops import FirestoreOps

    client = firestore.Client(project=f"t-{uuid.uuid4().hex[:12]}")
    ops = FirestoreOps(client)
    fs = FirestoreStore(client)
    inc = _opened(fs, "a3-node-501")
    before = ops.reads
    assert _any(fs.latest_incident(inc["node_key"]))["id"] == inc["id"]
    assert fs.latest_incident("a3-node-502") is None
    assert ops.reads - before == 3


def test_a_node_written_without_an_incident_has_no_latest(fs: FirestoreStore) -> None:
    """Acting may record facts on a node before any incident names it (set_node_fields, a merge):
    its document then has no ``latest_incident`` field, which reads as none, not an error."""
    fs.set_node_fields("a3-node-601", {"block": "block-1"})
    assert fs.latest_incident("a3-node-601") is None


def test_answers_follow_the_documents_not_the_order_they_come_back_in(fs: FirestoreStore) -> None:
    """A batched get may answer in any order (the emulator keeps the request's): each node gets its
    own incident however the answers come; a node naming an incident that is gone has none; and
    two nodes naming one incident (hand-edited documents) each get it."""
    incs = [_opened(fs, f"a3-node-7{i:02d}") for i in range(3)]
    fs.put_node("a3-node-710", {"latest_incident": "gone"})  # type: ignore[typeddict-item]
    fs.put_node("a3-node-711", {"latest_incident": incs[0]["id"]})  # type: ignore[typeddict-item]
    get_all = fs.db.get_all

    def reversed_get_all(refs: list[Any], *a: Any, **kw: Any) -> Any:
        return reversed(list(get_all(refs, *a, **kw)))

    fs.db.get_all = reversed_get_all
    keys = [i["node_key"] for i in incs] + ["a3-node-710", "a3-node-711", "a3-node-712"]
    found = fs._latest_of(keys)
    named = {k: inc.id if inc is not None and inc.exists else None for k, (_, inc) in found.items()}
    assert named == {
        **{i["node_key"]: i["id"] for i in incs},
        "a3-node-710": None,
        "a3-node-711": incs[0]["id"],
        "a3-node-712": None,
    }
    assert {k: node.id for k, (node, _) in found.items()} == {k: k for k in keys}
    assert fs.latest_incident("a3-node-710") is None


def _cached(fs: FirestoreStore, path: str) -> Any:
    held = fs.snaps.get(path, 60.0)
    assert held is not None
    return held


def test_a_read_answered_after_this_process_committed_leaves_the_newer_snapshot(
    fs: FirestoreStore,
) -> None:
    """A grouped lookup holds no node's lock: its get may read an incident, then this process
    commits a line into it, then the lookup's answer arrives. The cache keeps the committed
    snapshot, so the next decision starts from it and is not refused."""
    first = _opened(fs, "a3-node-720")
    path = fs.incidents.document(first["id"]).path
    get_all, read, go = fs.db.get_all, threading.Event(), threading.Event()

    def late(refs: list[Any], *a: Any, **kw: Any) -> Any:
        snaps = list(get_all(refs, *a, **kw))  # read at the server now, answered later
        if refs and refs[0].parent.id.endswith("_incidents"):
            read.set()
            assert go.wait(WAIT_S)
        return iter(snaps)

    fs.db.get_all = late
    lookup = threading.Thread(target=fs.latest_incident, args=(first["node_key"],))
    lookup.start()
    assert read.wait(WAIT_S)
    assert fs.apply(_event(XID79, "a3-node-720"), POLICY, T0 + 1).result == "absorbed"
    committed = _cached(fs, path).update_time
    go.set()
    lookup.join(WAIT_S)
    assert _cached(fs, path).update_time == committed
    refused = fs.refused
    assert fs.apply(_event(XID79, "a3-node-720"), POLICY, T0 + 2).result == "absorbed"
    assert fs.refused == refused and _any(fs.get(first["id"]))["counts"]["events"] == 3
