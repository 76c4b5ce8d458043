"""Managed Service for Prometheus' answers as Pitstop reads them: the query, the response, the reduction.

A degraded GKE node's peers are read through the Prometheus-compatible HTTP API of Managed
Service for Prometheus (``GET https://monitoring.googleapis.com/v1/projects/P/location/global/
prometheus/api/v1/query_range``, https://cloud.google.com/monitoring/api/ref_v3/rest/v1/
projects.location.prometheus.api.v1/query_range), which answers as the open-source Prometheus API
does (https://prometheus.io/docs/prometheus/latest/querying/api/#expression-query-result-formats)::

    {"status": "success", "data": {"resultType": "matrix",
      "result": [{"metric": {"__name__": "DCGM_FI_DEV_SM_CLOCK", "Hostname": "n1", "gpu": "0"},
                  "values": [[1764111600, "1980"], [1764111660, "1410"]]}]}}
    {"status": "error", "errorType": "bad_data", "error": "..."}  (HTTP 400, 422, 503, ...)

What is decided here, without I/O: the selector for a set of nodes (the policy's query with the
nodes' names as one anchored regex), whether an answer is well formed (anything else is a
:class:`PromError`, so the comparison goes on the alert alone rather than on a guess), and how a
window of samples reduces to one value per node (core/degraded.PromRule), which core/degraded.compare
then holds against the line.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pitstop.core.degraded import PromRule

NODES = "{nodes}"
_NODE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", re.ASCII)  # a Kubernetes node name
MAX_POINTS = 11_000  # Prometheus refuses a range query of more points per series than this
RESULT_TYPES = ("matrix", "vector")


class PromError(ValueError):
    """An answer that is not a Prometheus query result, or one that says it failed."""


@dataclass(frozen=True)
class Series:
    labels: Mapping[str, str]
    samples: tuple[tuple[float, float], ...]  # (unix seconds, value), in time order


def selector(rule: PromRule, nodes: Sequence[str]) -> str:
    """The rule's query for these nodes. Names that are not Kubernetes node names are refused:
    nothing from an alert reaches a query unvalidated."""
    bad = [n for n in nodes if not _NODE.fullmatch(n)]
    if bad or not nodes:
        raise PromError(f"not node names: {bad[:3]}" if bad else "no node to query")
    alternation = "|".join(re.escape(n) for n in nodes)  # RE2, fully anchored by PromQL
    return rule.query.replace(NODES, alternation.replace("\\", "\\\\"))


def window(rule: PromRule, now: float) -> dict[str, str]:
    """query_range's start, end and step for the rule's window ending ``now``."""
    step = max(1.0, rule.step_s, rule.hold_s / (MAX_POINTS - 1))
    return {"start": f"{now - rule.hold_s:.3f}", "end": f"{now:.3f}", "step": f"{step:g}"}


def parse(doc: Any) -> list[Series]:
    """A query answer's series; an error answer or a malformed one raises PromError."""
    if not isinstance(doc, Mapping):
        raise PromError("the answer is not a JSON object")
    if doc.get("status") != "success":
        raise PromError(f"{doc.get('errorType') or 'error'}: {str(doc.get('error') or '')[:200]}")
    data = doc.get("data")
    kind = data.get("resultType") if isinstance(data, Mapping) else None
    result = data.get("result") if isinstance(data, Mapping) else None
    if kind not in RESULT_TYPES or not isinstance(result, list):
        raise PromError(f"not a vector or matrix result (resultType {kind!r})")
    return [_series(item, kind) for item in result]


def _series(item: Any, kind: str) -> Series:
    labels = item.get("metric") if isinstance(item, Mapping) else None
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise PromError("a series without its metric labels")
    raw = item.get("values") if kind == "matrix" else [item.get("value")]
    if not isinstance(raw, list):
        raise PromError("a series without its samples")
    return Series(dict(labels), tuple(_sample(p) for p in raw))


def _sample(p: Any) -> tuple[float, float]:
    """One ``[unix seconds, "value"]`` pair: the value is a string (NaN and ±Inf spelled out)."""
    if not (isinstance(p, list) and len(p) == 2 and isinstance(p[1], str)):
        raise PromError(f'a sample is [time, "value"], not {str(p)[:40]}')
    t, v = p
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise PromError("a sample's time is not a number")
    try:
        return float(t), float(v)
    except ValueError:
        raise PromError(f"a sample's value {v[:20]!r} is not a number") from None


def reduce_series(rule: PromRule, samples: Sequence[tuple[float, float]]) -> float | None:
    """One series' window as one number (None: too few samples to say)."""
    vals = [v for _, v in samples if not math.isnan(v)]
    if rule.reduce == "bits_share":
        if not vals:
            return None
        return sum(1 for v in vals if int(v) & rule.mask) / len(vals)
    if len(vals) < 2:
        return None
    rise = sum(b - a if b >= a else b for a, b in itertools.pairwise(vals))  # a reset: from 0
    if rule.reduce == "increase":
        return rise
    span = samples[-1][0] - samples[0][0]
    return rise / span * rule.per_s if span > 0 else None


def node_values(rule: PromRule, series: Sequence[Series], nodes: Sequence[str]) -> dict[str, float | None]:
    """Each node's worst series (its worst GPU), by the rule's node label; None: no series for it."""
    out: dict[str, float | None] = dict.fromkeys(nodes)
    for s in series:
        node = s.labels.get(rule.node_label)
        if node not in out:
            continue  # a series for a node not asked about (the selector is a regex)
        v = reduce_series(rule, s.samples)
        if v is not None:
            prev = out[node]
            out[node] = v if prev is None else max(prev, v)
    return out


__all__ = ["MAX_POINTS", "PromError", "Series", "node_values", "parse", "reduce_series", "selector", "window"]
