"""Managed Service for Prometheus' query API on 127.0.0.1: dcgm-exporter's series from the GPU stand-ins.

Serves what adapters/prometheus.PromQLReader asks, in the real API's paths and answer shapes:
``GET /v1/projects/P/location/global/prometheus/api/v1/query`` (``query``, ``time``) and
``.../query_range`` (``query``, ``start``, ``end``, ``step``), answered as Prometheus' HTTP API
answers (https://prometheus.io/docs/prometheus/latest/querying/api/): ``{"status": "success",
"data": {"resultType": "vector"|"matrix", "result": [{"metric": {...}, "value"|"values": ...}]}}``
with ``[unix seconds, "value"]`` pairs, and errors as ``{"status": "error", "errorType":
"bad_data", "error": ...}`` with HTTP 400 in Prometheus' own words (web/api/v1/api.go: an
unparsable time, end before start, a non-positive step, more than 11,000 points per series).

Series: one per GPU (8 a node) of each dcgm-exporter metric below, labelled as dcgm-exporter
labels them (``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``) plus Managed Service for
Prometheus' target labels (``project_id``, ``location``, ``cluster``, ``namespace``, ``job``,
``instance``), for every node of the cluster. Values come from the fake Compute's GPU state file
(what the GPU stand-ins print): a straggler's throttle share as the clocks event reasons bitmap
(HW slowdown, SW and HW thermal slowdown 0x68, or SW power cap 0x4) on that share of the samples
and a lower SM clock, correctable ECC errors as a counter rising at ``sbe_rate`` an hour, a row
remap, NVLink CRC errors on a link that is down. The stand-in keeps no history: a window shows
the state now, held over the whole window (as the Cloud Monitoring stand-in answers timeSeries.list).

PromQL: only a vector selector (``name{label op "value", ...}``, ops ``= != =~ !~``, an optional
``[5m]`` range on an instant query) is evaluated; anything else is refused with ``bad_data``,
never guessed. ``POST /_admin/faults {"code": 503, "times": 1}`` makes the next answers fail.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import threading
import urllib.parse
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from pitstop.local.gpu_tools.state import NodeState, node_state
from pitstop.local.json_http import serve_json

# node -> its GPU state entry (gpu_tools/state.py check_entry), as the fake Compute keeps them
GpuState = Callable[[], Mapping[str, Mapping[str, object]]]
GPUS = 8
MAX_POINTS = 11_000
_PATH = re.compile(
    r"/v1/projects/([a-z][-a-z0-9]{4,28}[a-z0-9])/location/global/prometheus/api/v1/(query|query_range)"
)
_SELECTOR = re.compile(r"\s*([A-Za-z_:][A-Za-z0-9_:]*)?\s*(\{(.*)\})?\s*(\[([0-9]+)([smhd])\])?\s*", re.S)
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)', re.S)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# What the nvidia-smi stand-in shows active (gpu_tools/nvidia_smi.py), as DCGM's bitmap (NVML's bits):
# thermal = HW slowdown 0x8 | SW thermal 0x20 | HW thermal 0x40; power = SW power cap 0x4
THERMAL, POWER_CAP = 0x8 | 0x20 | 0x40, 0x4
SM_CLOCK_MHZ = 1980  # an H100 SXM's boost clock


class Series(TypedDict):
    """One series of a result: its labels, and its sample (a vector) or samples (a matrix)."""

    metric: dict[str, str]
    value: NotRequired[list[Any]]
    values: NotRequired[list[list[Any]]]


class QueryData(TypedDict):
    """``data`` of a query answer (the Prometheus HTTP API)."""

    resultType: str
    result: list[Series]


class BadDataError(ValueError):
    """What Prometheus answers with 400 and errorType bad_data."""


@dataclass
class FakePrometheus:
    """The query API over the GPU stand-ins' state (``gpu_state``) for ``nodes``."""

    project: str
    cluster: str
    location: str
    nodes: Sequence[str]
    gpu_state: GpuState = dict
    started: float = field(default_factory=lambda: dt.datetime.now(dt.UTC).timestamp())
    faults: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    queries: list[str] = field(default_factory=list)

    def dispatch(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(path)
        if method == "POST" and url.path == "/_admin/faults":
            return self._arm(body)
        m = _PATH.fullmatch(url.path)
        if m is None or method != "GET":
            return 404, {
                "error": {"code": 404, "message": f"{method} {url.path} is not served", "status": "NOT_FOUND"}
            }
        with self.lock:
            fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            return fault, {"status": "error", "errorType": "unavailable", "error": "injected fault"}
        params = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        try:
            return 200, {"status": "success", "data": self._evaluate(m.group(2), params)}
        except BadDataError as exc:
            return 400, {"status": "error", "errorType": "bad_data", "error": str(exc)}

    def _arm(self, body: bytes) -> tuple[int, Any]:
        doc = json.loads(body or b"{}")
        code, times = int(doc.get("code", 503)), int(doc.get("times", 1))
        with self.lock:
            self.faults[:] = [code] * times
        return 200, {"armed": times, "code": code}

    def _evaluate(self, kind: str, params: Mapping[str, str]) -> QueryData:
        query = params.get("query")
        if not query:
            raise BadDataError('invalid parameter "query": query must not be empty')
        self.queries.append(query)
        name, matchers, range_s = _selector(query)
        if kind == "query":
            at = (
                _time(params.get("time"), "time")
                if params.get("time")
                else dt.datetime.now(dt.UTC).timestamp()
            )
            if range_s is None:
                rows: list[Series] = [
                    {"metric": s, "value": _pair(at, self._value(s, 0, 1, at))}
                    for s in self._match(name, matchers)
                ]
                return {"resultType": "vector", "result": rows}
            times = [at - range_s + i * 15 for i in range(int(range_s // 15) + 1)]
        else:
            if range_s is not None:
                raise BadDataError(
                    f'invalid parameter "query": 1:{len(query)}: parse error: '
                    "ranges only allowed for vector selectors"
                )
            times = _range(params)
        rows = [
            {"metric": s, "values": [_pair(t, self._value(s, i, len(times), t)) for i, t in enumerate(times)]}
            for s in self._match(name, matchers)
        ]
        return {"resultType": "matrix", "result": rows}

    def _match(self, name: str | None, matchers: list[tuple[str, str, str]]) -> list[dict[str, str]]:
        wanted = [*(([("__name__", "=", name)]) if name else []), *matchers]
        return [s for s in self._series() if all(_holds(s.get(k, ""), op, v) for k, op, v in wanted)]

    def _series(self) -> list[dict[str, str]]:
        out = []
        for metric in METRICS:
            for node in self.nodes:
                for g in range(GPUS):
                    out.append({
                        "__name__": metric, "gpu": str(g), "device": f"nvidia{g}",
                        "UUID": f"GPU-{zlib.crc32(f'{node}/{g}'.encode()):08x}-0000-0000-0000-000000000000",
                        "modelName": "NVIDIA H100 80GB HBM3", "Hostname": node,
                        "project_id": self.project, "location": self.location, "cluster": self.cluster,
                        "namespace": "gke-managed-system", "job": "gke-managed-dcgm-exporter",
                        "instance": f"{node}:9400",
                    })  # fmt: skip
        return out

    def _value(self, s: Mapping[str, str], i: int, n: int, t: float) -> float:
        """Sample ``i`` of ``n`` at ``t``; counters count from a day before the stand-in started."""
        st = node_state(s["Hostname"], self.gpu_state().get(s["Hostname"]) or {})
        return METRICS[s["__name__"]](st, int(s["gpu"]), i, n, max(0.0, t - (self.started - 86400.0)))


def _throttled(st: NodeState, g: int, i: int, n: int) -> bool:
    """Whether sample ``i`` of ``n`` is held below its clocks: exactly the state's share of them."""
    share = st.throttle if st.throttle_gpu == g else 0.0
    return math.floor((i + 1) * share) > math.floor(i * share)


def _reasons(st: NodeState, g: int, i: int, n: int, age: float) -> float:
    if not _throttled(st, g, i, n):
        return 0.0
    return float(POWER_CAP if st.throttle_reason == "power" else THERMAL)


def _sm_clock(st: NodeState, g: int, i: int, n: int, age: float) -> float:
    return float(int(SM_CLOCK_MHZ * 0.6) if _throttled(st, g, i, n) else SM_CLOCK_MHZ)


def _sbe(st: NodeState, g: int, i: int, n: int, age: float) -> float:
    rate = st.sbe_rate if st.ecc_gpu == g else 0
    return float(math.floor(rate * age / 3600))


def _remapped(st: NodeState, g: int, i: int, n: int, age: float) -> float:
    return float(st.remap != "none" and st.remap_gpu == g)


def _remap_failure(st: NodeState, g: int, i: int, n: int, age: float) -> float:
    return float(st.remap == "failure" and st.remap_gpu == g)


def _nvlink_crc(st: NodeState, g: int, i: int, n: int, age: float) -> float:
    return float(math.floor(200 * age)) if g in st.nvlink_down else 0.0


def _zero(st: NodeState, g: int, i: int, n: int, age: float) -> float:
    return 0.0


METRICS: dict[str, Callable[[NodeState, int, int, int, float], float]] = {
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": _reasons,
    "DCGM_FI_DEV_SM_CLOCK": _sm_clock,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": _sbe,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": _remapped,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": _remap_failure,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": _nvlink_crc,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": _zero,
    "DCGM_FI_DEV_XID_ERRORS": _zero,
}


def _selector(query: str) -> tuple[str | None, list[tuple[str, str, str]], float | None]:
    """A vector selector's metric name, label matchers and optional range (seconds)."""
    m = _SELECTOR.fullmatch(query)
    if m is None or (m.group(1) is None and m.group(2) is None):
        raise BadDataError(
            f'invalid parameter "query": the stand-in evaluates vector selectors only, not {query[:80]!r}'
        )
    matchers: list[tuple[str, str, str]] = []
    body = (m.group(3) or "").strip()
    pos = 0
    while pos < len(body):
        mm = _MATCHER.match(body, pos)
        if mm is None:
            raise BadDataError(
                f'invalid parameter "query": 1:{pos + 1}: parse error: unexpected character in label matchers'
            )
        value = re.sub(r"\\(.)", lambda x: {"n": "\n", "t": "\t"}.get(x.group(1), x.group(1)), mm.group(3))
        if mm.group(2) in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise BadDataError(
                    f'invalid parameter "query": 1:{pos + 1}: parse error: error parsing regexp: {exc}'
                ) from None
        matchers.append((mm.group(1), mm.group(2), value))
        pos = mm.end()
    if m.group(1) is None and not any(op in ("=", "=~") and v for _, op, v in matchers):
        raise BadDataError(
            'invalid parameter "query": vector selector must contain at least one non-empty matcher'
        )
    rng = float(m.group(5)) * _UNITS[m.group(6)] if m.group(4) else None
    return m.group(1), matchers, rng


def _holds(have: str, op: str, want: str) -> bool:
    if op in ("=~", "!~"):
        hit = re.fullmatch(want, have) is not None  # PromQL regexes are fully anchored
        return hit if op == "=~" else not hit
    return (have == want) if op == "=" else (have != want)


def _time(raw: str | None, name: str) -> float:
    """Unix seconds (float) or RFC 3339, as Prometheus takes them."""
    try:
        return float(raw or "")
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise BadDataError(f'invalid parameter "{name}": cannot parse "{raw}" to a valid timestamp') from None


def _duration(raw: str | None) -> float:
    m = re.fullmatch(r"([0-9]+)([smhd])", raw or "")
    if m:
        return float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(raw or "")
    except ValueError:
        raise BadDataError(f'invalid parameter "step": cannot parse "{raw}" to a valid duration') from None


def _range(params: Mapping[str, str]) -> list[float]:
    start, end = _time(params.get("start"), "start"), _time(params.get("end"), "end")
    if end < start:
        raise BadDataError('invalid parameter "end": end timestamp must not be before start time')
    step = _duration(params.get("step"))
    if step <= 0:
        raise BadDataError(
            'invalid parameter "step": zero or negative query resolution step widths are not accepted. '
            "Try a positive integer"
        )
    if (end - start) / step > MAX_POINTS:
        raise BadDataError(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query "
            "resolution (?step=XX)"
        )
    return [start + k * step for k in range(int((end - start) // step) + 1)]


def _pair(t: float, v: float) -> list[Any]:
    """``[unix seconds, "value"]``, the value a string as Prometheus formats it."""
    t = round(t, 3)
    text = str(int(v)) if v.is_integer() and abs(v) < 1e15 else ("NaN" if math.isnan(v) else repr(v))
    return [int(t) if t.is_integer() else t, text]


def serve(fake: FakePrometheus, host: str = "127.0.0.1", port: int = 0) -> tuple[Any, str]:
    server = serve_json(fake.dispatch, "fake-prometheus", host, port)
    return server, f"http://{host}:{server.server_address[1]}"
