"""A GKE node's serial-console Xid line, believed only when its device plugin says the same.

The serial console is the route a GKE node's kernel lines usually take, and anyone on the VM can
write it (core/trust.py). GKE's GPU device plugin sets the Node condition XidCriticalError from
NVML events for the Xids it watches: reason a JSON map {"79": true}, message the node's bootID,
cleared by a new boot (container-engine-accelerators pkg/gpu/nvidia/health_check/
health_checker.go; reference/gke.md §2). Ingest reads the Node (adapters/gke/node.py) through the
real `kubernetes` client against the fake API server.
"""

from __future__ import annotations

import json
import socket
from typing import Any, cast

import pytest
from google.cloud import firestore

from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.gke.node import KubeClients, NodeReader, corroborate
from pitstop.core import policy, trust
from pitstop.core.classify import Classifier
from pitstop.local.fake_k8s import FakeKube
from pitstop.services.ingest import Ingest
from tests.helpers import PROJECT, ZONE, assert_valid_event, legacy_agent_entry, push_body

CLF: Any = Classifier.default()  # its events are read and changed as plain documents here
NODE = "gke-train-a3-pool-1f2e3d4c-x7k2"
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID13 = "NVRM: Xid (PCI:0000:a1:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"


def serial_entry(line: str = XID79, instance: str = NODE, insert_id: str = "ser-1") -> dict[str, Any]:
    """GCE serial-port logging of a GKE node: textPayload on gce_instance (reference/gke.md §1)."""
    entry = legacy_agent_entry(f"[ 7341.112233] {line}", instance=instance, insert_id=insert_id)
    entry["logName"] = f"projects/{PROJECT}/logs/serialconsole.googleapis.com%2Fserial_port_1_output"
    return entry


def gke_policy(mode: str = "enforce", project: str | None = None) -> policy.Policy:
    gke: dict[str, Any] = {"location": ZONE, "cluster": "train"}
    if project:
        gke["project"] = project
    cluster = {"name": "train", "scheduler": "gke", "match": {"gke_cluster": "train"}, "gke": gke}
    return policy.from_doc({"mode": mode, "clusters": [cluster]})


def device_plugin(kube: FakeKube, xid: int, boot: str | None = None) -> None:
    """The condition as the device plugin writes it, under the node's current boot unless told."""
    boot = boot or (kube.get("Node", NODE) or {})["status"]["nodeInfo"]["bootID"]
    kube.set_node_condition(NODE, trust.XID_CONDITION, "True", json.dumps({str(xid): True}), boot)


@pytest.fixture
def kube() -> Any:
    k = FakeKube(vm_status=None, auto=False)
    k.start()
    k.add_node(NODE, project=PROJECT, zone=ZONE)
    yield k
    k.stop()


def reader_for(kube: FakeKube, pol: policy.Policy | None = None, clock: Any = None) -> NodeReader:
    clients = KubeClients(pol or gke_policy(), PROJECT, kube.url)
    return NodeReader(clients, clock=clock) if clock else NodeReader(clients)


# -- the pure rule -----------------------------------------------------------------------------


def node_obj(conds: list[dict[str, Any]], boot: str = "b-1") -> dict[str, Any]:
    return {"status": {"nodeInfo": {"bootID": boot}, "conditions": conds}}


def xid_cond(reason: str = '{"79": true}', message: str = "b-1", status: str = "True") -> dict[str, Any]:
    return {"type": "XidCriticalError", "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(
    ("conds", "confirms"),
    [
        ([xid_cond()], True),
        ([xid_cond('{"48": true, "79": true}')], True),
        ([xid_cond(message="b-0")], False),  # an earlier boot's condition
        ([xid_cond('{"48": true}')], False),  # another Xid
        ([xid_cond('{"79": false}')], False),
        ([xid_cond(status="False")], False),
        ([xid_cond("XidCriticalError")], False),  # not the JSON map
        ([xid_cond('["79"]')], False),
        ([{"type": "Ready", "status": "True"}], False),
        ([], False),
    ],
)
def test_the_condition_confirms_only_this_xid_on_this_boot(
    conds: list[dict[str, Any]], confirms: bool
) -> None:
    why = trust.xid_condition_confirms(node_obj(conds), 79)
    assert (why is not None) is confirms
    if why:
        assert "Xid 79" in why and "current boot" in why


def test_a_node_without_a_boot_id_confirms_nothing() -> None:
    obj = {"status": {"conditions": [xid_cond(message="")]}}
    assert trust.xid_condition_confirms(obj, 79) is None


def test_only_unverified_lines_of_watched_xids_ask_for_a_second_signal() -> None:
    assert trust.wants_corroboration(CLF.classify(serial_entry()))
    assert not trust.wants_corroboration(CLF.classify(serial_entry(XID13)))  # the plugin does not watch 13
    verified = CLF.classify(serial_entry())
    verified["source"]["trust"] = trust.VERIFIED
    assert not trust.wants_corroboration(verified)


def test_a_corroborated_event_keeps_the_lines_own_reason_and_stays_valid() -> None:
    ev = CLF.classify(serial_entry())
    out = trust.corroborated(ev, "x" * 600)
    assert_valid_event(out)
    assert out["source"]["trust"] == trust.VERIFIED and len(str(out["source"]["trust_reason"])) == 512
    assert ev["source"]["trust"] == trust.UNVERIFIED  # the input is not changed
    short = trust.corroborated(ev, "second signal")
    assert short["source"]["trust_reason"] == f"second signal; the line itself: {trust.WHY_SERIAL_CONSOLE}"
    assert short["reason"].endswith("[corroborated: second signal]") and "unverified" not in short["reason"]


# -- reading the Node (the real client against the fake API server) ----------------------------


def test_a_serial_line_is_placed_in_its_cluster_and_believed_on_the_device_plugins_word(kube: Any) -> None:
    device_plugin(kube, 79)
    ev = CLF.classify(serial_entry())
    assert "cluster" not in ev["node"] and ev["source"]["trust"] == trust.UNVERIFIED
    out = corroborate(ev, reader_for(kube))
    assert_valid_event(out)
    assert out["node"] is not None and out["node"].get("cluster") == "train"
    assert out["source"]["trust"] == trust.VERIFIED
    assert str(out["source"]["trust_reason"]).startswith(trust.WHY_XID_CONDITION)
    assert trust.decide(out, gke_policy()).action == "REBOOT_NODE"  # the classifier's action stands


@pytest.mark.parametrize("why", ["earlier boot", "other xid", "no condition"])
def test_without_the_device_plugins_word_the_line_stays_unverified(kube: Any, why: str) -> None:
    if why == "earlier boot":
        device_plugin(kube, 79, boot="0c9a-earlier-boot")
    elif why == "other xid":
        device_plugin(kube, 48)
    out = corroborate(CLF.classify(serial_entry()), reader_for(kube))
    assert out["source"]["trust"] == trust.UNVERIFIED
    assert (
        out["node"] is not None and out["node"].get("cluster") == "train"
    )  # that cluster's Node all the same
    assert trust.decide(out, gke_policy()).action == "NONE"  # recorded and paged, not acted on


def test_a_vm_that_is_no_node_of_a_configured_cluster_is_left_alone(kube: Any) -> None:
    device_plugin(kube, 79)
    other_project = reader_for(kube, gke_policy(project="someone-elses-proj"))
    ev = CLF.classify(serial_entry())
    assert corroborate(ev, other_project) is ev
    assert other_project.reads == 0  # no cluster configured in the entry's project: nothing read
    stranger = CLF.classify(serial_entry(instance="a3-slurm-node-007"))
    reader = reader_for(kube)
    assert corroborate(stranger, reader) is stranger and reader.reads == 1  # one 404


def test_a_node_whose_provider_id_names_another_vm_is_not_this_one(kube: Any) -> None:
    device_plugin(kube, 79)
    ev = CLF.classify(serial_entry())
    ev["node"]["zone"] = "us-central1-f"  # same name, another zone: another VM
    assert corroborate(ev, reader_for(kube)) is ev


def test_a_storm_costs_one_read_per_node_per_ttl(kube: Any) -> None:
    device_plugin(kube, 79)
    now = [100.0]
    reader = reader_for(kube, clock=lambda: now[0])
    for i in range(50):
        out = corroborate(CLF.classify(serial_entry(insert_id=f"s-{i}")), reader)
        assert out["source"]["trust"] == trust.VERIFIED
    assert reader.reads == 1
    now[0] += reader.ttl_s + 0.1
    corroborate(CLF.classify(serial_entry()), reader)
    assert reader.reads == 2


def test_only_watched_xids_cost_a_read(kube: Any) -> None:
    reader = reader_for(kube)
    corroborate(CLF.classify(serial_entry(XID13)), reader)
    assert reader.reads == 0


def test_an_unreachable_cluster_leaves_the_line_as_it_was() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    clients = KubeClients(gke_policy(), PROJECT, f"http://127.0.0.1:{port}")
    ev = CLF.classify(serial_entry())
    out = corroborate(ev, NodeReader(clients))
    assert (
        out["source"]["trust"] == trust.UNVERIFIED
        and out["node"] is not None
        and "cluster" not in out["node"]
    )


def test_kube_clients_reach_only_configured_gke_clusters(kube: Any) -> None:
    clients = KubeClients(gke_policy(), PROJECT, kube.url)
    assert clients.clusters_in(PROJECT) == ["train"]
    assert clients.clusters_in("other-proj") == []
    assert clients("train") is not None and clients("train", PROJECT) is not None
    assert clients("train", "other-proj") is None and clients("infer") is None


# -- through ingest, into the incident ---------------------------------------------------------


@pytest.mark.emulator
def test_ingest_acts_on_a_corroborated_serial_line_and_records_a_bare_one(
    fs_client: firestore.Client, kube: Any
) -> None:
    pol = gke_policy(mode="observe")
    store = IncidentStore(fs_client, "pitstop")
    now = [100.0]
    ing = Ingest(pol, store, None, None, nodes=reader_for(kube, pol, clock=lambda: now[0]))
    bare = ing.handle_payload(push_body(serial_entry(insert_id="bare-1")))
    assert bare.incident is not None
    assert (bare.incident["trust"], bare.incident["action"]) == ("unverified", "NONE")
    assert bare.incident["node"] is not None and bare.incident["node"].get("cluster") == "train"
    device_plugin(kube, 79)
    now[0] += 10  # the Node is read again
    later = ing.handle_payload(push_body(serial_entry(insert_id="later-1"), message_id="4712"))
    assert later.incident is not None and later.incident["id"] == bare.incident["id"]
    assert later.result == "raised"  # a verified line of the same episode takes over
    assert (later.incident["trust"], later.incident["action"]) == ("verified", "REBOOT_NODE")
    assert "corroborated: " in later.incident["reason"] and "unverified" not in later.incident["reason"]


def test_a_control_plane_that_failed_is_not_asked_again_for_a_while() -> None:
    """clusters.get can take its full timeout: a storm must not pay it line after line."""
    from pitstop.adapters.errors import ActuatorError

    class Failing(KubeClients):
        tries = 0

        def _connect(self, cluster: str) -> Any:
            Failing.tries += 1
            raise ActuatorError(503, "clusters.get train: 503", True)

    now = [0.0]
    clients = Failing(gke_policy(), PROJECT, clock=lambda: now[0])
    reader = NodeReader(clients, clock=lambda: now[0])
    for i in range(20):
        now[0] += 1.0  # past the node cache, not past the backoff
        out = corroborate(CLF.classify(serial_entry(insert_id=f"f-{i}")), reader)
        assert out["source"]["trust"] == trust.UNVERIFIED
    assert Failing.tries == 1
    now[0] += 30.0
    assert clients("train") is None and Failing.tries == 2


# -- Pitstop's node-problem-detector (infra/gke/npd.yaml): any Xid, from the node's /dev/kmsg --------


def _npd_check(xid: int, boot_after: float) -> Any:
    from pitstop.core.corroboration import CORROBORATE

    return {
        "kind": CORROBORATE,
        "name": "c",
        "incident": "iaaaaaaaaa",
        "gpus": 8,
        "xids": [xid],
        "pcis": ["0000:a1:00"],  # the GPU the log line named (XID13's and XID79's)
        "since": boot_after,  # the episode began after the VM started
        "boot_after": boot_after,
    }


def test_an_xid_the_device_plugin_does_not_watch_is_corroborated_by_npd_on_this_boot_only(
    kube: FakeKube, api: Any
) -> None:
    """The NPD stand-in applies the deployed rule file to the VM's ring buffer and sets the Node
    condition; actuate's adapter reads it through the real `kubernetes` client; the judge believes
    Xid 13 (not one the device plugin watches) only when the kernel printed it after the VM started."""
    from pitstop.adapters.gke import GkeCluster
    from pitstop.core import corroboration
    from pitstop.core.domain import CheckRun
    from pitstop.core.scheduling import StepRef
    from pitstop.core.timefmt import to_epoch
    from pitstop.local.npd import Npd

    assert not trust.wants_corroboration(CLF.classify(serial_entry(XID13)))  # the device plugin's gap
    ring: dict[str, list[str]] = {NODE: []}
    npd = Npd(lambda: ring, kube.set_node_condition)
    sched = GkeCluster(api)
    booted = (to_epoch(kube.store.wall()) or 0.0) - 60

    def verdict(xid: int, boot_after: float = booted) -> corroboration.Verdict:
        spec = _npd_check(xid, boot_after)
        run = cast(CheckRun, sched.check_result(NODE, spec, StepRef("iaaaaaaaaa", 1)))
        return corroboration.judge(spec, run, {})

    npd.step()
    assert not verdict(13).confirmed  # a forged log line: the kernel printed nothing
    ring[NODE] = ["user-space noise", XID13]
    npd.step()
    ok = verdict(13)
    assert ok.confirmed and corroboration.NPD_CONDITION in ok.why
    assert not verdict(79).confirmed  # the kernel printed another Xid
    later = (to_epoch(kube.store.wall()) or 0.0) + 60
    assert not verdict(13, boot_after=later).confirmed  # the VM started again since: an old boot's word
