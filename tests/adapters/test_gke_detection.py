"""GKE detection: regional k8s_node entries, node-journal and serial-console provenance, zone lookup.

A regional cluster's ``k8s_node`` entry names its region (reference/gke.md §1). It parses to a
real event with ``node.region`` and ``zone: null`` (never ``invalid``); ingest fills the zone
from the Node's providerID, else Compute's instances.get in the cluster's zones (adapters/gke/zone.py).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests
from google.cloud import firestore

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.gke.zone import (
    ClusterZones,
    ZoneLookupError,
    ZoneResolver,
    cluster_zones,
    fill_zone,
    zone_from_provider_id,
)
from pitstop.core import policy, trust
from pitstop.core.classify import Classifier
from pitstop.core.resources import DataFileError
from pitstop.local.fake_compute import FakeCompute
from pitstop.local.fake_compute import serve as serve_compute
from pitstop.local.fake_container import FakeContainer
from pitstop.local.fake_container import serve as serve_container
from pitstop.local.fake_k8s import FakeKube
from pitstop.services.ingest import Ingest
from tests.helpers import PROJECT, assert_valid_event, gke_journal_entry, legacy_agent_entry, push_body

CLF: Any = Classifier.default()  # its events are read and changed as plain documents here
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
REGION = "us-central1"
NODE = "gke-train-a3-pool-1f2e3d4c-x7k2"


def regional_journal(line: str = XID79, transport: str | None = "kernel", location: str = REGION) -> Any:
    entry = gke_journal_entry(line, instance=NODE, transport=transport)
    entry["resource"]["labels"]["location"] = location
    return entry


def serial_entry(line: str, log_id: str = "serialconsole.googleapis.com%2Fserial_port_1_output") -> Any:
    """GCE serial-port logging of a GKE node: textPayload, resource gce_instance (reference/gke.md §1)."""
    entry = legacy_agent_entry(f"[ 7341.112233] {line}", instance=NODE)
    entry["logName"] = f"projects/{PROJECT}/logs/{log_id}"
    return entry


# -- parsing -----------------------------------------------------------------------------------


def test_regional_node_journal_xid_parses_with_region_and_no_zone() -> None:
    ev = CLF.classify(regional_journal())
    assert_valid_event(ev)
    assert (ev["kind"], ev["action"], ev["xid"]) == ("gpu_xid", "REBOOT_NODE", 79)
    assert ev["node"]["zone"] is None
    assert ev["node"]["region"] == REGION
    assert ev["node"]["instance"] == NODE
    assert ev["node"]["cluster"] == "train"
    assert ev["source"]["trust"] == trust.VERIFIED
    assert ev["source"]["trust_reason"] == trust.WHY_JOURNAL_KERNEL


def test_a_zonal_clusters_entry_names_the_clusters_zone_not_the_nodes() -> None:
    """Issue 35 (low): a zonal cluster with extra node locations names its own zone on every node's
    entry; taking it as the node's zone sent every action to the wrong zone."""
    ev = CLF.classify(regional_journal(location="us-central1-c"))
    assert_valid_event(ev)
    assert ev["node"]["zone"] is None
    assert (ev["node"]["region"], ev["node"]["location"]) == (REGION, "us-central1-c")


def test_regional_journal_line_from_another_transport_is_unverified() -> None:
    ev = CLF.classify(regional_journal(transport="syslog"))
    assert_valid_event(ev)
    assert ev["kind"] == "gpu_xid"
    assert ev["node"]["region"] == REGION
    assert ev["source"]["trust"] == trust.UNVERIFIED


@pytest.mark.parametrize("location", ["us-central1/../x", "US-CENTRAL1", "", "us-central", "global"])
def test_bad_gke_location_is_invalid(location: str) -> None:
    ev = CLF.classify(regional_journal(location=location))
    assert_valid_event(ev)
    assert ev["kind"] == "invalid"
    assert "zone" in ev["reason"]


def test_a_region_is_no_zone_outside_gke_resources() -> None:
    """A gce_instance entry always names its zone: a region there is still invalid."""
    entry = legacy_agent_entry(XID79)
    entry["resource"]["labels"]["zone"] = REGION
    ev = CLF.classify(entry)
    assert ev["kind"] == "invalid"


def test_schema_requires_region_when_zone_is_null() -> None:
    ev = CLF.classify(regional_journal())
    assert_valid_event(ev)
    bad = copy.deepcopy(ev)
    del bad["node"]["region"]
    with pytest.raises(DataFileError, match="node"):
        assert_valid_event(bad)
    bad["node"]["zone"] = "us-central1-b"  # with a zone, no region is needed
    assert_valid_event(bad)


@pytest.mark.parametrize(
    "log_id",
    [
        "serialconsole.googleapis.com%2Fserial_port_1_output",
        "serialconsole.googleapis.com/serial_port_1_output",
    ],
)
def test_serial_console_xid_parses_unverified_with_its_own_reason(log_id: str) -> None:
    """Serial output is the guest's own bytes: any process that can write the port could forge it."""
    ev = CLF.classify(serial_entry(XID79, log_id))
    assert_valid_event(ev)
    assert (ev["kind"], ev["xid"]) == ("gpu_xid", 79)
    assert ev["node"]["zone"] == "us-central1-a"
    assert ev["source"]["trust"] == trust.UNVERIFIED
    assert ev["source"]["trust_reason"] == trust.WHY_SERIAL_CONSOLE
    assert "unverified" in ev["reason"]


def test_other_text_payloads_keep_the_legacy_agent_reason() -> None:
    ev = CLF.classify(legacy_agent_entry(XID79))
    assert ev["source"]["trust_reason"] == trust.WHY_LEGACY_AGENT


def test_pitstop_classify_reports_region_and_null_zone(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(regional_journal()) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pitstop.tools.cli", "classify", str(src)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    ev = json.loads(proc.stdout.decode().splitlines()[0])
    assert (ev["kind"], ev["action"]) == ("gpu_xid", "REBOOT_NODE")
    assert ev["node"]["region"] == REGION
    assert ev["node"]["zone"] is None


# -- providerID --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pid", "zone"),
    [
        (f"gce://{PROJECT}/us-central1-b/{NODE}", "us-central1-b"),
        (f"gce://{PROJECT}/europe-west4-a/{NODE}", None),  # outside the region
        (f"gce://other-project/us-central1-b/{NODE}", None),
        (f"gce://{PROJECT}/us-central1-b/another-node", None),
        (f"gce://{PROJECT}/us-central1-b/{NODE}/extra", None),
        (f"gce://{PROJECT}/us-central1-b/{NODE}\n", None),
        (f"aws:///us-central1-b/{NODE}", None),
        (f"gce://{PROJECT}/us-central1-b/../{NODE}", None),
        (None, None),
    ],
)
def test_zone_from_provider_id_is_strict(pid: Any, zone: str | None) -> None:
    assert zone_from_provider_id(pid, PROJECT, REGION, NODE).zone == zone


CLUSTER = "train"  # the cluster_name of tests.helpers.gke_journal_entry
ZONES = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]


class Compute:
    """The lookup's two sources on their fakes, with the requests recorded: compute_v1's
    InstancesClient (the real client) against the fake Compute Engine's instances.get, and
    ClusterZones against the fake Container API's clusters.get of cluster ``train``."""

    servers: list[Any] = []

    def __init__(
        self, where: dict[str, list[str]], zones: list[str] | None = None, unavailable: int = 0
    ) -> None:
        self.fake = FakeCompute()
        for zone, names in where.items():
            for n in names:
                self.fake.add_instance(PROJECT, zone, n)
        if unavailable:
            self.fake.inject("get_instance", 503, "backendError", count=unavailable)
        server, endpoint = serve_compute(self.fake)
        self.container = FakeContainer()
        self.container.add_cluster(PROJECT, REGION, CLUSTER, ZONES if zones is None else zones)
        cserver, cendpoint = serve_container(self.container)
        Compute.servers += [server, cserver]
        self.client = ComputeAdapter(endpoint).instances
        self.waits: list[float] = []
        self.clusters = ClusterZones(requests.Session(), cendpoint, sleep=self.waits.append)
        self.requests: list[dict[str, Any]] = []

    def get(self, request: dict[str, Any], **options: Any) -> Any:
        self.requests.append(request)
        return self.client.get(request=request, **options)

    def resolver(self, **kw: Any) -> ZoneResolver:
        return ZoneResolver(instances=self, clusters=self.clusters, **kw)


@pytest.fixture(autouse=True, scope="module")
def _stop_fakes() -> Any:
    yield
    for server in Compute.servers:
        server.shutdown()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_compute_lookup_asks_instances_get_in_the_clusters_zones_of_the_region_and_caches() -> None:
    compute = Compute(
        {"europe-west4-a": [NODE], "us-central1-f": [NODE]},
        zones=["europe-west4-a", "us-central1-a", "us-central1-f"],
    )
    clock = Clock()
    r = compute.resolver(ttl_s=100, clock=clock)
    answer = r.resolve(PROJECT, REGION, NODE, CLUSTER)
    assert (answer.zone, answer.how) == ("us-central1-f", "compute instances.get")
    # one get per zone of the cluster inside the entry's region; never a list, never Europe
    assert compute.requests == [
        {"project": PROJECT, "zone": z, "instance": NODE} for z in ("us-central1-a", "us-central1-f")
    ]
    assert compute.container.requests == [f"/v1/projects/{PROJECT}/locations/{REGION}/clusters/{CLUSTER}"]
    assert r.resolve(PROJECT, REGION, NODE, CLUSTER).zone == "us-central1-f"
    assert len(compute.requests) == 2  # served from the cache
    clock.t += 101
    assert r.resolve(PROJECT, REGION, NODE, CLUSTER).zone == "us-central1-f"
    assert len(compute.requests) == 4  # the entry expired
    assert len(compute.container.requests) == 1  # the cluster's zones are cached on their own


def test_node_pools_with_zones_of_their_own_are_asked_too() -> None:
    compute = Compute({"us-central1-c": [NODE]}, zones=["us-central1-a"])
    compute.container.add_cluster(PROJECT, REGION, CLUSTER, ["us-central1-a"], {"a3": ["us-central1-c"]})
    assert compute.resolver().resolve(PROJECT, REGION, NODE, CLUSTER).zone == "us-central1-c"
    assert cluster_zones(
        {"locations": ["us-central1-a", "../x", 3], "nodePools": [None, {"locations": ["us-central1-b"]}]}
    ) == [
        "us-central1-a",
        "us-central1-b",
    ]


def test_ambiguous_or_missing_instance_gives_no_zone_and_a_short_lived_miss() -> None:
    compute = Compute({"us-central1-a": [NODE], "us-central1-b": [NODE]})
    clock = Clock()
    r = compute.resolver(miss_ttl_s=10, clock=clock)
    answer = r.resolve(PROJECT, REGION, NODE, CLUSTER)
    assert answer.zone is None
    assert "several zones" in answer.how
    r.resolve(PROJECT, REGION, NODE, CLUSTER)
    assert len(compute.requests) == len(ZONES)
    clock.t += 11
    r.resolve(PROJECT, REGION, NODE, CLUSTER)
    assert len(compute.requests) == 2 * len(ZONES)
    missing = Compute({}).resolver().resolve(PROJECT, REGION, NODE, CLUSTER)
    assert missing.zone is None and "no instance" in missing.how
    gone = Compute({"us-central1-a": [NODE]})
    assert gone.resolver().resolve(PROJECT, REGION, NODE, "other-cluster").zone is None  # 404: no zones
    assert gone.requests == []


def test_cache_is_bounded() -> None:
    compute = Compute({"us-central1-a": [f"gke-n{i}" for i in range(5)]}, zones=["us-central1-a"])
    r = compute.resolver(max_entries=2)
    for i in range(5):
        assert r.resolve(PROJECT, REGION, f"gke-n{i}", CLUSTER).zone == "us-central1-a"
    assert len(r._cache) == 2
    r.resolve(PROJECT, REGION, "gke-n0", CLUSTER)
    assert len(compute.requests) == 6  # gke-n0 had been evicted


def test_api_trouble_is_a_retryable_lookup_error_and_not_cached() -> None:
    compute = Compute({"us-central1-a": [NODE]}, unavailable=100)  # 503 until cleared
    r = compute.resolver()
    with pytest.raises(ZoneLookupError, match=r"instances\.get"):
        r.resolve(PROJECT, REGION, NODE, CLUSTER)
    compute.fake.injected.clear()  # Compute is back
    assert r.resolve(PROJECT, REGION, NODE, CLUSTER).zone == "us-central1-a"
    with pytest.raises(ZoneLookupError):
        ZoneResolver().resolve(PROJECT, REGION, NODE)  # no source at all
    down = Compute({"us-central1-a": [NODE]})
    down.container.fail(3)  # the Container API unavailable: three tries, bounded, then an error
    with pytest.raises(ZoneLookupError, match="503"):
        down.resolver().resolve(PROJECT, REGION, NODE, CLUSTER)
    assert (len(down.container.requests), down.waits) == (3, [0.2, 0.4])
    down.container.fail(1, 403)  # a refusal is not asked again now
    with pytest.raises(ZoneLookupError, match="403"):
        down.resolver().resolve(PROJECT, REGION, NODE, CLUSTER)
    assert len(down.container.requests) == 4 and down.requests == []
    assert down.resolver().resolve(PROJECT, REGION, NODE, CLUSTER).zone == "us-central1-a"


def test_hostile_names_never_reach_an_api() -> None:
    compute = Compute({"us-central1-a": [NODE, "train-vm-1"]})
    r = compute.resolver()
    assert r.resolve(PROJECT, REGION, 'x" OR name = "y', CLUSTER).zone is None
    assert r.resolve(PROJECT, "us-central1-a", NODE, CLUSTER).zone is None
    assert r.resolve(PROJECT, REGION, NODE, "../../x").zone is None
    assert r.resolve(PROJECT, REGION, NODE).zone is None  # no cluster: no zones to ask in
    # not a GKE node VM: the grant's condition admits gke-* only, so it is not asked
    assert "not a GKE node" in r.resolve(PROJECT, REGION, "train-vm-1", CLUSTER).how
    assert compute.requests == [] and compute.container.requests == []


def test_fill_zone_completes_a_regional_event() -> None:
    ev = CLF.classify(regional_journal())
    r = Compute({"us-central1-c": [NODE]}).resolver()
    assert fill_zone(ev, r) is None
    assert ev["node"]["zone"] == "us-central1-c"
    assert_valid_event(ev)
    missing = CLF.classify(regional_journal())
    why = fill_zone(missing, Compute({}).resolver())
    assert why is not None and NODE in why
    assert missing["node"]["zone"] is None
    gce = CLF.classify(legacy_agent_entry(XID79, instance=NODE))
    assert fill_zone(gce, ZoneResolver()) is None  # a VM's own entry names its zone: nothing asked
    assert gce["node"]["zone"] == "us-central1-a"


def test_a_zonal_clusters_node_in_another_of_its_zones_gets_that_zone() -> None:
    """The cluster (zone us-central1-b) has a node pool in us-central1-f: clusters.get is asked at
    the cluster's own location and instances.get finds the node where it is."""
    compute = Compute({"us-central1-f": [NODE]}, zones=[])
    compute.container.add_cluster(PROJECT, "us-central1-b", CLUSTER, ["us-central1-b", "us-central1-f"])
    ev = CLF.classify(regional_journal(location="us-central1-b"))
    assert fill_zone(ev, compute.resolver()) is None
    assert ev["node"]["zone"] == "us-central1-f" and "location" not in ev["node"]
    assert_valid_event(ev)
    assert compute.container.requests == [
        f"/v1/projects/{PROJECT}/locations/us-central1-b/clusters/{CLUSTER}"
    ]


@pytest.fixture
def kube() -> Any:
    k = FakeKube(vm_status=None, auto=False)
    k.start()
    yield k
    k.stop()


def test_provider_id_from_the_node_wins_and_compute_is_not_asked(kube: Any, tmp_path: Path) -> None:
    from kubernetes import config

    kube.add_node(NODE, project=PROJECT, zone="us-central1-b")
    path = tmp_path / "kubeconfig"
    kube.write_kubeconfig(str(path))
    api = config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
    compute = Compute({"us-central1-f": [NODE]})
    r = compute.resolver(kube_for=lambda c: api if c == "train" else None)
    answer = r.resolve(PROJECT, REGION, NODE, cluster="train")
    assert (answer.zone, answer.how) == ("us-central1-b", "node spec.providerID")
    assert compute.requests == []
    # an unknown node falls back to Compute
    assert r.resolve(PROJECT, REGION, "gke-train-other", cluster="train").zone is None
    assert len(compute.requests) == len(ZONES)  # one instances.get per zone of the cluster


@pytest.mark.emulator
def test_ingest_gives_a_regional_event_its_zone_before_the_engine_keys_it(
    fs_client: firestore.Client,
) -> None:
    compute = Compute({"us-central1-c": [NODE]})
    store = IncidentStore(fs_client, "pitstop")
    pol = policy.from_doc({"mode": "observe"})
    ing = Ingest(pol, store, None, None, zones=compute.resolver())
    out = ing.handle_payload(push_body(regional_journal()))
    assert out.result == "opened" and out.incident is not None
    assert out.incident["node"] is not None and out.incident["node"]["zone"] == "us-central1-c"
    assert out.incident["node_key"] == f"{PROJECT}.us-central1-c.{NODE}"
    lost = Ingest(pol, store, None, None, zones=Compute({}).resolver())
    other = regional_journal()
    other["resource"]["labels"]["node_name"] = "gke-gone-1"
    assert lost.handle_payload(push_body(other)).result == "ignored"  # acknowledged, logged, never keyed
    assert store.counts.latest(f"{PROJECT}.None.gke-gone-1") is None
