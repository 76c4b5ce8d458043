"""adapters/prometheus.PromQLReader over real HTTP against the Managed Service for Prometheus
stand-in (local/fake_prometheus.py), fed by GPU stand-in states as the stack's fake Compute writes
them: a straggler's and an ECC trend's peers read as actuate reads them, and the API's error
answers (bad_data, the 11,000-point limit, a 503 that outlasts the retries) raised as
google.api_core's exceptions, which the comparison treats as "unreadable" (the alert stands)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc

from pitstop.adapters.prometheus import PromQLReader
from pitstop.core import degraded
from pitstop.local.fake_prometheus import FakePrometheus, serve
from pitstop.local.gpu_tools.state import PRESETS, check_entry

PROJECT, NODES = "pitstop-local", ["gke-n-0", "gke-n-1", "gke-n-2", "gke-n-3"]
POL = degraded.default_policy()
NOW = 1_800_000_000.0


@pytest.fixture
def env() -> Iterator[tuple[PromQLReader, dict[str, Any], FakePrometheus]]:
    states: dict[str, Any] = {}
    fake = FakePrometheus(PROJECT, "train", "us-central1-a", NODES, lambda: states)
    server, url = serve(fake)
    try:
        yield PromQLReader(url), states, fake
    finally:
        server.shutdown()


def test_a_straggler_reads_as_the_one_throttled_node_among_its_peers(env: Any) -> None:
    reader, states, fake = env
    states[NODES[1]] = check_entry("straggler")  # thermal throttling 60 % of the time on GPU 0
    values = reader.node_values(PROJECT, POL.prometheus["throttle"], NODES, NOW)
    assert values == {NODES[0]: 0.0, NODES[1]: pytest.approx(0.6, abs=0.05), NODES[2]: 0.0, NODES[3]: 0.0}
    assert fake.queries == ['DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{Hostname=~"gke\\\\-n\\\\-0|gke\\\\-n\\\\-1|'
                            'gke\\\\-n\\\\-2|gke\\\\-n\\\\-3"}']  # fmt: skip
    verdict = degraded.compare(POL.prometheus["throttle"], POL.gang_wide_share, NODES[1], values[NODES[1]],
                               {n: values[n] for n in NODES if n != NODES[1]})  # fmt: skip
    assert verdict.verdict == "move", verdict.why


def test_a_gang_power_capped_alike_reads_alike(env: Any) -> None:
    reader, states, _ = env
    for n in NODES[:2]:
        states[n] = check_entry({"throttle": 0.5, "throttle_reason": "power"})
    values = reader.node_values(PROJECT, POL.prometheus["throttle"], NODES[:2], NOW)
    assert values == {n: pytest.approx(0.5, abs=0.05) for n in NODES[:2]}


def test_an_ecc_trend_reads_as_its_counters_rise_over_the_hour(env: Any) -> None:
    reader, states, _ = env
    states[NODES[2]] = check_entry(PRESETS["degrading"])  # 40 correctable errors an hour
    values = reader.node_values(PROJECT, POL.prometheus["ecc"], NODES, NOW)
    assert values == {NODES[0]: 0.0, NODES[1]: 0.0, NODES[2]: 40.0, NODES[3]: 0.0}


def test_nodes_without_series_read_as_unknown(env: Any) -> None:
    reader, _, _ = env
    assert reader.node_values(PROJECT, POL.prometheus["throttle"], ["gke-elsewhere"], NOW) == {
        "gke-elsewhere": None
    }


def test_the_answer_has_prometheus_own_shape(env: Any) -> None:
    reader, _, _ = env
    base = f"{reader.base}/v1/projects/{PROJECT}/location/global/prometheus/api/v1"
    query = f'DCGM_FI_DEV_SM_CLOCK{{Hostname="{NODES[0]}",gpu="2"}}'
    params = {"query": query, "time": "2027-01-15T08:00:00Z"}
    doc = requests.get(f"{base}/query", params=params, timeout=5).json()
    (row,) = doc["data"]["result"]
    assert doc["status"] == "success" and doc["data"]["resultType"] == "vector"
    assert row["metric"]["__name__"] == "DCGM_FI_DEV_SM_CLOCK" and row["metric"]["Hostname"] == NODES[0]
    assert row["value"] == [1800000000, "1980"]
    r = requests.get(f"{base}/query_range", params={"query": "DCGM_FI_DEV_XID_ERRORS", "start": "100",
                                                    "end": "160", "step": "30s"}, timeout=5)  # fmt: skip
    rows = r.json()["data"]["result"]
    assert len(rows) == len(NODES) * 8 and rows[0]["values"] == [[100, "0"], [130, "0"], [160, "0"]]


@pytest.mark.parametrize(
    ("query", "span", "words"),
    [
        (
            'DCGM_FI_DEV_SM_CLOCK{Hostname=~"("}',
            {"start": "0", "end": "60", "step": "30"},
            "error parsing regexp",
        ),
        ("sum(DCGM_FI_DEV_SM_CLOCK)", {"start": "0", "end": "60", "step": "30"}, "vector selectors only"),
        ("DCGM_FI_DEV_SM_CLOCK", {"start": "0", "end": "20000", "step": "1"}, "11,000 points"),
        ("DCGM_FI_DEV_SM_CLOCK", {"start": "60", "end": "0", "step": "30"}, "must not be before start"),
        (
            "DCGM_FI_DEV_SM_CLOCK",
            {"start": "yesterday", "end": "0", "step": "30"},
            'cannot parse "yesterday"',
        ),
        ("DCGM_FI_DEV_SM_CLOCK", {"start": "0", "end": "60", "step": "0"}, "zero or negative"),
    ],
)
def test_bad_data_is_raised_as_a_bad_request(env: Any, query: str, span: dict[str, str], words: str) -> None:
    reader, _, _ = env
    with pytest.raises(gexc.BadRequest) as exc:
        reader.query_range(PROJECT, query, span)
    assert "bad_data" in str(exc.value) and words in str(exc.value)


def test_a_passing_503_is_retried_and_a_lasting_one_raised(env: Any) -> None:
    reader, _, _ = env
    requests.post(f"{reader.base}/_admin/faults", json={"code": 503, "times": 1}, timeout=5)
    assert reader.node_values(PROJECT, POL.prometheus["throttle"], NODES[:1], NOW) == {NODES[0]: 0.0}
    requests.post(f"{reader.base}/_admin/faults", json={"code": 503, "times": 3}, timeout=5)
    with pytest.raises(gexc.ServiceUnavailable, match="unavailable"):
        reader.node_values(PROJECT, POL.prometheus["throttle"], NODES[:1], NOW)


def test_only_the_documented_path_answers(env: Any) -> None:
    reader, _, _ = env
    r = requests.get(f"{reader.base}/v1/projects/{PROJECT}/location/us-central1/prometheus/api/v1/query",
                     params={"query": "up"}, timeout=5)  # fmt: skip
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
