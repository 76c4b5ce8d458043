"""A node's latest incident, looked up for many nodes at once.

At first contact an ingest instance reads the node's latest incident (the store's
``counts.latest``, from services/coalesce.py ``read_latest``): the node's document, which names
it, then the incident. In a storm over a large cluster every instance meets hundreds of nodes, up to
``concurrency`` of them at the same moment. So lookups made while one is under way wait for it to
finish and then go together: the nodes' documents in one batched get, the incidents they name in
another, over up to ``GROUP_MOST`` nodes. A lone lookup goes at once: nothing waits to fill a
group, and a node's answer always comes from reads that started after it was asked (a decision
that waited its turn asks again to see what another instance opened meanwhile).

Gets, not a query: each is billed one read per document, found or not
(https://cloud.google.com/firestore/pricing), a first contact two where a query for the node's
live incident (an earlier version's) was billed one; but a get needs no index and costs the
database a key lookup, where the emulator served every query by scanning the whole collection
(docs/sizing.md: ten instances over 2,000 nodes spent as much CPU in the emulator as
in themselves). The node's document is the one the decision that may follow reads first, so it
is kept for it (adapters/firestore_snaps.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar, cast

from google.cloud.firestore_v1.base_document import DocumentSnapshot

from pitstop.adapters.firestore_docs import Shared
from pitstop.core.domain import Incident

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

Snapshot = DocumentSnapshot[Any]  # a document as read
Latest = tuple[Snapshot, Snapshot | None]  # a node's document as read, and its latest incident's
GROUP_MOST = 30  # nodes a group reads at once (60 documents in two gets: small, quick answers)


class _Ask(Generic[K, V]):
    __slots__ = ("done", "error", "key", "value")

    def __init__(self, key: K) -> None:
        self.key, self.done = key, False
        self.value: V | None = None
        self.error: BaseException | None = None

    def answer(self) -> V | None:
        if self.error is not None:
            raise self.error
        return self.value


class Grouped(Generic[K, V]):
    """Lookups by key, those asked while one runs grouped into the next (a group commit's shape:
    no timer, so a lone ask pays no wait). ``fetch`` answers for a list of distinct keys; a key
    it leaves out has no value (None). Its error is every waiting ask's error."""

    def __init__(self, fetch: Callable[[list[K]], Mapping[K, V]], most: int = GROUP_MOST) -> None:
        self._fetch, self._most = fetch, most
        self._queue: list[_Ask[K, V]] = []
        self._busy = False
        self._cond = threading.Condition()

    def get(self, key: K) -> V | None:
        ask: _Ask[K, V] = _Ask(key)
        with self._cond:
            self._queue.append(ask)  # no one to wake: waiters wake as the running fetch ends
        while True:
            with self._cond:
                while self._busy and not ask.done:
                    self._cond.wait()
                if ask.done:
                    return ask.answer()
                group = self._take()
                self._busy = True
            self._run(group)

    def _take(self) -> list[_Ask[K, V]]:
        """The oldest asks over at most ``most`` distinct keys (every ask of a taken key)."""
        keys: set[K] = set()
        for ask in self._queue:
            if len(keys) == self._most:
                break
            keys.add(ask.key)
        group = [a for a in self._queue if a.key in keys]
        self._queue = [a for a in self._queue if a.key not in keys]
        return group

    def _run(self, group: list[_Ask[K, V]]) -> None:
        found: Mapping[K, V] = {}
        error: BaseException | None = None
        try:
            found = self._fetch(list(dict.fromkeys(a.key for a in group)))
        except Exception as exc:  # each ask of the group raises it
            error = exc
        except BaseException as exc:  # the process is stopping: the group fails, and this thread too
            error = exc
            raise
        finally:  # whatever happened, the group is answered and the next fetch may start
            with self._cond:
                for ask in group:
                    ask.value, ask.error, ask.done = found.get(ask.key), error, True
                self._busy = False
                self._cond.notify_all()


def _named(node: Snapshot) -> str | None:
    """The incident a node's document names (its field alone: ``to_dict`` copies the history)."""
    try:
        iid = node.get("latest_incident")  # None for a node never written
    except KeyError:  # a node written without one (set_node_fields)
        return None
    return str(iid) if iid else None


class LatestIncidents:
    """Nodes' latest incidents, read in groups (given the store's client, collections and cache)."""

    def __init__(self, shared: Shared) -> None:
        self._s = shared
        # First contacts asked at once share two gets.
        self.lookups: Grouped[str, Latest] = Grouped(self.fetch)

    def incident(self, nkey: str) -> Incident | None:
        """The node's latest incident as decided (no shards), read without a transaction (to
        refresh a cache), grouped with the lookups of other nodes asked meanwhile."""
        inc = self.read(nkey)[1]
        return cast(Incident | None, inc.to_dict()) if inc is not None and inc.exists else None  # the edge

    def read(self, nkey: str) -> Latest:
        """The node's document and its latest incident's, both read after this call began."""
        pair = self.lookups.get(nkey)
        assert pair is not None  # fetch answers every node it is asked for
        return pair

    def fetch(self, nkeys: list[str]) -> dict[str, Latest]:
        """Each node's document and latest incident: the nodes' documents in one batched get, then
        the incidents they name in another; both kept for the decision that may follow."""
        found: dict[str, Latest] = {}
        naming: dict[str, list[str]] = {}  # incident -> the nodes that name it (one, unless hand-edited)
        db, coll, snaps = self._s.db, self._s.coll, self._s.snaps
        for snap in db.get_all([coll.nodes.document(k) for k in nkeys]):
            snaps.put(snap)
            found[snap.id] = (snap, None)
            if iid := _named(snap):
                naming.setdefault(iid, []).append(snap.id)
        for snap in db.get_all([coll.incidents.document(i) for i in naming]) if naming else []:
            snaps.put(snap)
            for nkey in naming[snap.id]:
                found[nkey] = (found[nkey][0], snap)
        return found
