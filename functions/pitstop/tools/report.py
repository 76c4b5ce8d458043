"""`pitstop report`: one self-contained HTML page about what Pitstop did over a period.

The incidents come from the incident store (Firestore, as `pitstop incidents` reads it) or from
`pitstop replay` of a log export (what the policy would have done). tools/report_model.py turns
them into figures; this module lays those out as one file: inline CSS, charts drawn by matplotlib
as SVG embedded in ``data:`` URIs, tables that sort on a click through a short inline script. It
loads nothing from the network (its Content-Security-Policy forbids it), so it opens from a laptop
or a Cloud Storage link alike. Every string that came from an incident is HTML-escaped.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import html
import io
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitstop.core.control import Control, ControlStore, changes_lines
from pitstop.core.policy import Policy
from pitstop.core.timeline import iso
from pitstop.tools import common
from pitstop.tools import report_checkpoints as rc
from pitstop.tools import report_model as rm

DETAIL_LIMIT = 300  # incidents whose full timeline is written out (the newest); the table has all
TOP = 15  # bars in the Xid and node charts


class Raw(str):
    """HTML built in this module: already escaped, inserted as is."""


@dataclass(frozen=True)
class Sorted:
    """A cell shown one way and sorted by a number (None sorts last)."""

    shown: str
    key: float | None


Cell = str | int | float | Raw | Sorted | None


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def secs(s: float | None) -> str:
    """A duration for people: 0.42 s, 12.3 s, 4.5 min, 3.2 h, 2.1 d."""
    if s is None:
        return "-"
    for limit, div, unit in ((1, 1, "s"), (120, 1, "s"), (7200, 60, "min"), (172800, 3600, "h")):
        if abs(s) < limit:
            return f"{s / div:.2f} {unit}" if unit == "s" and abs(s) < 1 else f"{s / div:.1f} {unit}"
    return f"{s / 86400:.1f} d"


def when(ts: float | None) -> Sorted:
    text = iso(ts) or "-"
    return Sorted(text.replace("T", " ").replace("Z", ""), ts)


def dur(s: float | None) -> Sorted:
    return Sorted(secs(s), s)


def _td(c: Cell) -> str:
    if isinstance(c, Raw):
        return f"<td>{c}</td>"
    if isinstance(c, Sorted):
        key = "" if c.key is None else repr(float(c.key))
        return f'<td data-sort="{key}">{esc(c.shown)}</td>'
    if c is None:
        return '<td data-sort="">-</td>'
    if isinstance(c, int | float) and not isinstance(c, bool):
        return f'<td class="n" data-sort="{c}">{esc(c)}</td>'
    return f"<td>{esc(c)}</td>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], cls: str = "sortable") -> str:
    """A table whose cells are escaped here (Raw cells excepted); sortable by a click on a header."""
    head = "".join(f'<th scope="col" title="sort">{esc(h)}</th>' for h in headers)
    body = "\n".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>'


def counts(d: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"


def link(iid: str) -> Raw:
    return Raw(f'<a href="#inc-{esc(iid)}">{esc(iid)}</a>')


# -- charts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chart:
    title: str
    uri: str  # data:image/svg+xml;base64,...


def _days(rep: rm.Report) -> list[str]:
    """The days to chart: every day of a period up to three months, else the days with incidents."""
    seen = sorted(set(rep.per_day_kind))
    if not seen or "unknown" in seen:
        return seen
    first = rep.start if rep.start is not None else min(r.detected or 0.0 for r in rep.incidents)
    last = rep.end if rep.end is not None else max(r.detected or 0.0 for r in rep.incidents)
    if last - first > 92 * 86400:
        return seen
    n = int((last - first) // 86400) + 2
    days = sorted({rm.day(first + i * 86400) for i in range(n)} | set(seen))
    return [d for d in days if d <= rm.day(last)]


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue().encode()).decode()


def _stacked(plt: Any, title: str, days: list[str], per_day: Mapping[str, Mapping[str, int]]) -> Chart:
    fig, ax = plt.subplots(figsize=(9, 3.4))
    totals: dict[str, int] = {}
    for d in per_day.values():
        for k, v in d.items():
            totals[k] = totals.get(k, 0) + v
    bottom = [0] * len(days)
    for series in sorted(totals, key=lambda k: (-totals[k], k)):
        vals = [per_day.get(d, {}).get(series, 0) for d in days]
        ax.bar(range(len(days)), vals, bottom=bottom, label=series)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(days)), [d[5:] for d in days], rotation=45 if len(days) > 10 else 0)
    ax.set_ylabel("incidents")
    ax.set_title(title)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return Chart(title, _svg(fig))


def _times_chart(plt: Any, rep: rm.Report) -> Chart | None:
    shown = [(label, rep.times[k]) for k, label, _ in rm.MEASURES if rep.times[k].n]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(shown) + 1.2))
    data = [[max(v, 0.01) for v in s.values] for _, s in shown]
    import matplotlib

    flat = {"orientation": "horizontal"} if _version(matplotlib.__version__) >= (3, 10) else {"vert": False}
    ax.boxplot(data, whis=(5, 95), showfliers=True, **flat)
    ax.set_yticks(range(1, len(shown) + 1), [f"{label} (n={s.n})" for label, s in shown])
    ax.invert_yaxis()
    top = max(max(d) for d in data)
    if top / min(min(d) for d in data) > 50:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_xscale("log")  # seconds to hours on one axis; ticks in people's units, not TeX
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: secs(v)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("time after the fault was logged (whiskers: 5th-95th percentile)")
    ax.set_title(f"Time from detection to each milestone (longest {secs(top)})")
    ax.grid(axis="x", alpha=0.3)
    return Chart("Time from detection to each milestone", _svg(fig))


def _version(text: str) -> tuple[int, int]:
    major, minor = [*text.split("."), "0"][:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def _bars(plt: Any, title: str, labels: list[str], values: list[int], colors: list[str]) -> Chart:
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(labels) + 1.2))
    ax.barh(range(len(labels)), values, color=colors)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return Chart(title, _svg(fig))


def charts(rep: rm.Report) -> list[Chart] | None:
    """The page's charts, or None when matplotlib is not installed (the tables still have it all)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    out: list[Chart] = []
    # text as text (small files), the same ids on every run, node names never read as TeX
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "report", "text.parse_math": False}):
        if rep.incidents:
            days = _days(rep)
            out.append(_stacked(plt, "Incidents per day by kind", days, rep.per_day_kind))
            out.append(_stacked(plt, "Incidents per day by action", days, rep.per_day_action))
        t = _times_chart(plt, rep)
        out += [t] if t else []
        if any(x.incidents for x in rep.xids):
            top = [x for x in rep.xids if x.incidents][:TOP]
            labels = [f"Xid {x.xid} {x.name}" for x in top]
            out.append(
                _bars(
                    plt, "Top Xids (incidents opened)", labels, [x.incidents for x in top], ["C0"] * len(top)
                )
            )
        acted = [n for n in rep.nodes if n.remediations][:TOP]
        if acted:
            colors = ["C3" if n.lemon or n.escalated_as_lemon else "C0" for n in acted]
            title = "Nodes by remediations (red: lemon candidates)"
            out.append(_bars(plt, title, [n.node for n in acted], [n.remediations for n in acted], colors))
        plt.close("all")
    return out


# -- the page ----------------------------------------------------------------------------------

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1200px;
 padding:1.5em;color:#1d232a;background:#fff}
h1{font-size:1.6em;margin:0 0 .2em}h2{font-size:1.2em;margin:2em 0 .5em;border-bottom:1px solid #d8dde3}
.meta,.note{color:#59636e}.note{font-size:.92em}
.cards{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.card{border:1px solid #d8dde3;border-radius:6px;padding:.6em .9em;min-width:8.5em}
.card b{display:block;font-size:1.5em}.card.warn b{color:#b42318}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.92em}
th,td{border-bottom:1px solid #e6e9ed;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f5f7;cursor:pointer;user-select:none;white-space:nowrap}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.chart{max-width:100%;height:auto;display:block;margin:.5em 0}
.wide{overflow-x:auto}.wide td{white-space:nowrap}
.flex{display:flex;flex-wrap:wrap;gap:2em}
details{border-left:3px solid #d8dde3;padding:.1em .8em;margin:.4em 0}
details summary{cursor:pointer}ol.tl{margin:.3em 0}code{font-size:.95em}
.bad{color:#b42318;font-weight:600}
@media print{th{cursor:auto}details{break-inside:avoid}}
"""

SCRIPT = """
(function () {
  function key(td) {
    var v = td.getAttribute("data-sort");
    if (v === null) { v = td.textContent.trim(); }
    if (v === "" || v === "-") { return null; }
    var n = Number(v);
    return isNaN(n) ? v.toLowerCase() : n;
  }
  function cmp(a, b) {
    if (a === b) { return 0; }
    if (typeof a === typeof b) { return a < b ? -1 : 1; }
    return typeof a === "number" ? -1 : 1;
  }
  function sort(th) {
    var table = th.closest("table"), body = table.tBodies[0], col = th.cellIndex;
    var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    table.querySelectorAll("thead th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r1, r2) {
      var a = key(r1.cells[col]), b = key(r2.cells[col]);
      if (a === null || b === null) { return (a === null) - (b === null); }
      return dir * cmp(a, b);
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable thead th").forEach(function (th) {
    th.tabIndex = 0;
    th.addEventListener("click", function () { sort(th); });
    th.addEventListener("keydown", function (e) { if (e.key === "Enter") { sort(th); } });
  });
})();
"""


def _csp() -> str:
    """Nothing from the network; only this page's own script runs (an injected one would not)."""
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    return (
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'"
    )


def _period(rep: rm.Report) -> str:
    detected = [r.detected for r in rep.incidents if r.detected is not None]
    start = rep.start if rep.start is not None else min(detected, default=None)
    end = rep.end if rep.end is not None else max(detected, default=None)
    return f"{when(start).shown} to {when(end).shown} UTC"


def _card(label: str, value: Any, warn: bool = False) -> str:
    return f'<div class="card{" warn" if warn and value else ""}"><b>{esc(value)}</b>{esc(label)}</div>'


def _summary(rep: rm.Report) -> str:
    o = rep.by_outcome
    t = rep.times
    cards = [
        _card("incidents", len(rep.incidents)),
        _card("remediated", o.get("remediated", 0)),
        _card("would act (observe)", o.get("would act", 0)) if o.get("would act") else "",
        _card("need a person", len(rep.needs_person), warn=True),
        _card("held now", o.get("held", 0), warn=True),
        _card("failed", o.get("failed", 0), warn=True),
        _card("median time to fence", secs(t["fenced"].p50)),
        _card("median time to remediate", secs(t["resolved"].p50)),
        _card("lemon candidates", sum(1 for n in rep.nodes if n.lemon or n.escalated_as_lemon), warn=True),
    ]
    return '<div class="cards">' + "".join(cards) + "</div>"


def _breakdown(rep: rm.Report) -> str:
    def small(title: str, d: Mapping[str, int]) -> str:
        return f"<div>{table([title, 'incidents'], list(d.items()))}</div>"

    return (
        '<div class="flex">'
        + small("kind", rep.by_kind)
        + small("action", rep.by_action)
        + small("outcome", rep.by_outcome)
        + "</div>"
    )


def _charts_html(found: list[Chart] | None, which: Sequence[str]) -> str:
    if found is None:
        return '<p class="note">Charts need matplotlib (pip install matplotlib); the tables have it all.</p>'
    return "".join(
        f'<img class="chart" alt="{esc(c.title)}" title="{esc(c.title)}" src="{c.uri}">'
        for c in found
        if any(c.title.startswith(w) for w in which)
    )


def _times_table(rep: rm.Report) -> str:
    rows: list[list[Cell]] = [
        [label, s.n, dur(s.mean), dur(s.p50), dur(s.p95), dur(s.max)]
        for k, label, _ in rm.MEASURES
        for s in [rep.times[k]]
    ]
    return table(["seconds from detection", "incidents", "mean", "median", "p95", "max"], rows) + (
        '<p class="note">Measured from the fault\'s own log timestamp. Time to remediate counts the '
        "incidents Pitstop remediated (not record-only ones, which end with their burst, nor those "
        "a person closed).</p>"
    )


def _hold_text(h: rm.Doc) -> str:
    since, until = h.get("since"), h.get("until")
    span = (
        f" for {secs(float(until) - float(since))}"
        if isinstance(until, int | float) and isinstance(since, int | float) and since
        else ""
    )
    by = f", let go by {h['by']}" if h.get("by") else ""
    return f"{h.get('reason') or h.get('scope') or 'held'}{span}{by}"


def _person_why(r: rm.IncidentRow) -> str:
    if r.outcome == "failed":
        f = r.failure or {}
        return f"failed at {f.get('stage', '?')}: {f.get('error', '')}"
    if r.outcome == "closed by a person":
        c = r.closure or {}
        return f"closed by {c.get('by', '?')} from {c.get('from_state', '?')}" + (
            " (unfenced)" if c.get("unfence") else ""
        )
    return "held: " + (_hold_text(r.holds[-1]) if r.holds else "")


def _needs_person(rep: rm.Report) -> str:
    rows: list[list[Cell]] = [
        [link(r.id), when(r.detected), r.node, r.action, r.outcome, _person_why(r)] for r in rep.needs_person
    ]
    if not rows:
        return "<p>None: every incident ended without a person.</p>"
    return table(["incident", "detected (UTC)", "node", "action", "outcome", "why"], rows)


def _control(rep: rm.Report) -> str:
    """What `pitstop pause`, `mode` and `silence` put in force, and every change of the period."""
    if not (rep.control or rep.control_changes):
        return ""
    now = "".join(f"<li>{esc(x)}</li>" for x in rep.control) or "<li>nothing: the policy as deployed</li>"
    changes = "".join(f"<li>{esc(x)}</li>" for x in rep.control_changes) or "<li>none</li>"
    return f"<p>In force now:</p><ul>{now}</ul><p>Changes in the period (who, why):</p><ul>{changes}</ul>"


def _holds(rep: rm.Report) -> str:
    if not rep.holds:
        return "<p>No incident was held.</p>"
    rows: list[list[Cell]] = [
        [
            h.what,
            "budget" if h.budget else "other",
            h.incidents,
            h.held_now,
            dur(h.held_s),
            counts(h.released_by),
        ]
        for h in rep.holds
    ]
    return table(["held by", "type", "incidents", "held now", "time held (ended holds)", "let go by"], rows)


def _nodes(rep: rm.Report) -> str:
    if not rep.nodes:
        return "<p>No incidents.</p>"
    rule = rep.lemon_rule
    rows: list[list[Cell]] = [
        [
            n.node,
            n.zone,
            n.cluster,
            n.incidents,
            n.remediations,
            n.node_actions,
            counts(n.actions),
            when(n.last_detected),
            Raw('<span class="bad">yes</span>') if n.lemon or n.escalated_as_lemon else "",
        ]
        for n in rep.nodes
    ]
    headers = [
        "node",
        "zone",
        "cluster",
        "incidents",
        "remediations",
        "node actions",
        "actions",
        "last fault",
    ]
    return table([*headers, "lemon?"], rows) + (
        f'<p class="note">Lemon candidate: {esc(rule["remediations"])} or more node actions within '
        f"{esc(rule['window_d'])} days (the policy's lemon rule), or an action the engine raised "
        "because of the host's history.</p>"
    )


def _xids(rep: rm.Report) -> str:
    if not rep.xids:
        return "<p>No Xid errors.</p>"
    rows: list[list[Cell]] = [
        [x.xid, x.name, x.incidents, x.lines, x.nodes, counts(x.actions)] for x in rep.xids
    ]
    return table(["Xid", "name", "incidents opened", "lines counted", "nodes", "actions"], rows)


def _validation(rep: rm.Report) -> str:
    found = [(r, v) for r in rep.incidents for v in r.validation]
    if not found:
        return "<p>No validation results on these incidents.</p>"
    rows: list[list[Cell]] = [
        [
            link(r.id),
            r.node,
            str(v.get("verdict") or ""),
            "yes" if v.get("passed") else "no",
            bw if isinstance(bw := v.get("busbw_gbps"), int | float) else None,
            th if isinstance(th := v.get("threshold_gbps"), int | float) else None,
            str(v.get("next") or ""),
            str(v.get("why") or ""),
        ]
        for r, v in found
    ]
    head = f"<p>Verdicts: {esc(counts(rep.validation))}</p>"
    return head + table(
        ["incident", "node", "verdict", "passed", "busbw GB/s", "threshold GB/s", "then", "why"], rows
    )


def _share(g: float | None) -> Sorted:
    return Sorted("-" if g is None else f"{100 * g:.1f} %", g)


def _checkpoints(rep: rm.Report) -> str:
    """Each job's checkpoint interval beside the goodput-optimal one (tools/report_checkpoints.py)."""
    a = rep.checkpoints
    if a is None:
        why = rep.checkpoints_note or "not read (a replay has no checkpoint series)"
        return f"<p>No checkpoint advice: {esc(why)}.</p>"
    r = a.rate
    fleet = f"{a.fleet_nodes} nodes" + (
        "" if a.fleet_nodes_given else " seen (--fleet-nodes: the fleet's size)"
    )
    rate = (
        f"DEFAULT {r.per_node_hour * 24000:.2f} interruptions per 1,000 node-days (the policy's: no "
        f"interruption in the period on {fleet})"
        if r.default
        else f"{r.interruptions} interruptions over {r.node_hours:,.0f} node-hours of {fleet}: one per "
        f"{secs(3600 / r.per_node_hour)} of a node"
    )
    how = "the period's median time to resume" if a.restart_measured else "the policy's moves.restart_s"
    head = f"<p>Failure rate: {esc(rate)}. Restart cost: {esc(secs(a.restart_s))} ({esc(how)}).</p>"
    if not a.jobs:
        head += "<p>No job wrote its checkpoint series in the period (docs/telemetry.md).</p>"
    rows: list[list[Cell]] = [
        [
            j.cluster,
            j.job,
            j.nodes,
            j.checkpoints,
            dur(j.cost_s),
            dur(j.advice.mtbf_s),
            dur(j.advice.actual_s),
            dur(j.advice.advised_s),
            dur(j.advice.young_s),
            _share(j.advice.goodput_actual),
            _share(j.advice.goodput_advised),
            Sorted("-" if j.gpu_hours_gained is None else f"{j.gpu_hours_gained:,.1f}", j.gpu_hours_gained),
        ]
        for j in a.jobs
    ]
    headers = ["cluster", "job", "nodes", "checkpoints", "checkpoint cost", "job MTBF", "interval now",
               "advised", "Young", "goodput now", "goodput advised", "GPU-h gained"]  # fmt: skip
    skipped = "".join(f"<li>{esc(x)}</li>" for x in a.skipped)
    return (
        head
        + (table(headers, rows) if rows else "")
        + (f"<p>Series without advice:</p><ul>{skipped}</ul>" if skipped else "")
        + '<p class="note">Interval: work between two checkpoints (the median time between their ends, '
        "less the checkpoint cost). Advised: the optimum of Daly's model (FGCS 22(3), 2006), which his "
        "higher-order formula and Young's sqrt(2 x cost x MTBF) (CACM 17(9), 1974) approximate; job "
        "MTBF = the node MTBF / its nodes. GPU-h gained: over the span of its series in the period.</p>"
    )


def _incidents(rep: rm.Report) -> str:
    keys = [k for k, _, _ in rm.MEASURES]
    rows: list[list[Cell]] = [
        [
            link(r.id),
            when(r.detected),
            r.node,
            r.cluster,
            r.kind,
            r.xid,
            r.action,
            r.outcome,
            r.events,
            *(dur(r.offsets.get(k)) for k in keys),
        ]
        for r in rep.incidents
    ]
    labels = [short for _, _, short in rm.MEASURES]
    head = ["incident", "detected (UTC)", "node", "cluster", "kind", "Xid", "action", "outcome", "lines"]
    return f'<div class="wide">{table(head + labels, rows)}</div>'


def _detail(r: rm.IncidentRow) -> str:
    start = r.timeline.get("detected")
    steps = "".join(
        f"<li>{esc(k)} {esc(when(t).shown)}"
        + ("" if k == "detected" or start is None else f" (+{esc(secs(t - start))})")
        + "</li>"
        for k, t in sorted(r.timeline.items(), key=lambda kv: kv[1])
    )
    facts = [f"<p>{esc(r.reason)}</p>"] if r.reason else []
    facts += [
        f"<p>escalated {esc(e.get('from'))} to {esc(e.get('to'))}: {esc('; '.join(map(str, why)))}</p>"
        for e in r.escalations
        for why in [rm.words(e.get("why"))]
    ]
    facts += [f"<p>held: {esc(_hold_text(h))}</p>" for h in r.holds]
    if r.failure or r.closure:
        facts.append(f"<p>{esc(_person_why(r))}</p>")
    if r.rejected:
        facts.append(f"<p>rejected: {esc(r.rejected.get('why'))}</p>")
    if r.diagnosis:
        d = r.diagnosis
        found = "confirmed a hardware fault" if d.get("confirmed") else "did not confirm a hardware fault"
        facts.append(f"<p>diagnosis {esc(found)}: {esc(d.get('why'))}</p>")
    facts += [f"<p>validation: {esc(v.get('verdict'))} - {esc(v.get('why'))}</p>" for v in r.validation]
    summary = (
        f"{r.id} · {r.node} · {r.kind}{'' if r.xid is None else f' Xid {r.xid}'} · {r.action} · {r.outcome}"
    )
    return (
        f'<details id="inc-{esc(r.id)}"><summary>{esc(summary)}</summary>'
        f'<ol class="tl">{steps}</ol>{"".join(facts)}</details>'
    )


def _details(rep: rm.Report) -> str:
    shown = rep.incidents[-DETAIL_LIMIT:]
    more = len(rep.incidents) - len(shown)
    note = f'<p class="note">The newest {len(shown)} of {len(rep.incidents)}.</p>' if more else ""
    return note + "\n".join(_detail(r) for r in reversed(shown))


def render(rep: rm.Report, found: list[Chart] | None) -> str:
    """The whole page: one HTML document, nothing to fetch."""
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in rep.notes)
    sections = [
        (
            "Incidents by kind, action and outcome",
            _breakdown(rep) + _charts_html(found, ["Incidents per day"]),
        ),
        (
            "Times to detect, fence, act, resume and remediate",
            _charts_html(found, ["Time from"]) + _times_table(rep),
        ),
        ("Incidents that needed a person", _needs_person(rep)),
        *([("Runtime control: pauses, cluster modes, silences", _control(rep))] if _control(rep) else []),
        ("Budgets and other holds", _holds(rep)),
        ("Nodes by remediations (lemon candidates)", _charts_html(found, ["Nodes by"]) + _nodes(rep)),
        ("Top Xids", _charts_html(found, ["Top Xids"]) + _xids(rep)),
        ("Post-repair validation", _validation(rep)),
        ("Checkpoint advice: each job's interval and the goodput-optimal one", _checkpoints(rep)),
        ("Every incident (seconds after detection; click a header to sort)", _incidents(rep)),
        ("Incident timelines", _details(rep)),
    ]
    body = "\n".join(f"<h2>{esc(title)}</h2>\n{content}" for title, content in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_csp()}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Pitstop report: {esc(_period(rep))}</title>
<style>{STYLE}</style></head>
<body>
<h1>Pitstop report</h1>
<p class="meta">{esc(rep.source)}<br>Incidents detected {esc(_period(rep))}.
Generated {esc(when(time.time()).shown)} UTC.</p>
{notes}
{_summary(rep)}
{body}
<script>{SCRIPT}</script>
</body></html>
"""


# -- the command -------------------------------------------------------------------------------


def from_replay(path: str, policy: Policy) -> rm.Report:
    """Replay a log export through the real classifier and engine (observe mode) and report on it."""
    from pitstop.tools import replay as replay_mod

    replayed = replay_mod.replay(replay_mod.read_jsonl(path), policy)
    notes = [
        f"{replayed['entries']} log entries replayed ({counts(replayed['by_kind'])}).",
        "A replay runs in observe mode: nothing was done, so only what would have happened is known; "
        "times after detection (fence, act, resume) are not measured from logs.",
    ]
    source = f"Replay of {path} through the classifier and incident engine (pitstop replay)"
    return rm.build(
        rm.incidents_from_replay(replayed), policy, source=source, start=None, end=None, notes=notes
    )


def from_store(
    store: Any,
    policy: Policy,
    since_s: float,
    now: float,
    control: ControlStore | None = None,
    series: SeriesReader | None = None,
    fleet_nodes: int | None = None,
) -> rm.Report:
    """The incident store's incidents detected in the last ``since_s`` seconds (and the runtime
    control's changes of the period, when ``control`` is given; each job's checkpoint advice, when
    ``series`` reads the jobs' checkpoint series)."""
    where = f"Firestore project {store.db.project}, collection {store.collections.incidents.id}"
    source = f"Incident store: {where}"
    lines = Control.of(control.read_control()).lines(now) if control is not None else []
    changes = changes_lines(control.control_changes(now - since_s)) if control is not None else []
    rep = rm.build(store.query(), policy, source=source, start=now - since_s, end=now, control=lines,
                   control_changes=changes)  # fmt: skip
    return with_checkpoints(rep, policy, series, fleet_nodes) if series is not None else rep


# (start, end) epoch seconds -> every job's checkpoint series written then (Cloud Monitoring)
SeriesReader = Callable[[float, float], Iterable[rc.Series]]


def with_checkpoints(
    rep: rm.Report, policy: Policy, series: SeriesReader, fleet_nodes: int | None
) -> rm.Report:
    """The report with each job's checkpoint advice over its period (or why there is none)."""
    start = (
        rep.start if rep.start is not None else min((r.detected or 0.0 for r in rep.incidents), default=0.0)
    )
    end = rep.end if rep.end is not None else start
    try:
        got = list(series(start, end))
    except Exception as exc:  # the page still has everything else
        return dataclasses.replace(
            rep, checkpoints_note=f"checkpoint series unreadable: {type(exc).__name__}: {str(exc)[:200]}"
        )
    advice = rc.build(
        got,
        (r.outcome for r in rep.incidents),
        rep.times["job_running"].values,
        policy,
        (end - start) / 3600,
        fleet_nodes=fleet_nodes,
        nodes_seen=len({r.node for r in rep.incidents}),
    )
    return dataclasses.replace(rep, checkpoints=advice)


def readiness(store: Any, control: ControlStore, policy: Policy, args: argparse.Namespace, now: float) -> int:
    """`--readiness`: what enforce would have done over the last days, and the criteria, checked."""
    from pitstop.tools import readiness as rd

    pol = policy.with_control(Control.of(control.read_control()))
    days = float(args.days)
    unsent: dict[str, int] = {}
    for e in store.outbox.unsent(now - rd.UNSENT_AFTER_S):
        if float(e.get("created_at") or now) <= now - rd.UNSENT_AFTER_S:
            cluster = str((e["notification"].get("incident") or {}).get("cluster") or rd.NO_CLUSTER)
            unsent[cluster] = unsent.get(cluster, 0) + 1
    changes = changes_lines(control.control_changes(now - days * 86400))
    got = rd.build(store.query(), pol, now, days, unsent=unsent, changes=changes, only=args.cluster,
                   gpus=args.gpus_per_node)  # fmt: skip
    if args.json:
        print(json.dumps(rd.to_json(got), indent=2))
    else:
        print(rd.render(got))
    return 0 if got.ready else 1


def _series(store: Any) -> SeriesReader:
    """The jobs' checkpoint series of the store's project, read from Cloud Monitoring."""
    import os

    from pitstop.adapters.monitoring import TelemetryReader

    reader = TelemetryReader(os.environ.get("PITSTOP_MONITORING_ENDPOINT"))
    project = str(store.db.project)

    def read(start: float, end: float) -> list[rc.Series]:
        return [rc.Series(s["labels"], s["points"]) for s in reader.checkpoint_series(project, start, end)]

    return read


def cmd_report(args: argparse.Namespace) -> int:
    from pitstop.core import policy as policy_mod

    if args.readiness and args.from_replay:
        raise SystemExit("pitstop report: --readiness reads the incident store, not a replay")
    if args.from_replay:
        rep = from_replay(args.from_replay, policy_mod.load(common.policy_file(args.config, args.policy)))
    else:
        from pitstop.adapters.firestore_control import FirestoreControl

        store, pol = common.store_and_policy(args.project, args.config)
        control = FirestoreControl(store.db, pol.doc["store"]["collection_prefix"])
        if args.policy:
            pol = policy_mod.load(args.policy)
        if args.readiness:
            return readiness(store, control, pol, args, time.time())
        since_s = common.duration_s(args.since or "7d")
        rep = from_store(store, pol, since_s, time.time(), control, _series(store), args.fleet_nodes)
    page = render(rep, charts(rep))
    Path(args.out).write_text(page, encoding="utf-8")
    print(
        f"wrote {args.out}: {len(rep.incidents)} incidents ({counts(rep.by_outcome)}), "
        f"{len(rep.needs_person)} needed a person"
    )
    return 0


def add(sub: Any) -> None:
    """Add ``report`` to the pitstop CLI."""
    r = sub.add_parser("report", help="one self-contained HTML page on what Pitstop did (or would have done)")
    what = r.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", default=None, metavar="FILE.html", help="where to write the page")
    what.add_argument(
        "--readiness",
        action="store_true",
        help="instead of a page: what enforce would have done with each incident of the last --days "
        "(its evidence, jobs, GPU-hours at stake) and the README's criteria for enforce, checked; exit 1 "
        "when one fails",
    )
    r.add_argument("--days", type=float, default=14.0, help="--readiness: the period, in days (14)")
    r.add_argument("--cluster", default=None, help="--readiness: only this cluster")
    r.add_argument("--json", action="store_true", help="--readiness: JSON instead of text")
    r.add_argument(
        "--gpus-per-node", type=int, default=8, help="--readiness: GPUs of a node, for GPU-hours (8: A3)"
    )
    r.add_argument(
        "--fleet-nodes",
        type=int,
        default=None,
        help="the fleet's nodes, for the checkpoint advice's failure rate per node-hour (default: the "
        "nodes seen, which overstates the rate)",
    )
    src = r.add_mutually_exclusive_group()
    src.add_argument(
        "--since", default=None, help="incidents detected in this past period, e.g. 7d (default), 36h"
    )
    src.add_argument(
        "--from-replay", metavar="PATH", default=None, help="replay a JSON Lines log export instead"
    )
    r.add_argument(
        "--policy", default=None, help="policy.yaml (default: $PITSTOP_POLICY or shipped defaults)"
    )
    common.add_store_flags(r)
    r.set_defaults(func=cmd_report)
