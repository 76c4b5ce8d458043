"""What `pitstop report` says about a period, computed from incident documents (no I/O).

The input is what the incident store holds (adapters/firestore.py, one document per incident,
see core/engine.py ``new_incident``) or what `pitstop replay` decided (its incident summaries,
turned into the same shape by :func:`incidents_from_replay`). The output is plain data the
renderer (tools/report.py) lays out: counts per day, time-to-milestone distributions, nodes by
remediations, holds, Xids and one row per incident. Times are epoch seconds, days are UTC.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pitstop.core.actions import NODE_ACTIONS
from pitstop.core.policy import Policy
from pitstop.core.policy_types import LemonRule
from pitstop.core.timeline import durations
from pitstop.tools.report_checkpoints import Advice

if TYPE_CHECKING:
    from pitstop.tools.replay import Replayed

# An incident document as stored (or as a replay summarises it), from any version of Pitstop:
# every field is read after its type is checked, so an older or partial document still reports.
Doc = Mapping[str, object]

# (timeline milestone, what the time from detection to it is called, its short column name).
MEASURES = (
    ("classified", "time to detect", "detect"),
    ("fenced", "time to fence", "fence"),
    ("job_requeued", "time to requeue the job", "requeue"),
    ("job_running", "time to resume (job running again)", "resume"),
    ("acted", "time to act", "act"),
    ("healthy", "time to healthy", "healthy"),
    ("validated", "time to validated", "validated"),
    ("resolved", "time to remediate", "remediate"),
)
# Milestones older documents recorded under another name: ``job_resumed`` was the requeue.
RENAMED = {"job_resumed": "job_requeued"}
# How an incident ended (or where it stands), in the order the page lists them.
OUTCOMES = (
    "remediated",  # Pitstop's workflow took its action and resolved it
    "would act",  # observe mode or replay: a remediation would have started
    "recorded",  # nothing to do on the node: resolved when its burst ended (or suppressed)
    "rejected",  # the evidence did not match the live VM: nothing was touched
    "closed by a person",
    "held",  # waits for a person or a budget
    "failed",  # remediation failed: the node stays fenced until a person closes it
    "in progress",
)
NEEDS_PERSON = ("held", "failed", "closed by a person")


@dataclass(frozen=True)
class Stats:
    """A distribution of seconds: count, mean, median, 95th percentile (nearest rank) and max."""

    n: int
    mean: float | None
    p50: float | None
    p95: float | None
    max: float | None
    values: tuple[float, ...] = ()


@dataclass(frozen=True)
class IncidentRow:
    id: str
    node: str
    zone: str
    cluster: str | None
    kind: str
    xid: int | None
    action: str
    state: str
    outcome: str
    mode: str
    events: int
    detected: float | None
    reason: str
    timeline: Mapping[str, float]  # milestone -> epoch seconds, as recorded
    offsets: Mapping[str, float | None]  # milestone -> seconds after detection
    remediations: int  # workflow steps decided (a replayed one that would start counts once)
    escalations: tuple[Doc, ...] = ()
    holds: tuple[Doc, ...] = ()  # past holds, then the current one (without "until")
    failure: Doc | None = None
    closure: Doc | None = None
    rejected: Doc | None = None
    validation: tuple[Doc, ...] = ()
    diagnosis: Doc | None = None


@dataclass(frozen=True)
class NodeRow:
    node: str
    zone: str
    cluster: str | None
    incidents: int
    remediations: int
    node_actions: int  # remediations with a node action (reset, reboot, replace, drain)
    actions: Mapping[str, int]
    last_detected: float | None
    lemon: bool  # node actions reached the policy's lemon count within its window
    escalated_as_lemon: bool  # the engine itself raised an action because of the node's history


@dataclass(frozen=True)
class HoldRow:
    """One reason incidents were held: a blast-radius budget's scope, a cooldown, a disabled action."""

    what: str
    budget: bool
    incidents: int
    held_now: int
    held_s: float | None  # total time held, over the holds that ended (None: none has)
    released_by: Mapping[str, int]


@dataclass(frozen=True)
class XidRow:
    xid: int
    name: str
    incidents: int
    lines: int
    nodes: int
    actions: Mapping[str, int]


@dataclass(frozen=True)
class Report:
    source: str
    start: float | None  # None: from the first incident
    end: float | None  # None: to the last incident
    incidents: tuple[IncidentRow, ...]
    by_kind: Mapping[str, int]
    by_action: Mapping[str, int]
    by_outcome: Mapping[str, int]
    per_day_kind: Mapping[str, Mapping[str, int]]  # "YYYY-MM-DD" -> kind -> incidents
    per_day_action: Mapping[str, Mapping[str, int]]
    times: Mapping[str, Stats]  # milestone -> seconds from detection
    nodes: tuple[NodeRow, ...]
    holds: tuple[HoldRow, ...]
    xids: tuple[XidRow, ...]
    validation: Mapping[str, int]  # verdict -> validations
    lemon_rule: LemonRule
    notes: tuple[str, ...] = field(default=())
    control: tuple[str, ...] = ()  # the runtime control in force (core/control.py), one line each
    control_changes: tuple[str, ...] = ()  # ... and its changes in the period: who, when, why
    checkpoints: Advice | None = None  # each job's checkpoint advice (tools/report_checkpoints.py)
    checkpoints_note: str = ""  # why there is none, when its series could not be read

    @property
    def needs_person(self) -> tuple[IncidentRow, ...]:
        return tuple(r for r in self.incidents if r.outcome in NEEDS_PERSON)


# -- one incident ------------------------------------------------------------------------------


def _map(value: object) -> Doc:
    """A nested document, or an empty one for anything else (unset, or of another shape)."""
    return value if isinstance(value, Mapping) else {}


def _map_or_none(value: object) -> Doc | None:
    return value if isinstance(value, Mapping) and value else None


def _int(value: object) -> int:
    """A count as stored (0 when unset); a word that is not a number still raises, as int() does."""
    return int(value) if isinstance(value, int | float | str) and value else 0


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def detected_at(inc: Doc) -> float | None:
    """When the fault was logged: the timeline's ``detected``, else first seen, else created."""
    for v in (_map(inc.get("timeline")).get("detected"), inc.get("first_seen"), inc.get("created_at")):
        if isinstance(v, int | float):
            return float(v)
    return None


def outcome(inc: Doc) -> str:
    """Where an incident ended up (one of OUTCOMES)."""
    state = str(inc.get("state") or "")
    remediated = _int(inc.get("step")) > 0
    if inc.get("closure"):
        return "closed by a person"
    if state in ("HELD", "FAILED"):
        return state.lower()
    if inc.get("rejected"):
        return "rejected"
    if _map(inc.get("workflow")).get("would_start"):
        return "would act"
    if state == "RESOLVED":
        return "remediated" if remediated else "recorded"
    return "in progress"


def _as_list(value: object) -> tuple[Doc, ...]:
    if isinstance(value, Mapping):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(v for v in value if isinstance(v, Mapping))
    return ()


def _xid(value: object) -> int | None:
    if not isinstance(value, int | float | str):  # unset, or nothing a code is written as
        return None
    try:
        return int(value)
    except ValueError:
        return None


def offsets(tl: Mapping[str, float]) -> dict[str, float | None]:
    """Seconds from detection to each milestone: core.timeline's, and any other one recorded."""
    out = durations({"timeline": tl})
    start = tl.get("detected")
    for k, v in tl.items():
        if k != "detected" and out.get(k) is None:
            out[k] = None if start is None else round(v - start, 3)
    return out


def incident_row(inc: Doc) -> IncidentRow:
    node = _map(inc.get("node"))
    held = inc.get("held")
    tl = {str(k): float(v) for k, v in _map(inc.get("timeline")).items() if isinstance(v, int | float)}
    for old, new in RENAMED.items():
        if old in tl:
            tl.setdefault(new, tl[old])
    would = bool(_map(inc.get("workflow")).get("would_start"))
    return IncidentRow(
        id=str(inc.get("id") or "?"),
        node=str(node.get("instance") or "?"),
        zone=str(node.get("zone") or ""),
        cluster=_str_or_none(inc.get("cluster")),
        kind=str(inc.get("kind") or "?"),
        xid=_xid(inc.get("xid")),
        action=str(inc.get("action") or "NONE"),
        state=str(inc.get("state") or "?"),
        outcome=outcome(inc),
        mode=str(inc.get("mode") or ""),
        events=_int(_map(inc.get("counts")).get("events")),
        detected=detected_at(inc),
        reason=str(inc.get("reason") or ""),
        timeline=tl,
        offsets=offsets(tl),
        remediations=max(_int(inc.get("step")), 1 if would else 0),
        escalations=_as_list(inc.get("escalations")),
        holds=_as_list(inc.get("holds")) + _as_list(held),
        failure=_map_or_none(inc.get("failure")),
        closure=_map_or_none(inc.get("closure")),
        rejected=_map_or_none(inc.get("rejected")),
        validation=_as_list(inc.get("validation")),
        diagnosis=_map_or_none(inc.get("diagnosis")),
    )


# -- the period --------------------------------------------------------------------------------


def in_period(incidents: Iterable[Doc], start: float | None) -> list[dict[str, object]]:
    """Incidents detected at or after ``start`` (all of them when None), oldest first."""
    kept = [dict(i) for i in incidents if start is None or (detected_at(i) or -math.inf) >= start]
    return sorted(kept, key=lambda i: (detected_at(i) or 0.0, str(i.get("id"))))


def incidents_from_replay(replayed: Replayed) -> list[dict[str, object]]:
    """`pitstop replay`'s incident summaries as incident documents (what the store would hold)."""
    out = []
    for s in replayed["incidents"]:
        doc: dict[str, object] = {
            k: s[k] for k in ("id", "cluster", "kind", "xid", "action", "state", "reason", "held")
        }
        doc |= {
            "node": {"instance": s["node"], "zone": s["zone"]},
            "mode": "observe",
            "counts": {"events": s["events"]},
            "first_seen": s["first_seen"],
            "last_seen": s["last_seen"],
            "timeline": {"detected": s["first_seen"]},
            "escalations": s["escalations"] or [],
            "workflow": {"would_start": bool(s["would_start"])},
        }
        out.append(doc)
    return out


def quantile(ordered: list[float], q: float) -> float | None:
    """Nearest-rank quantile of sorted values (None for none)."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def stats(values: Iterable[float]) -> Stats:
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return Stats(0, None, None, None, None)
    mean = round(sum(ordered) / len(ordered), 3)
    return Stats(
        len(ordered), mean, quantile(ordered, 0.5), quantile(ordered, 0.95), ordered[-1], tuple(ordered)
    )


def times(rows: Iterable[IncidentRow]) -> dict[str, Stats]:
    """Seconds from detection to each milestone. Time to remediate counts remediated incidents only:
    a record-only incident "resolves" when its burst ends, and a person's close is not Pitstop's."""
    rows = list(rows)
    out = {}
    for key, _, _ in MEASURES:
        pool = [r for r in rows if key != "resolved" or r.outcome == "remediated"]
        out[key] = stats(v for r in pool if (v := r.offsets.get(key)) is not None)
    return out


def day(ts: float | None) -> str:
    if ts is None:
        return "unknown"
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d")


def per_day(rows: Iterable[IncidentRow], attr: str) -> dict[str, dict[str, int]]:
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for r in rows:
        table[day(r.detected)][str(getattr(r, attr))] += 1
    return {d: dict(sorted(c.items())) for d, c in sorted(table.items())}


# -- nodes, holds, Xids ------------------------------------------------------------------------


def _lemon(times_: list[float], count: int, window_s: float) -> bool:
    """Did ``count`` node actions fall within any ``window_s`` (the engine's lemon rule)?"""
    ordered = sorted(times_)
    return any(ordered[i + count - 1] - ordered[i] <= window_s for i in range(len(ordered) - count + 1))


def nodes(rows: Iterable[IncidentRow], lemon_rule: LemonRule) -> list[NodeRow]:
    """Nodes by remediations, most first: the lemon candidates lead."""
    by_node: dict[tuple[str, str], list[IncidentRow]] = defaultdict(list)
    for r in rows:
        by_node[(r.zone, r.node)].append(r)
    count, window_s = int(lemon_rule["remediations"]), float(lemon_rule["window_d"]) * 86400
    out = []
    for (zone, node), rs in by_node.items():
        acted = [r for r in rs if r.remediations and r.action in NODE_ACTIONS]
        out.append(
            NodeRow(
                node=node,
                zone=zone,
                cluster=rs[-1].cluster,
                incidents=len(rs),
                remediations=sum(r.remediations for r in rs),
                node_actions=len(acted),
                actions=dict(Counter(r.action for r in rs if r.remediations)),
                last_detected=max((r.detected for r in rs if r.detected is not None), default=None),
                lemon=_lemon([r.detected or 0.0 for r in acted], count, window_s),
                escalated_as_lemon=any(
                    "lemon host" in str(w) for r in rs for e in r.escalations for w in words(e.get("why"))
                ),
            )
        )
    return sorted(out, key=lambda n: (-n.node_actions, -n.remediations, -n.incidents, n.node))


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def words(value: object) -> list[object]:
    """An escalation's ``why``: its list of reasons (a lone word is one reason)."""
    return [value] if isinstance(value, str) and value else _list(value)


def _held_s(h: Doc) -> float:
    """How long an ended hold lasted (its ``until`` is a number: the caller checked)."""
    until = h["until"]
    since = h.get("since") or until
    return (
        float(until) - float(since)
        if isinstance(until, int | float) and isinstance(since, int | float)
        else 0.0
    )


def holds(rows: Iterable[IncidentRow]) -> list[HoldRow]:
    """Holds grouped by what held them: the budget scope, else the hold's reason (numbers as N)."""
    groups: dict[str, list[tuple[IncidentRow, Doc]]] = defaultdict(list)
    for r in rows:
        for h in r.holds:
            what = h.get("scope") or re.sub(r"\d+", "N", str(h.get("reason") or "held"))
            groups[str(what)].append((r, h))
    out = []
    for what, hs in groups.items():
        ended = [h for _, h in hs if isinstance(h.get("until"), int | float)]
        out.append(
            HoldRow(
                what=what,
                budget=any(h.get("scope") for _, h in hs),
                incidents=len({r.id for r, _ in hs}),
                held_now=sum(1 for r, h in hs if "until" not in h and r.state == "HELD"),
                held_s=round(sum(_held_s(h) for h in ended), 3) if ended else None,
                released_by=dict(Counter(str(h.get("by") or "?") for h in ended)),
            )
        )
    return sorted(out, key=lambda h: (not h.budget, -h.incidents, h.what))


def _xid_lines(inc: Doc) -> Counter[int]:
    """Driver lines per Xid code an incident counted (its ``counts``); a replayed one has only its total."""
    counts = _map(inc.get("counts"))
    lines: Counter[int] = Counter()
    for k, v in counts.items():
        code = _xid(k[4:]) if isinstance(k, str) and k.startswith("xid_") else None
        if code is not None and isinstance(v, int):
            lines[code] += v
    if not lines and (code := _xid(inc.get("xid"))) is not None:
        lines[code] = _int(counts.get("events"))
    return lines


def xids(incidents: Iterable[Doc], policy: Policy) -> list[XidRow]:
    """Xid codes by the incidents they opened, then by the lines counted."""
    opened: dict[int, list[Doc]] = defaultdict(list)
    lines: Counter[int] = Counter()
    nodes_: dict[int, set[str]] = defaultdict(set)
    for inc in incidents:
        code = _xid(inc.get("xid"))
        if code is not None:
            opened[code].append(inc)
        for c, n in _xid_lines(inc).items():
            lines[c] += n
            nodes_[c].add(str(_map(inc.get("node")).get("instance")))
    out = [
        XidRow(
            xid=c,
            name=policy.xids.rule(c).name,
            incidents=len(opened.get(c, [])),
            lines=lines[c],
            nodes=len(nodes_[c] | {str(_map(i.get("node")).get("instance")) for i in opened.get(c, [])}),
            actions=dict(Counter(str(i.get("action")) for i in opened.get(c, []))),
        )
        for c in set(opened) | set(lines)
    ]
    return sorted(out, key=lambda x: (-x.incidents, -x.lines, x.xid))


# -- the whole report --------------------------------------------------------------------------


def build(
    incidents: Iterable[Doc],
    policy: Policy,
    *,
    source: str,
    start: float | None,
    end: float | None,
    notes: Iterable[str] = (),
    control: Iterable[str] = (),
    control_changes: Iterable[str] = (),
) -> Report:
    """The report on the incidents detected in [start, end] (None: unbounded on that side)."""
    docs = [d for d in in_period(incidents, start) if end is None or (detected_at(d) or 0.0) <= end]
    rows = [incident_row(d) for d in docs]
    verdicts = Counter(
        str(v.get("verdict") or ("pass" if v.get("passed") else "fail")) for r in rows for v in r.validation
    )
    return Report(
        source=source,
        start=start,
        end=end,
        incidents=tuple(rows),
        by_kind=dict(Counter(r.kind for r in rows).most_common()),
        by_action=dict(Counter(r.action for r in rows).most_common()),
        by_outcome={o: n for o in OUTCOMES if (n := sum(1 for r in rows if r.outcome == o))},
        per_day_kind=per_day(rows, "kind"),
        per_day_action=per_day(rows, "action"),
        times=times(rows),
        nodes=tuple(nodes(rows, policy.doc["lemon"])),
        holds=tuple(holds(rows)),
        xids=tuple(xids(docs, policy)),
        validation=dict(verdicts.most_common()),
        lemon_rule=policy.doc["lemon"].copy(),
        notes=tuple(notes),
        control=tuple(control),
        control_changes=tuple(control_changes),
    )
