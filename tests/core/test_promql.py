"""A GKE degraded node's peers from Managed Service for Prometheus, decided without I/O (core/promql.py):
the selector a job's nodes become, the answers accepted and refused, each reduction of a window of
samples, and core/degraded.compare on the values they give (the same comparison as on GCE)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pitstop.core import degraded, promql

POL = degraded.default_policy()
THROTTLE, ECC, NVLINK, PCIE = (POL.prometheus[k] for k in ("throttle", "ecc", "nvlink", "pcie"))
HW_THERMAL, SW_POWER_CAP, IDLE, SYNC_BOOST = 0x40, 0x4, 0x1, 0x10  # NVML clocks event reasons


def _matrix(*series: tuple[dict[str, str], list[tuple[float, float]]]) -> dict[str, Any]:
    """A query_range answer as the API writes it: values as strings."""
    result = [{"metric": m, "values": [[t, repr(v)] for t, v in s]} for m, s in series]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _gpu(
    node: str, gpu: int, values: Sequence[float], step: float = 30.0
) -> tuple[dict[str, str], list[tuple[float, float]]]:
    return {"Hostname": node, "gpu": str(gpu)}, [(1000.0 + i * step, v) for i, v in enumerate(values)]


# -- the reduction of one window, rule by rule -------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "values", "expected"),
    [
        # the throttle bitmap: the share of samples with a hardware or power reason set
        (THROTTLE, [HW_THERMAL, 0, HW_THERMAL, 0, 0], 0.4),
        (THROTTLE, [HW_THERMAL | IDLE] * 4, 1.0),
        (THROTTLE, [SW_POWER_CAP, SW_POWER_CAP, 0, 0], 0.5),
        # idleness and sync boost are not throttling (mask 0xEC leaves them out)
        (THROTTLE, [IDLE, SYNC_BOOST, IDLE | SYNC_BOOST, 0], 0.0),
        (THROTTLE, [float("nan"), HW_THERMAL], 1.0),  # a stale sample is not counted
        (THROTTLE, [], None),  # no samples: nothing to say
        # a counter's rise over the window; a reset counts from zero (PromQL's increase)
        (ECC, [100, 110, 125, 140], 40.0),
        (ECC, [100, 120, 5, 15], 35.0),
        (ECC, [7], None),  # one sample: no rise to measure
        # a rate per second (NVLink CRC) and per minute (PCIe replays, per_s 60)
        (NVLINK, [0, 6000, 12000], 200.0),
        (PCIE, [0, 15, 30], 30.0),
    ],
)
def test_a_window_reduces_to_one_number(
    rule: degraded.PromRule, values: list[float], expected: float | None
) -> None:
    _, samples = _gpu("n", 0, values)
    got = promql.reduce_series(rule, samples)
    assert got == (None if expected is None else pytest.approx(expected))


# -- answer → per-node values → the same comparison as on GCE -----------------------------------


@pytest.mark.parametrize(
    ("answer", "verdict", "node_value"),
    [
        # one node's GPU 3 is held below its clocks 60 % of the time, its peers' GPUs never
        (
            _matrix(
                _gpu("a", 0, [0] * 10),
                _gpu("a", 3, [HW_THERMAL] * 6 + [0] * 4),
                _gpu("b", 0, [0] * 10),
                _gpu("c", 0, [IDLE] * 10),
            ),
            "move",
            0.6,
        ),
        # the whole gang power-capped alike: a shared cause, no move
        (
            _matrix(
                _gpu("a", 0, [SW_POWER_CAP] * 5 + [0] * 5),
                _gpu("b", 0, [SW_POWER_CAP] * 5 + [0] * 5),
                _gpu("c", 1, [SW_POWER_CAP] * 6 + [0] * 4),
            ),
            "gang_wide",
            0.5,
        ),
        # the node no longer throttles: the condition has passed
        (_matrix(_gpu("a", 0, [0] * 10), _gpu("b", 0, [0] * 10)), "cleared", 0.0),
        # no series for the peers (the field not exported): the alert stands on its own
        (_matrix(_gpu("a", 0, [HW_THERMAL] * 10)), "move", 1.0),
    ],
)
def test_the_peers_answer_decides_the_move(answer: dict[str, Any], verdict: str, node_value: float) -> None:
    values = promql.node_values(THROTTLE, promql.parse(answer), ["a", "b", "c"])
    v = degraded.compare(THROTTLE, POL.gang_wide_share, "a", values["a"], {p: values[p] for p in ("b", "c")})
    assert v.verdict == verdict and v.node_value == pytest.approx(node_value), v.why


def test_a_series_of_a_node_not_asked_about_is_ignored() -> None:
    values = promql.node_values(THROTTLE, promql.parse(_matrix(_gpu("zz", 0, [HW_THERMAL]))), ["a"])
    assert values == {"a": None}


def test_an_instant_vector_is_read_too() -> None:
    doc = {"status": "success", "data": {"resultType": "vector",
           "result": [{"metric": {"Hostname": "a"}, "value": [1000.5, "64"]}]}}  # fmt: skip
    (s,) = promql.parse(doc)
    assert s.labels == {"Hostname": "a"} and s.samples == ((1000.5, 64.0),)


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"status": "error", "errorType": "bad_data", "error": "parse error"}, "bad_data: parse error"),
        ([], "not a JSON object"),
        ({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}, "resultType 'scalar'"),
        (
            {"status": "success", "data": {"resultType": "matrix", "result": [{"values": []}]}},
            "metric labels",
        ),
        (
            {
                "status": "success",
                "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, 2]]}]},
            },
            '[time, "value"]',
        ),
        (
            {
                "status": "success",
                "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "hot"]]}]},
            },
            "not a number",
        ),
        (
            {
                "status": "success",
                "data": {"resultType": "matrix", "result": [{"metric": {"a": 1}, "values": []}]},
            },
            "metric labels",
        ),
    ],
)
def test_an_answer_that_is_not_a_result_is_refused(doc: Any, words: str) -> None:
    with pytest.raises(promql.PromError, match=None) as exc:
        promql.parse(doc)
    assert words in str(exc.value)


def test_the_selector_names_the_nodes_as_one_anchored_regex() -> None:
    q = promql.selector(THROTTLE, ["gke-a-1", "gke-b.2"])
    assert q == 'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{Hostname=~"gke\\\\-a\\\\-1|gke\\\\-b\\\\.2"}'


@pytest.mark.parametrize("bad", [['a"} or vector(1) #'], ["A-Upper"], ["x|y"], []])
def test_anything_but_node_names_never_reaches_a_query(bad: list[str]) -> None:
    with pytest.raises(promql.PromError):
        promql.selector(THROTTLE, bad)


def test_the_window_is_the_rules_own_and_within_the_apis_resolution() -> None:
    assert promql.window(THROTTLE, 10_000.0) == {"start": "9400.000", "end": "10000.000", "step": "30"}
    wide = degraded.PromRule("x", "m", 'm{h=~"{nodes}"}', "h", "increase", 0, 10**6, 1)
    span = promql.window(wide, 10**7)
    assert (float(span["end"]) - float(span["start"])) / float(span["step"]) <= promql.MAX_POINTS
