"""A node's live incident, looked up for many nodes at once.

At first contact an ingest instance asks for the node's live incident (``live_incident`` below,
from services/coalesce.py ``read_latest``). In a storm over a large cluster every instance meets
hundreds of nodes, up to ``concurrency`` of them at the same moment: asked one by one, each is a
query of its own (a round trip, at least one billed read even when nothing matched, and on the
emulator a scan of the whole collection: over 12,000 of them over 2,000 incidents in a bench run,
README "Storms as deployed"). So lookups made while one is under way wait for it to finish and
then go together, as one ``in`` query over up to ``IN_MOST`` nodes (Firestore's limit on an
``in`` filter's values: https://firebase.google.com/docs/firestore/query-data/queries#in_and_array-contains-any).
A lone lookup goes at once: nothing waits to fill a batch, and a node's answer always comes from a
query that started after it was asked (a decision that waited its turn asks again to see what
another instance opened meanwhile).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar, cast

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.base_document import DocumentSnapshot

from pitstop.adapters import log
from pitstop.adapters.firestore_snaps import SnapCache
from pitstop.core.domain import Incident
from pitstop.core.states import State

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

Snapshot = DocumentSnapshot[Any]  # an incident as the query returned it
IN_MOST = 30  # values an ``in`` filter may hold


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

    def __init__(self, fetch: Callable[[list[K]], Mapping[K, V]], most: int = IN_MOST) -> None:
        self._fetch, self._most = fetch, most
        self._queue: list[_Ask[K, V]] = []
        self._busy = False
        self._cond = threading.Condition()

    def get(self, key: K) -> V | None:
        ask: _Ask[K, V] = _Ask(key)
        with self._cond:
            self._queue.append(ask)
            self._cond.notify_all()  # (only a watcher cares: the asks queue behind a busy fetch)
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


class LiveIncidents:
    """Mixed into the store (adapters/firestore.py), which provides the collection and the cache."""

    incidents: Any  # the incidents collection
    snaps: SnapCache  # documents as last read or written (adapters/firestore_snaps.py)
    live_query = True  # off once the database refused the live incident query (live_incident)
    live_in = True  # off once it refused the ``in`` form: one query a node from then on
    live_lookups: Grouped[str, Snapshot]  # set by the store: Grouped(self._live_of)

    def live_incident(self, nkey: str) -> Incident | None:
        """The node's incident that is not RESOLVED (it has at most one: its latest; core/domain.py
        ``live``), in one read where ``latest_incident`` takes two: an equality query on two
        fields, which Firestore serves by merging its automatic single-field indexes (no composite
        index to deploy: firebase.google.com/docs/firestore/query-data/index-overview), grouped
        with the lookups of other nodes asked meanwhile. None: no live incident, or one written
        before incidents carried ``live``, or the database refuses the query (it asks for an
        index): then the node is read the long way from now on, rather than every delivery
        failing. The emulator has no index: it scans the collection for every query, so there the
        grouping matters most (README, Storms)."""
        if not self.live_query:
            return None
        try:  # grouped while the ``in`` form serves; else each node's own query, at once
            snap = self.live_lookups.get(nkey) if self.live_in else self._live_of([nkey]).get(nkey)
        except gexc.FailedPrecondition as exc:  # "The query requires an index"
            self.live_query = False
            log.emit(
                "WARNING", "live incident query refused: nodes are read the long way", error=str(exc)[:300]
            )
            return None
        inc = cast(Incident | None, snap.to_dict()) if snap is not None else None
        if inc is None or inc.get("state") == State.RESOLVED:  # moved by a version before ``live``
            return None
        self.snaps.put(snap)  # the decision that may follow does not read it again
        return inc

    def _live_of(self, nkeys: list[str]) -> dict[str, Snapshot]:
        """Each node's live incident snapshot: one ``in`` query for them all, or one query a node
        (a lone node, or the database refused the ``in`` form)."""
        if len(nkeys) > 1 and self.live_in:
            try:
                return self._live_query(firestore.FieldFilter("node_key", "in", nkeys))
            except gexc.FailedPrecondition as exc:
                self.live_in = False
                log.emit("WARNING", "grouped live incident query refused: one a node", error=str(exc)[:300])
        found: dict[str, Snapshot] = {}
        for nkey in nkeys:
            found.update(self._live_query(firestore.FieldFilter("node_key", "==", nkey)))
        return found

    def _live_query(self, by_node: Any) -> dict[str, Snapshot]:
        """Live incidents under ``by_node``, one a node (should a fault have left two, the newer)."""
        found: dict[str, Snapshot] = {}
        q = self.incidents.where(filter=by_node).where(filter=firestore.FieldFilter("live", "==", True))
        for snap in q.stream():
            nkey = str(snap.get("node_key"))  # the filter matched it: present
            if nkey not in found or snap.create_time > found[nkey].create_time:
                found[nkey] = snap
        return found
