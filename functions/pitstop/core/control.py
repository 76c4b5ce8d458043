"""The runtime control: the brake, per-cluster mode and silences, given to decisions as data.

People change one document (``<prefix>_control/current`` in Pitstop's database) with `pitstop
pause`, `resume`, `mode` and `silence`; each change is also kept as an audit record (who, when,
why: ``<prefix>_control_changes``). The functions read the document at run time, cached per
instance for ``store.control_cache_s`` (services/control.py), and decisions get it inside the
policy in force (core/policy.Policy.control). Nothing here reads or writes anything.

What it does (core/engine._decide_start, core/aggregate):

- **pause** (everything, or one cluster): an enforce-mode incident is recorded and paged, and
  held (``held.control: pause``): no step starts, and a decided step's start is refused. A
  running step's next disruptive op is refused and its incident held with its node still
  fenced. After ``resume`` the sweep lets each held incident go on, as a new step.
- **mode** per cluster (observe | enforce) overrides the policy's ``mode`` for that cluster.
- **silence** (a node, a cluster or a reservation block, for a while): a new episode in its scope
  is recorded and paged, never acted on, and ends with its burst like an observe-mode one. An
  incident already worked on (its node fenced) is held instead, and goes on once the silence ends
  (its next step checks the node afresh).
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NotRequired, Protocol, TypedDict, cast

from pitstop.core import names, resources
from pitstop.core.domain import Incident, Silenced
from pitstop.core.ids import block_scope
from pitstop.core.timefmt import to_rfc3339

SCHEMA = "control.schema.json"
KEEP_ENDED_S = 7 * 86400.0  # an ended silence stays listed this long (its records stay for ever)
Scope = Literal["node", "cluster", "block"]
SCOPES: tuple[Scope, ...] = ("node", "cluster", "block")
MODES = ("observe", "enforce")
_BLOCK = re.compile(r"[A-Za-z0-9_.-]{0,100}/[A-Za-z0-9_.-]{1,100}", re.ASCII)


class Stamp(TypedDict):
    """Who made a change, when, and why."""

    by: str
    at: float
    reason: str


class ModeDoc(TypedDict):
    mode: str
    by: str
    at: float
    reason: str


class SilenceDoc(TypedDict):
    id: str
    scope: Scope
    value: str
    since: float
    until: float
    by: str
    reason: str
    ended: NotRequired[Stamp]  # expired early by a person


class ClusterDoc(TypedDict, total=False):
    paused: Stamp
    mode: ModeDoc


class ControlDoc(TypedDict, total=False):
    """The stored document (schemas/control.schema.json)."""

    version: int
    updated_at: float
    paused: Stamp  # everything
    clusters: dict[str, ClusterDoc]
    silences: dict[str, SilenceDoc]


class Change(TypedDict):
    """The audit record of one change (``version``: the document's after it)."""

    id: str
    version: int
    at: float
    by: str
    verb: str
    scope: str
    reason: str
    detail: str


class ControlError(Exception):
    """A change that cannot be made as asked (nothing to resume, no such silence, a bad name)."""


@dataclass(frozen=True)
class Hold:
    """Why the control keeps an incident from being acted on: a ``pause`` or a ``silence``."""

    kind: Literal["pause", "silence"]
    why: str


def _pause_text(scope: str, p: Stamp) -> str:
    return f"paused ({scope}) by {p['by']} at {to_rfc3339(p['at'])}: {p['reason']}"


def silence_text(s: SilenceDoc | Silenced) -> str:
    until = to_rfc3339(s["until"])
    return f"silenced ({s['scope']} {s['value']}, {s['id']}) by {s['by']} until {until}: {s['reason']}"


def active(s: SilenceDoc, now: float) -> bool:
    return "ended" not in s and float(s["since"]) <= now < float(s["until"])


def covers(s: SilenceDoc, inc: Incident, block: str | None = None) -> bool:
    """Whether the silence's scope holds the incident's subject. A block is the node's (its
    document's, when the caller read it) or one the incident counts against (its budget scopes)."""
    value = s["value"]
    if s["scope"] == "cluster":
        return inc.get("cluster") == value
    if s["scope"] == "node":
        node = inc.get("node")
        return node is not None and node.get("instance") == value
    return block == value or block_scope(value) in (inc.get("budget_scopes") or ())


@dataclass(frozen=True)
class Control:
    """The control document as a decision reads it (an empty one changes nothing)."""

    doc: ControlDoc = field(default_factory=lambda: ControlDoc())

    @classmethod
    def of(cls, raw: object, where: str = "control document") -> Control:
        """The stored document, checked against its schema (DataFileError naming what is wrong)."""
        doc = {} if raw is None else raw
        resources.validate(doc, SCHEMA, where)
        return cls(cast(ControlDoc, copy.deepcopy(doc)))  # its schema checked it just above

    @property
    def version(self) -> int:
        return int(self.doc.get("version") or 0)

    def _cluster(self, cluster: str | None) -> ClusterDoc:
        return (self.doc.get("clusters") or {}).get(cluster or "", {})

    def mode(self, cluster: str | None, default: str) -> str:
        """The cluster's mode: its own, else the policy's (``default``)."""
        own = self._cluster(cluster).get("mode")
        return own["mode"] if own else default

    def pause(self, cluster: str | None) -> str | None:
        """Why the cluster is paused (everything's pause first, else its own), or None."""
        every = self.doc.get("paused")
        if every is not None:
            return _pause_text("everything", every)
        own = self._cluster(cluster).get("paused")
        return _pause_text(f"cluster {cluster}", own) if own is not None else None

    def silence(self, inc: Incident, now: float, block: str | None = None) -> SilenceDoc | None:
        """The active silence that covers the incident (the one that lasts longest), or None."""
        found = [
            s for s in (self.doc.get("silences") or {}).values() if active(s, now) and covers(s, inc, block)
        ]
        return max(found, key=lambda s: s["until"], default=None)

    def hold(self, inc: Incident, now: float, enforce: bool, block: str | None = None) -> Hold | None:
        """What keeps the incident from being acted on now: a pause of its cluster (only an
        enforce-mode incident is acted on, so only one is held for it), or a silence over it."""
        paused = self.pause(inc.get("cluster")) if enforce else None
        if paused is not None:
            return Hold("pause", paused)
        s = self.silence(inc, now, block)
        return Hold("silence", silence_text(s)) if s is not None else None

    def silences(self, now: float, ended: bool = False) -> list[SilenceDoc]:
        """The silences, soonest to end first: active ones, or (``ended``) every one listed."""
        every = (self.doc.get("silences") or {}).values()
        return sorted((s for s in every if ended or active(s, now)), key=lambda s: s["until"])

    def lines(self, now: float) -> list[str]:
        """What is in force, one line each (for `pitstop incidents` and the report); [] for nothing."""
        out = []
        every = self.doc.get("paused")
        if every is not None:
            out.append(f"PAUSED: everything, {_when(every)}")
        for name, c in sorted((self.doc.get("clusters") or {}).items()):
            if (p := c.get("paused")) is not None:
                out.append(f"PAUSED: cluster {name}, {_when(p)}")
            if (m := c.get("mode")) is not None:
                out.append(f"mode {m['mode']}: cluster {name}, {_when(m)}")
        out += [f"silence {s['id']}: {s['scope']} {s['value']} until {to_rfc3339(s['until'])}, "
                f"by {s['by']}: {s['reason']}" for s in self.silences(now)]  # fmt: skip
        return out


def _when(s: Stamp | ModeDoc) -> str:
    return f"by {s['by']} at {to_rfc3339(s['at'])}: {s['reason']}"


def silenced(s: SilenceDoc) -> Silenced:
    """What an incident keeps of the silence it was recorded under."""
    return {"id": s["id"], "scope": s["scope"], "value": s["value"], "until": s["until"],
            "by": s["by"], "reason": s["reason"]}  # fmt: skip


# -- changes (the CLI's; pure: the store applies one atomically, with its audit record) ------------


def check_scope(scope: str, value: str) -> str | None:
    """What is wrong with a silence's scope value (None: nothing)."""
    if scope == "node":
        return names.instance_problem(value)
    if scope == "cluster":
        return None if names.valid_cluster(value) else f"not a cluster name: {value!r}"
    if scope == "block":
        ok = _BLOCK.fullmatch(value) is not None
        return None if ok else f"not a reservation block (CLUSTER/BLOCK, as Compute names it): {value!r}"
    return f"not a scope: {scope!r} (node, cluster or block)"


def _new(doc: ControlDoc | None) -> ControlDoc:
    return cast(ControlDoc, copy.deepcopy(dict(doc or {})))


def _done(doc: ControlDoc, verb: str, scope: str, who: Stamp, detail: str = "") -> tuple[ControlDoc, Change]:
    """The document after a change (its version one more, ended silences over a week old gone), and
    the change's audit record; both checked against the document's schema before any write."""
    at = who["at"]
    version = int(doc.get("version") or 0) + 1
    doc["version"], doc["updated_at"] = version, at
    kept = {k: s for k, s in (doc.get("silences") or {}).items() if _ended_at(s) > at - KEEP_ENDED_S}
    if kept or "silences" in doc:
        doc["silences"] = kept
    Control.of(doc, "the changed control document")  # a bug here must not reach the functions
    change: Change = {"id": f"v{version:08d}", "version": version, "at": at, "by": who["by"], "verb": verb,
                      "scope": scope, "reason": who["reason"], "detail": detail}  # fmt: skip
    return doc, change


def _ended_at(s: SilenceDoc) -> float:
    ended = s.get("ended")
    return float(ended["at"]) if ended is not None else float(s["until"])


def _clusters(doc: ControlDoc) -> dict[str, ClusterDoc]:
    return doc.setdefault("clusters", {})


def pause(doc: ControlDoc | None, cluster: str | None, who: Stamp) -> tuple[ControlDoc, Change]:
    """Pause everything (``cluster`` None) or one cluster."""
    new = _new(doc)
    if cluster is None:
        if "paused" in new:
            raise ControlError(f"already {Control(new).pause(None)}")
        new["paused"] = who
        return _done(new, "pause", "everything", who)
    if not names.valid_cluster(cluster):
        raise ControlError(f"not a cluster name: {cluster!r}")
    c = _clusters(new).setdefault(cluster, {})
    if "paused" in c:
        raise ControlError(f"cluster {cluster} is already {_pause_text(f'cluster {cluster}', c['paused'])}")
    c["paused"] = who
    return _done(new, "pause", f"cluster {cluster}", who)


def resume(doc: ControlDoc | None, cluster: str | None, who: Stamp) -> tuple[ControlDoc, Change]:
    """Lift a pause: everything's and every cluster's (``cluster`` None), or one cluster's."""
    new = _new(doc)
    clusters = _clusters(new)
    if cluster is None:
        lifted = (["everything"] if new.pop("paused", None) else []) + [
            f"cluster {name}" for name, c in sorted(clusters.items()) if c.pop("paused", None)
        ]
        if not lifted:
            raise ControlError("nothing is paused")
        return _done(_tidy(new), "resume", "everything", who, "lifted: " + ", ".join(lifted))
    if clusters.get(cluster, {}).pop("paused", None) is None:
        raise ControlError(f"cluster {cluster} has no pause of its own to lift")
    still = Control(new).pause(cluster)
    detail = f"still {still}" if still else ""
    return _done(_tidy(new), "resume", f"cluster {cluster}", who, detail)


def set_mode(doc: ControlDoc | None, cluster: str, mode: str | None, who: Stamp) -> tuple[ControlDoc, Change]:
    """Set the cluster's own mode (observe | enforce), or (None) go back to the policy's."""
    if not names.valid_cluster(cluster):
        raise ControlError(f"not a cluster name: {cluster!r}")
    new = _new(doc)
    c = _clusters(new).setdefault(cluster, {})
    if mode is None:
        if c.pop("mode", None) is None:
            raise ControlError(f"cluster {cluster} has no mode of its own: it follows the policy's")
        return _done(_tidy(new), "mode", f"cluster {cluster}", who, "the policy's mode again")
    if mode not in MODES:
        raise ControlError(f"not a mode: {mode!r} (observe or enforce)")
    c["mode"] = {"mode": mode, "by": who["by"], "at": who["at"], "reason": who["reason"]}
    return _done(new, "mode", f"cluster {cluster}", who, mode)


def silence_id(scope: str, value: str, at: float) -> str:
    return "s" + hashlib.sha256(f"{scope}|{value}|{at}".encode()).hexdigest()[:7]


def silence(
    doc: ControlDoc | None, scope: str, value: str, for_s: float, who: Stamp
) -> tuple[ControlDoc, Change]:
    """Silence a node, a cluster or a reservation block for ``for_s`` seconds from now."""
    problem = check_scope(scope, value)
    if problem is not None:
        raise ControlError(problem)
    if not 0 < for_s <= 90 * 86400:
        raise ControlError("a silence lasts more than nothing and at most 90 days")
    new, at = _new(doc), who["at"]
    sid = silence_id(scope, value, at)
    s: SilenceDoc = {"id": sid, "scope": cast(Scope, scope), "value": value, "since": at, "until": at + for_s,
                     "by": who["by"], "reason": who["reason"]}  # fmt: skip
    new.setdefault("silences", {})[sid] = s
    return _done(new, "silence", f"{scope} {value}", who, f"{sid} until {to_rfc3339(s['until'])}")


def expire(doc: ControlDoc | None, sid: str, who: Stamp) -> tuple[ControlDoc, Change]:
    """End a silence now (it stays listed for a week)."""
    new = _new(doc)
    s = (new.get("silences") or {}).get(sid)
    if s is None or not active(s, who["at"]):
        raise ControlError(f"no active silence {sid!r} (pitstop silence --list)")
    s["ended"] = who
    return _done(new, "expire", f"{s['scope']} {s['value']}", who, sid)


def _tidy(doc: ControlDoc) -> ControlDoc:
    """Clusters with nothing of their own left are dropped."""
    doc["clusters"] = {k: c for k, c in (doc.get("clusters") or {}).items() if c}
    return doc


def changes_lines(changes: list[Change]) -> list[str]:
    """The audit records, one line each, oldest first."""
    return [
        f"{to_rfc3339(c['at'])}  {c['verb']:<7} {c['scope']:<24} by {c['by']}: {c['reason']}"
        + (f" ({c['detail']})" if c["detail"] else "")
        for c in sorted(changes, key=lambda c: c["version"])
    ]


def as_changes(rows: list[Mapping[str, object]]) -> list[Change]:
    """Audit records as read back (the store's documents, written from :class:`Change`)."""
    return [cast(Change, dict(r)) for r in rows]


class ControlStore(Protocol):
    """Where the control document and its audit records live: a small port of its own beside the
    incident store's (adapters/firestore_control.py, adapters/memory_control.py)."""

    def read_control(self) -> object:
        """The stored document as read, unchecked (None: there is none yet); one read."""
        ...

    def change_control(self, change: Callable[[ControlDoc], tuple[ControlDoc, Change]]) -> Change:
        """Read the document (checked: :meth:`Control.of`), apply ``change``, and write the result
        and its audit record in one transaction; the record."""
        ...

    def control_changes(self, since: float) -> list[Change]:
        """The audit records of changes made at ``since`` or later, oldest first."""
        ...
