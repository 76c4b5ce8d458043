"""What each incident did to the world, as the local stack saw it (`pitstop local status`).

- Compute: the fake Compute's ``effects`` (mutating requests that changed something; a repeat
  of a request id is not one) on the incident's VM, from the incident's creation until the
  next incident on that VM was created, so a late retry still counts against the incident that
  made it. ``set_labels`` is left out: a label is Pitstop's courtesy mark, not a remediation.
- Slurm: the agent's result documents (``<prefix>_slurm_results/<command id>``); a command id
  starts with ``<incident>-<step>``. Only commands that changed something count: a drain that
  set Pitstop's reason, a resume that resumed, a requeue that requeued, every signal.
- Kubernetes (a GKE stack): the fake API server's ``effects``. Pitstop's taint names its incident,
  so ``taint``/``untaint`` go to that incident; a cordon, an uncordon and an eviction (of a pod
  on the node) go by node and time, as Compute's do. A JobSet's restart is the controller's
  doing, not a request, so it is not counted here (the JobSet's ``status.restarts`` tells it).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

NOT_EFFECTS = frozenset({"set_labels"})
# Incidents, effects and the agent's results as stored or recorded: JSON read with checked accessors
Doc = Mapping[str, object]


def _num(doc: Doc, key: str) -> float:
    """A number field; 0 when absent, null or not a number."""
    v = doc.get(key)
    return float(v) if isinstance(v, int | float) else 0.0


def _instance(inc: Doc) -> str | None:
    """The VM an incident is about (None: a job's episode, which has no node of its own)."""
    node = inc.get("node")
    name = node.get("instance") if isinstance(node, Mapping) else None
    return str(name) if name else None


def _slurm_effect(doc: Doc) -> str | None:
    """The effect one finished agent command had, or None (a probe, a refusal, nothing changed)."""
    if doc.get("state", "done" if doc.get("ok") else "failed") != "done":
        return None
    op, res = doc.get("op"), doc.get("result") or {}
    if not isinstance(res, Mapping):
        return None
    if op == "drain" and res.get("reason") and not res.get("already_drained_by_other"):
        return "drain"
    if op == "resume" and res.get("resumed"):
        return "resume"
    if op == "requeue" and not res.get("already_pending"):
        return "requeue"
    if op == "signal":
        return "signal"
    return None


def by_incident(
    incidents: Iterable[Doc],
    compute_effects: Iterable[Doc],
    slurm_results: Mapping[str, Doc],
    kube_effects: Iterable[Doc] | None = None,
) -> dict[str, dict[str, dict[str, int]]]:
    """``{incident id: {"compute": {method: n}, "slurm": {op: n}[, "kube": {method: n}]}}``.

    ``slurm_results`` by document id; ``"kube"`` only when ``kube_effects`` is given (a GKE stack).
    """
    per_node: dict[str, list[Doc]] = defaultdict(list)
    for inc in incidents:
        if (vm := _instance(inc)) is not None:  # a job's episode (hang) has no node to attribute effects to
            per_node[vm].append(inc)
    out: dict[str, dict[str, dict[str, int]]] = {}
    effects = [e for e in compute_effects if e.get("method") not in NOT_EFFECTS]
    kube = None if kube_effects is None else list(kube_effects)
    for node, incs in per_node.items():
        incs.sort(key=lambda i: _num(i, "created_at"))
        for n, inc in enumerate(incs):
            start = _num(inc, "created_at")
            end = _num(incs[n + 1], "created_at") if n + 1 < len(incs) else float("inf")
            compute = Counter(
                str(e["method"]) for e in effects if node in _names(e) and start <= _num(e, "at") < end
            )
            prefix = f"{str(inc['id']).lower()}-"
            slurm = Counter(
                op
                for cid, doc in slurm_results.items()
                if cid.startswith(prefix) and (op := _slurm_effect(doc)) is not None
            )
            out[str(inc["id"])] = {"compute": dict(compute), "slurm": dict(slurm)}
            if kube is not None:
                out[str(inc["id"])]["kube"] = _kube_counts(kube, str(inc["id"]), node, start, end)
    return out


def _names(effect: Doc) -> list[object]:
    """The VMs a Compute effect acted on."""
    names = effect.get("instances")
    return names if isinstance(names, list) else []


def _kube_counts(effects: list[Doc], iid: str, node: str, start: float, end: float) -> dict[str, int]:
    """A taint by its value (the incident id); anything else by node and time."""

    def mine(e: Doc) -> bool:
        if e.get("method") in ("taint", "untaint"):
            return e.get("value") == iid
        return e.get("node") == node and start <= _num(e, "at") < end

    return dict(Counter(str(e["method"]) for e in effects if mine(e)))


def compact(effects: Mapping[str, Mapping[str, int]]) -> str:
    """``reset:1,drain:1,requeue:1`` (Compute, then Slurm, then Kubernetes), or ``-`` for none."""
    sides = ("compute", "slurm", "kube")
    parts = [f"{k}:{v}" for side in sides for k, v in (effects.get(side) or {}).items()]
    return ",".join(parts) or "-"
