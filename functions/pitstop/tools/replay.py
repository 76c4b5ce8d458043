"""`pitstop replay`: past log entries through classify + the incident engine, in observe mode.

The same pure engine as production, on an in-memory store, with event time as the clock
and the periodic sweep simulated every minute, so the report shows what the policy would
have done: incidents, actions, escalations, and what the blast-radius budget would have held.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypedDict

import orjson

from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import engine, vertex_log
from pitstop.core.classify import Classifier
from pitstop.core.domain import Escalation, FaultEvent, Held, Incident
from pitstop.core.entry import invalid
from pitstop.core.envelope import unwrap
from pitstop.core.parse import parse_entry
from pitstop.core.policy import Policy, from_doc
from pitstop.core.timefmt import to_epoch
from pitstop.core.timeline import iso
from pitstop.services.sweep import close_bursts, release_held
from pitstop.tools.progress import Note, silent

SWEEP_EVERY_S = 60.0


class ReplayItem(TypedDict, total=False):
    """One line of an export: its decoded JSON (any envelope, read by core/envelope.unwrap), or
    why it could not be decoded."""

    _payload: object
    _invalid: str


class ReplaySummary(TypedDict):
    """What a replay keeps of one incident (and tools/report_model reads back)."""

    id: str
    node: str
    zone: str | None
    cluster: str | None
    kind: str
    xid: int | None
    action: str
    state: str
    held: Held | None
    would_start: bool
    events: int
    first_seen: float
    last_seen: float
    escalations: list[Escalation]
    reason: str


class ReplayTotals(TypedDict):
    incidents: int
    would_start: int
    held_by_budget: int
    released_later: int
    held_for_human: int
    by_action: dict[str, int]


class Replayed(TypedDict):
    """What `pitstop replay` prints (``--json``): the entries by kind, the engine's results, and
    what the policy would have done."""

    entries: int
    by_kind: dict[str, int]
    results: dict[str, int]
    incidents: list[ReplaySummary]
    totals: ReplayTotals


def sweep(store: MemoryStore, policy: Policy, now: float) -> None:
    """What the minute sweep decides, by the sweep's own rules: bursts end, budget holds retry."""
    close_bursts(store, now)
    release_held(store, policy, now)


def observe_policy(policy: Policy) -> Policy:
    doc = copy.deepcopy(dict(policy.doc))
    doc["mode"] = "observe"
    return from_doc(doc, "replay policy")


def read_jsonl(path: str | Path) -> Iterator[ReplayItem]:
    """Entries (or any envelope) from a JSON Lines export; a broken line becomes an invalid marker."""
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                yield {"_payload": orjson.loads(raw)}
            except orjson.JSONDecodeError as exc:
                yield {"_invalid": f"malformed JSON: {str(exc)[:120]}"}


def replay(
    items: Iterable[Mapping[str, object]],
    policy: Policy,
    classifier: Classifier | None = None,
    note: Note = silent,
) -> Replayed:
    """The items (ReplayItems, or bare entries) through classify and the engine, in event time;
    ``note`` hears how far it got (entries read, then the engine's clock: a sweep every minute of
    event time, so years of history take a while)."""
    pol = observe_policy(policy)
    clf = classifier or Classifier(pol.xids, Classifier.default().system_events)
    events: list[FaultEvent] = []
    kinds: Counter[str] = Counter()
    for item in items:
        if "_invalid" in item:
            ev = invalid(str(item["_invalid"]))
        else:
            delivery = unwrap(item.get("_payload", item))
            ev = (
                clf.decide(parse_entry(delivery.entry, delivery))
                if delivery.entry is not None
                else invalid(delivery.error or "no log entry")
            )
        ev = vertex_log.place(ev, pol)  # as ingest does: a Vertex AI job's entry on its cluster's job
        kinds[ev["kind"]] += 1
        note(lambda: f"{sum(kinds.values()):,} entries read")
        if ev["kind"] not in ("unrelated", "invalid"):
            ts = to_epoch(ev.get("observed_at"))
            if ts is None:
                kinds["no_timestamp"] += 1
                continue
            ev["_observed_ts"] = ts
            events.append(ev)
    events.sort(key=lambda e: e["_observed_ts"])
    store = MemoryStore()
    results: Counter[str] = Counter()
    next_sweep = events[0]["_observed_ts"] + SWEEP_EVERY_S if events else 0.0
    note(f"{sum(kinds.values()):,} entries read, {len(events):,} events for the engine", force=True)
    for i, ev in enumerate(events, 1):
        now = ev["_observed_ts"]
        while now >= next_sweep:
            sweep(store, pol, next_sweep)
            next_sweep += SWEEP_EVERY_S
            note(_at(i, len(events), next_sweep))
        results[store.apply(ev, pol, now).result] += 1
    incidents = store.query()  # oldest first
    return {
        "entries": sum(kinds.values()),
        "by_kind": dict(kinds),
        "results": dict(results),
        "incidents": [_summary(i) for i in incidents],
        "totals": {
            "incidents": len(incidents),
            "would_start": sum(1 for i in incidents if (i.get("workflow") or {}).get("would_start")),
            "held_by_budget": sum(1 for i in incidents if (h := i.get("held")) and h.get("scope")),
            "released_later": sum(
                1 for i in incidents if any(h.get("by") == "sweep" for h in i.get("holds", []))
            ),
            "held_for_human": sum(1 for i in incidents if (h := i.get("held")) and not h.get("scope")),
            "by_action": dict(Counter(i["action"] for i in incidents)),
        },
    }


def _at(i: int, total: int, clock: float) -> Callable[[], str]:
    """The replay's position, made into text only if the progress line is due."""
    return lambda: f"event {i:,} of {total:,}, engine clock at {iso(clock)}"


def _summary(inc: Incident) -> ReplaySummary:
    return {
        "id": inc["id"],
        "node": engine.subject_name(inc),
        "zone": node.get("zone") if (node := inc["node"]) else None,
        "cluster": inc["cluster"],
        "kind": inc["kind"],
        "xid": inc["xid"],
        "action": inc["action"],
        "state": inc["state"],
        "held": inc.get("held"),
        "would_start": bool((inc.get("workflow") or {}).get("would_start")),
        "events": inc["counts"]["events"],
        "first_seen": inc["first_seen"],
        "last_seen": inc["last_seen"],
        "escalations": inc["escalations"],
        "reason": inc["reason"],
    }


def cloud_logging_entries(
    project: str, since_s: float, now: float, endpoint: str | None = None, filters_dir: Path | None = None
) -> Iterator[ReplayItem]:
    """Past entries from Cloud Logging's entries.list, selected with the pipeline's own sink filters."""
    import datetime as dt

    from google.cloud import logging as gcl

    from pitstop.core.sinks import combined_filter

    start = dt.datetime.fromtimestamp(now - since_s, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    flt = f'({combined_filter(filters_dir)}) AND timestamp >= "{start}"'
    kwargs: dict[str, object] = {"project": project}  # google.cloud.logging.Client's keywords
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
        kwargs |= {"credentials": anonymous, "_use_grpc": False, "client_options": {"api_endpoint": endpoint}}
    client: Any = gcl.Client(**kwargs)  # type: ignore[no-untyped-call]
    for entry in client.list_entries(
        resource_names=[f"projects/{project}"], filter_=flt, order_by=gcl.ASCENDING
    ):
        yield {"_payload": entry.to_api_repr()}
