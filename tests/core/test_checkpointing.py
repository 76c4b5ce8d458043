"""The checkpoint interval's math (core/checkpointing.py) against the papers' own numbers.

Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974:
tau = sqrt(2 delta M). Daly, "A higher order estimate of the optimum checkpoint interval for
restart dumps", FGCS 22(3), 2006: its figures 3-5 (R = 10 min, delta = 5 min) say the model
predicts tau_opt = 117 min at M = 24 h, 57 min at M = 6 h and 9.1 min at M = 15 min.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitstop.core import checkpointing as cp

MIN = 60.0
HOUR = 3600.0


@pytest.mark.parametrize(("mtbf_min", "paper_min"), [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_matches_the_papers_figures(mtbf_min: float, paper_min: float) -> None:
    got = cp.daly(5 * MIN, mtbf_min * MIN) / MIN
    assert got == pytest.approx(paper_min, abs=0.5 if paper_min > 10 else 0.05)


def test_young_by_hand() -> None:
    # sqrt(2 * 5 min * 1440 min) = sqrt(14400) = 120 min
    assert cp.young(5 * MIN, 24 * HOUR) == pytest.approx(120 * MIN)


def test_daly_by_hand() -> None:
    # delta = 5, M = 360 (minutes): x = 5/720; 60 * (1 + sqrt(x)/3 + x/9) - 5 = 56.7130
    x = 5 / 720
    assert cp.daly(5.0, 360.0) == pytest.approx(60 * (1 + math.sqrt(x) / 3 + x / 9) - 5)
    assert cp.daly(5.0, 360.0) == pytest.approx(56.7130, abs=1e-4)


def test_daly_checkpoints_once_per_mtbf_when_the_write_outlasts_two() -> None:
    assert cp.daly(30 * MIN, 10 * MIN) == 10 * MIN
    assert cp.daly(20 * MIN, 10 * MIN) == 10 * MIN  # delta = 2M: the branch's edge


def test_the_optimum_solves_dalys_condition() -> None:
    # dT/dtau = 0  <=>  M (1 - exp(-(tau + delta)/M)) = tau
    delta, m = 5 * MIN, 6 * HOUR
    tau = cp.optimum(delta, m)
    assert m * (1 - math.exp(-(tau + delta) / m)) == pytest.approx(tau, rel=1e-9)
    assert tau / MIN == pytest.approx(57, abs=0.5)  # the paper's figure 4


def test_goodput_by_hand() -> None:
    # tau = 1 h, delta = 6 min, M = 10 h, R = 30 min:
    # 1 / (10 * exp(0.05) * (exp(0.11) - 1)) = 1 / (10 * 1.05127 * 0.11628) = 0.8181
    assert cp.goodput(HOUR, 6 * MIN, 10 * HOUR, 30 * MIN) == pytest.approx(
        1 / (10 * math.exp(0.05) * math.expm1(0.11))
    )
    assert cp.goodput(HOUR, 6 * MIN, 10 * HOUR, 30 * MIN) == pytest.approx(0.8181, abs=1e-4)


def test_goodput_without_failures_is_the_write_overhead_only() -> None:
    assert cp.goodput(54 * MIN, 6 * MIN, math.inf, 30 * MIN) == pytest.approx(0.9)
    assert cp.goodput(1e6, 6 * MIN, 1e15, 0.0) == pytest.approx(1e6 / (1e6 + 360), rel=1e-6)


def test_no_work_no_goodput() -> None:
    assert cp.goodput(0.0, 60.0, HOUR, 60.0) == 0.0


def test_advice_for_a_job_divides_the_node_mtbf_by_its_nodes() -> None:
    # 3.79 interruptions per 1,000 node-days (Llama 3, reference/goodput-validation.md 1.1):
    # node MTBF 1000/3.79 days; a 512-node job's M = that / 512 = 12.37 h
    node_mtbf = 1000 / 3.79 * 86400
    a = cp.advise(node_mtbf, 512, 2 * MIN, 10 * MIN, actual_s=4 * HOUR)
    assert a.mtbf_s == pytest.approx(node_mtbf / 512)
    assert a.mtbf_s / HOUR == pytest.approx(12.37, abs=0.01)
    assert a.young_s == pytest.approx(math.sqrt(2 * 120 * a.mtbf_s))
    assert a.advised_s < a.actual_s if a.actual_s else False
    assert a.gain is not None and a.gain > 0.05  # 4 h between checkpoints loses ~ 1/6 of the run


def test_advice_without_a_measured_interval_has_no_gain() -> None:
    a = cp.advise(100 * HOUR, 4, 60.0, 600.0)
    assert a.actual_s is None and a.goodput_actual is None and a.gain is None


@pytest.mark.parametrize(("mtbf", "nodes", "delta"), [(math.inf, 1, 60.0), (0.0, 1, 60.0), (HOUR, 0, 60.0)])
def test_no_advice_without_a_finite_mtbf_or_nodes(mtbf: float, nodes: int, delta: float) -> None:
    with pytest.raises(ValueError, match="no advice"):
        cp.advise(mtbf, nodes, delta, 60.0)


@settings(max_examples=300, deadline=None)
@given(
    mtbf=st.floats(60.0, 1e7),
    delta=st.floats(0.0, 1e5),
    restart=st.floats(0.0, 1e4),
    actual=st.floats(1.0, 1e6),
)
def test_the_advised_interval_is_never_worse(
    mtbf: float, delta: float, restart: float, actual: float
) -> None:
    a = cp.advise(mtbf, 1, delta, restart, actual_s=actual)
    assert a.gain is not None and a.gain >= -1e-12 * max(1.0, a.goodput_advised)


@settings(max_examples=200, deadline=None)
@given(mtbf=st.floats(1e4, 1e8), ratio=st.floats(1e-7, 1e-4))
def test_young_and_daly_agree_when_the_write_is_small(mtbf: float, ratio: float) -> None:
    delta = ratio * mtbf
    assert cp.daly(delta, mtbf) == pytest.approx(cp.young(delta, mtbf), rel=0.02)
    assert cp.optimum(delta, mtbf) == pytest.approx(cp.daly(delta, mtbf), rel=1e-3)
