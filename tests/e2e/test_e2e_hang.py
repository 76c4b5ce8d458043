"""A hung job on the whole local stack, enforce mode: its heartbeat stops, the Monitoring stand-in's
alert opens its incident, the workflow localises it on real Slurm and concludes (tools/demo.py's
hang scenarios, each check of which is in its result).

- a bad node (an NVLink down, found by the ring's NCCL test) and a spare: the culprit's own
  incident fences and replaces it, the gang trains again on the spare, restarted once;
- no bad node: exactly one in-place restart and a page naming every node; the same job hung again
  within ``windows.hang_localise_s``: a new incident, not localised again.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pitstop.local.stack import Stack
from pitstop.tools.demo import Scenarios, slurm_spec

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def sc() -> Iterator[Scenarios]:
    stack = Stack(Path(tempfile.mkdtemp(prefix="pitstop-e2e-hang-")), slurm_spec(13))
    try:
        stack.up()
        yield Scenarios(stack)
    except BaseException:
        for name in ("ingest", "actuate", "executions", "slurm-agent", "monitoring"):
            log = stack.workdir / f"{name}.log"
            if log.exists():
                print(f"--- {name}.log ---\n" + "\n".join(log.read_text().splitlines()[-20:]))
        raise
    finally:
        stack.down()


def test_a_hang_with_a_bad_node_and_a_spare_trains_again_on_the_spare(sc: Scenarios) -> None:
    r = sc.hang_bad_node()
    assert r.passed, r.detail
    assert r.facts["rounds"] == ["sweep", "links"] and r.facts["failed"] == []


def test_a_hang_with_no_bad_node_restarts_in_place_once_pages_and_is_not_localised_twice(
    sc: Scenarios,
) -> None:
    sc.settle()
    r = sc.hang_software()
    assert r.passed, r.detail
    assert r.facts["first"]["outcome"] == "nothing_found" and r.facts["second"]["run"] is False
