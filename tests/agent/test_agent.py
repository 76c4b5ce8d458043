"""The Slurm agent: each command runs once, hiccups are retried, other people's drains are respected.

The claim protocol runs against the agent's SQLite ledger, its results go over the Pub/Sub
emulator and actuate's side merges them into the Firestore emulator; Slurm itself is either a scripted
``run`` (to control timing and failures exactly) or the real slurmctld/slurmd of
pitstop.local.slurm (drains, requeues of array tasks and heterogeneous jobs, an unreachable
controller).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.cloud import firestore
from google.cloud.pubsub_v1 import SubscriberClient

import pitstop
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.slurm import ResultsMerger, SlurmAgentClient
from pitstop.agent.slurm import (
    DEFAULT_LEDGER,
    JOB,
    KEEP_S,
    Agent,
    CommandRefusedError,
    Ledger,
    ResultsTopic,
    SlurmCommands,
    SlurmOutputError,
    commands_for,
    is_transient,
    parse_args,
    parse_node,
    results_topic,
)
from pitstop.core.scheduling import StepRef
from pitstop.core.slurm_wire import (
    RESULT_DONE,
    RESULT_FAILED,
    RESULT_RUNNING,
    RESULT_TRANSIENT,
    Result,
    supersedes,
)
from pitstop.local.slurm import SlurmCluster

INCIDENT = "iabcdefgh2"
OTHER_INCIDENT = "izyxwvut76"
CTX = StepRef(INCIDENT, 1)
SOCKET_TIMEOUT = "scontrol exited 1: slurm_update error: Socket timed out on send/recv operation"


# -- helpers -------------------------------------------------------------------------------


SCRIPT_NODES = tuple(f"gpu-{i}" for i in range(10))


class Script:
    """A scripted Slurm: records every argv; ``answer`` decides what each call returns or raises."""

    def __init__(
        self, answer: Callable[[list[str]], str] | None = None, nodes: tuple[str, ...] = SCRIPT_NODES
    ) -> None:
        self.argvs: list[list[str]] = []
        self.answer = answer or (lambda argv: "")
        self.nodes = nodes
        self.lock = threading.Lock()

    def __call__(self, argv: list[str]) -> str:
        if argv[0] == "sinfo":  # the node list, answered here (not recorded) so scripts stay short
            return "".join(f"{n}\n" for n in self.nodes)
        with self.lock:
            self.argvs.append(list(argv))
        return self.answer(argv)

    def count(self, *head: str) -> int:
        return sum(1 for a in self.argvs if a[: len(head)] == list(head))


def command(cid: str, op: str, args: dict[str, Any], deadline_in: float = 300.0) -> bytes:
    now = time.time()
    return json.dumps(
        {"id": cid, "op": op, "args": args, "issued_at": now, "deadline": now + deadline_in}
    ).encode()


def row(ledger: Ledger, cid: str) -> Result:
    got = ledger.get(cid)
    assert got is not None
    return got[0]


def doc(results: Any, cid: str) -> dict[str, Any]:
    snap = results.document(cid).get()
    assert snap.exists
    d: dict[str, Any] = snap.to_dict()
    return d


class Loopback:
    """A Pub/Sub publisher that hands each command straight to an agent on its own thread."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.published: list[dict[str, Any]] = []

    def publish(self, topic: str, data: bytes, **attrs: str) -> Future[str]:
        self.published.append(json.loads(data))
        threading.Thread(target=self.agent.handle, args=(data,), daemon=True).start()
        done: Future[str] = Future()
        done.set_result(str(len(self.published)))
        return done


@dataclass
class Wire:
    """One cluster's result path on the emulators: the agent's ledger file, its results topic,
    actuate's ordered pull subscription on it, and the Firestore collection actuate merges into."""

    ledger_path: Path
    topic: str
    subscription: str
    results: Any
    sub: SubscriberClient
    out: ResultsTopic

    def agent(self, run: Callable[[list[str]], str] | None = None, **kw: Any) -> Agent:
        """An agent (a process of its own: its own ledger connection) on this cluster's ledger."""
        return Agent(SlurmCommands(run), Ledger(self.ledger_path), kw.pop("sink", self.out), **kw)

    def merger(self) -> ResultsMerger:
        return ResultsMerger(self.sub, self.subscription, self.results)

    def scheduler(self, agent: Agent, wait_s: float, **kw: Any) -> tuple[SlurmAgentClient, Loopback]:
        pub = Loopback(agent)
        return SlurmAgentClient(pub, "t", self.results, wait_s=wait_s, merger=self.merger(), **kw), pub

    def published(self, want: int) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """The next ``want`` result messages (attributes, body), acknowledged; fewer if none come."""
        got: list[tuple[dict[str, str], dict[str, Any]]] = []
        deadline = time.monotonic() + 10
        while len(got) < want and time.monotonic() < deadline:
            resp = self.sub.pull(request={"subscription": self.subscription, "max_messages": 50}, timeout=5)
            for m in resp.received_messages:
                got.append((dict(m.message.attributes), json.loads(m.message.data)))
                assert m.message.ordering_key == m.message.attributes["id"]
            if resp.received_messages:
                self.sub.acknowledge(
                    request={
                        "subscription": self.subscription,
                        "ack_ids": [m.ack_id for m in resp.received_messages],
                    }
                )
        return got

    def send(self, body: dict[str, Any], attrs: dict[str, str] | None = None) -> None:
        """A result message as an agent would publish it (or a malformed one)."""
        cid = str(body.get("id", "x"))
        attributes = attrs if attrs is not None else {"id": cid, "state": str(body.get("state"))}
        self.out.publisher.publish(
            self.topic, json.dumps(body).encode(), ordering_key=cid, **attributes
        ).result(timeout=30)


@pytest.fixture
def results(fs_client: firestore.Client) -> Any:
    return fs_client.collection("pitstop_slurm_results")


@pytest.fixture
def wire(pubsub_host: str, results: Any, tmp_path: Path) -> Iterator[Wire]:
    project = f"t-{uuid.uuid4().hex[:10]}"
    sub = SubscriberClient()
    out = ResultsTopic(f"projects/{project}/topics/pitstop-slurm-train-results")
    out.publisher.create_topic(name=out.topic)
    path = sub.subscription_path(project, "pitstop-slurm-train-results-actuate")
    sub.create_subscription(request={"name": path, "topic": out.topic, "enable_message_ordering": True})
    yield Wire(tmp_path / "ledger" / "agent.sqlite", out.topic, path, results, sub, out)
    sub.close()


# -- job ids, node output, failure classes (no Slurm, no emulator) ---------------------------


def test_job_ids_are_strict_and_array_and_het_ids_reach_slurm() -> None:
    for ok in ("123", "123_4", "123+0", "4294967294_4000000"):
        assert JOB.fullmatch(ok), ok
    for bad in (
        "123_",
        "123+",
        "_4",
        "123_4_5",
        "123+0+1",
        "123_4+0",
        "1_[2-3]",
        "123.batch",
        "12 3",
        "-1",
        "1;x",
    ):
        assert JOB.fullmatch(bad) is None, bad
    run = Script(
        lambda argv: (
            "123_4|RUNNING|alice|1|gpu-0|train\n77+1|RUNNING|bob|1|gpu-0|het\n9|RUNNING|c|1|gpu-0|x\n"
            if argv[0] == "squeue"
            else f"JobId={argv[-1]} JobState=PENDING Restarts=1"
            if argv[:3] == ["scontrol", "show", "job"]
            else ""
        )
    )
    clock = [1000.25]
    lifted_at: list[float] = []

    def sleep(s: float) -> None:
        clock[0] += s

    def run_at(argv: list[str]) -> str:
        if argv[:2] == ["scontrol", "update"]:
            lifted_at.append(clock[0])
        return run(argv)

    cmds = SlurmCommands(run_at, release_requeued=True, sleep=sleep, wall=lambda: clock[0])
    assert [j["id"] for j in cmds.jobs_on_node({"node": "gpu-0"})] == ["123_4", "77+1", "9"]
    assert cmds.requeue({"job": "123_4"})["requeued"] == "123_4"
    # Slurm requeues a heterogeneous job only as a whole: "scontrol requeue 77+1" is "Invalid job id"
    assert cmds.requeue({"job": "77+1"})["requeued"] == "77"
    cmds.signal({"job": "77+1", "signal": "SIGUSR1"})
    assert run.argvs[1:4] == [["scontrol", "show", "job", "-o", j] for j in ("123_4", "77+1", "9")]
    assert run.argvs[4:] == [
        ["scontrol", "requeue", "123_4"],
        ["scontrol", "show", "job", "-o", "123_4"],  # the hold is lifted once the job is PENDING again
        ["scontrol", "update", "JobId=123_4", "StartTime=now"],
        ["scontrol", "requeue", "77"],
        ["scontrol", "show", "job", "-o", "77"],
        ["scontrol", "update", "JobId=77", "StartTime=now"],
        ["scancel", "--signal=USR1", "--full", "77"],
    ]
    # seen PENDING at 1000.25: lifted at 1002.0, a whole second after the one the old run ended in
    assert lifted_at[0] == pytest.approx(1002.0)
    for bad in ("1_[2-3]", "123+0;reboot", "123 4"):
        with pytest.raises(CommandRefusedError):
            cmds.requeue({"job": bad})


def test_another_incidents_check_job_on_the_node_is_not_one_of_its_jobs() -> None:
    """Seen in the demo beside CI: a validation's NCCL check for one incident ran with its peer on a
    node whose own (held) incident was then released; that fence listed the check job among the
    node's jobs and its requeue was refused ("Requested operation is presently disabled": checks
    are --no-requeue), so the incident failed with the node fenced. A job named as Pitstop names
    checks and running in Pitstop's reservation of that name is Pitstop's own; a user job that only
    takes the name is still the node's."""
    check = "pitstop-iabcdefgh2-1-validate"
    shown = {
        "16": f"JobId=16 JobName={check} JobState=RUNNING Restarts=0 StartTime=2026-11-28T20:19:41 "
        f"Reservation={check} NodeList=gpu-[0,4]",
        "17": f"JobId=17 JobName={check} JobState=RUNNING Restarts=0 StartTime=2026-11-28T20:19:42 "
        "Reservation=(null) NodeList=gpu-4",
        "5": "JobId=5 JobName=train JobState=RUNNING Restarts=0 StartTime=2026-11-28T20:00:00 NodeList=gpu-4",
    }

    def answer(argv: list[str]) -> str:
        if argv[0] == "squeue":
            lines = [
                f"16|RUNNING|root|2|gpu-[0,4]|{check}",
                f"17|RUNNING|eve|1|gpu-4|{check}",
                "5|RUNNING|a|1|gpu-4|x",
            ]
            return "\n".join(lines) + "\n"
        return shown[argv[4]] if argv[:4] == ["scontrol", "show", "job", "-o"] else ""

    cmds = SlurmCommands(Script(answer))
    assert [j["id"] for j in cmds.jobs_on_node({"node": "gpu-4"})] == ["17", "5"]


def test_jobs_carry_their_run_from_scontrol_show_job() -> None:
    shown = {
        "5": "JobId=5 JobName=train UserId=alice(1000) JobState=RUNNING Reason=None Restarts=2 "
        "BatchFlag=1 RunTime=00:01:02 StartTime=2026-11-22T08:29:20 EndTime=Unknown NodeList=gpu-[0-1] "
        "Comment=pitstop:heartbeat",
        "6": "JobId=6 JobState=RUNNING Restarts=x StartTime= NodeList=gpu-0",
    }

    def answer(argv: list[str]) -> str:
        if argv[0] == "squeue":
            return "5|RUNNING|alice|2|gpu-[0-1]|train\n6|RUNNING|bob|1|gpu-0|odd\n7|RUNNING|c|1|gpu-0|gone\n"
        if argv[:4] == ["scontrol", "show", "job", "-o"]:
            if argv[4] in shown:
                return shown[argv[4]]
            raise RuntimeError("scontrol exited 1: slurm_load_jobs error: Invalid job id specified")
        return ""

    cmds = SlurmCommands(Script(answer))
    jobs = {j["id"]: (j["restarts"], j["start_time"]) for j in cmds.jobs_on_node({"node": "gpu-0"})}
    # malformed fields and a job that ended meanwhile are unknown (None), never guessed
    assert jobs == {"5": (2, "2026-11-22T08:29:20"), "6": (None, None), "7": (None, None)}
    state = cmds.job_state({"job": "5"})
    assert (state["state"], state["restarts"], state["start_time"]) == ("RUNNING", 2, "2026-11-22T08:29:20")
    assert (
        state.get("comment") == "pitstop:heartbeat"
    )  # its owner's opt-in to hang remediation (issue 35 (2))
    assert cmds.job_state({"job": "7"}) == {
        "job": "7",
        "state": "UNKNOWN",
        "restarts": None,
        "start_time": None,
    }


def test_node_output_is_parsed_strictly() -> None:
    line = (
        "NodeName=gpu-0 Arch=x86_64 CoresPerSocket=1 OS=Linux 6.1 #1 SMP PREEMPT_DYNAMIC @0 RealMemory=1000 "
        "State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu CfgTRES=cpu=1 "
        "Reason=admin: bad dimm x=y State=UP [root@2026-11-22T07:48:58]"
    )
    info = parse_node(line, "gpu-0")
    assert (info.state, info.reason, info.drained) == ("IDLE+DRAIN", "admin: bad dimm x=y State=UP", True)
    down = parse_node("NodeName=gpu-1 State=DOWN* Reason=Not responding [slurm@2026-11-22T07:48:58]", "gpu-1")
    assert (down.base, down.drained, down.out_of_service, down.reason) == (
        "DOWN",
        False,
        True,
        "Not responding",
    )
    idle = parse_node("NodeName=gpu-2 State=IDLE ThreadsPerCore=1\n", "gpu-2")
    assert (idle.reason, idle.out_of_service) == ("", False)
    assert parse_node("NodeName=gpu-2 State=IDLE+FAIL Reason=x [root@2026-11-22T07:48:58]", "gpu-2").drained
    for bad in (
        "",
        "NodeName=gpu-2 Arch=x86_64",  # no state
        "NodeName=gpu-3 State=IDLE",  # another node
        "NodeName=gpu-2 State=IDLE\nNodeName=gpu-2 State=IDLE",  # two records
        "NodeName=gpu-2 State=idle",  # not Slurm's spelling
    ):
        with pytest.raises(SlurmOutputError):
            parse_node(bad, "gpu-2")


def test_failures_are_classified_transient_or_final() -> None:
    import subprocess

    for text in (
        SOCKET_TIMEOUT,
        "scontrol exited 1: slurm_load_node error: Unable to contact slurm controller (connect failure)",
        "scontrol exited 1: Unexpected message received for job 5",  # requeue with slurmctld down (22.05)
        "scontrol exited 1: Slurm backup controller in standby mode",
        "scontrol exited 1: Job can not be altered now, try again later",
    ):
        assert is_transient(RuntimeError(text)), text
    assert is_transient(subprocess.TimeoutExpired(["scontrol"], 60))
    assert is_transient(BlockingIOError(11, "Resource temporarily unavailable"))
    for final in (
        RuntimeError("scontrol exited 1: slurm_update error: Invalid node name specified"),
        RuntimeError("scontrol exited 1: Invalid job id specified for job 99"),
        RuntimeError("scontrol exited 1: Job has already finished"),
        SlurmOutputError("unexpected scontrol show node output"),
        FileNotFoundError(2, "No such file or directory: 'scontrol'"),
        ValueError("bug"),
    ):
        assert not is_transient(final), final


# -- the claim protocol (SQLite ledger, results on the Pub/Sub emulator, scripted Slurm) ------


def states(msgs: list[tuple[dict[str, str], dict[str, Any]]], cid: str) -> list[str]:
    """The states published for one command, in order; attributes and body must agree."""
    for attrs, body in msgs:
        assert attrs == {"id": body["id"], "state": body["state"]}
    return [body["state"] for _, body in msgs if body["id"] == cid]


@pytest.mark.emulator
def test_concurrent_deliveries_run_a_command_once(wire: Wire) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(argv: list[str]) -> str:
        if argv[:2] == ["scontrol", "requeue"]:
            started.set()
            assert release.wait(30)
        return ""

    run = Script(slow)
    agent = wire.agent(run)
    raw = command("c-requeue-1", "requeue", {"job": "4242"})
    first: list[Result | None] = []
    t = threading.Thread(target=lambda: first.append(agent.handle(raw)))
    t.start()
    assert started.wait(30)
    # the same command redelivered (and republished by a retrying actuate) while the first runs
    assert agent.handle(raw) is None
    assert wire.agent(run).handle(raw) is None  # another agent process on the same controller
    running = row(agent.ledger, "c-requeue-1")
    assert running["state"] == RESULT_RUNNING and running["owner"] == agent.owner
    assert running["claim_until"] > time.time()
    release.set()
    t.join(30)
    assert first and first[0] is not None and first[0]["state"] == RESULT_DONE
    assert agent.handle(raw) is None  # answered: replayed, not run
    assert run.count("scontrol", "requeue") == 1
    final = row(agent.ledger, "c-requeue-1")
    answer = final["result"]
    assert final["state"] == RESULT_DONE and final["ok"]
    assert isinstance(answer, dict) and answer.get("requeued") == "4242"
    msgs = wire.published(3)
    # the claim, the answer, and the answer again for the redelivery after it
    assert states(msgs, "c-requeue-1") == [RESULT_RUNNING, RESULT_DONE, RESULT_DONE]
    assert msgs[1][1] == final and msgs[1][1]["token"] == running["token"]


@pytest.mark.emulator
def test_claim_of_a_dead_agent_is_taken_over_by_exactly_one_delivery(wire: Wire) -> None:
    run = Script()
    raw = command("c-requeue-2", "requeue", {"job": "77"})
    # a live claim is left alone
    ledger = Ledger(wire.ledger_path)
    claim: Result = {"id": "c-requeue-2", "state": RESULT_RUNNING, "owner": "other", "attempt": 1}
    assert ledger.create("c-requeue-2", {**claim, "claim_until": time.time() + 60}, time.time()) == 1
    assert ledger.create("c-requeue-2", claim, time.time()) is None  # one insert of an id wins
    assert wire.agent(run).handle(raw) is None
    assert run.argvs == []
    # the claim runs out (its agent died): two deliveries race to take it over; one wins
    assert ledger.update("c-requeue-2", {"claim_until": time.time() - 1}, 1, time.time()) is not None
    assert ledger.update("c-requeue-2", {"claim_until": 0}, 1, time.time()) is None  # a stale version
    both_read = threading.Barrier(2)

    class RacingLedger(Ledger):
        def get(self, cid: str) -> tuple[Result, int] | None:
            got = super().get(cid)
            both_read.wait(10)  # both have read the same expired claim before either writes
            return got

    outcomes: list[dict[str, Any] | None] = []
    agents = [Agent(SlurmCommands(run), RacingLedger(wire.ledger_path), wire.out) for _ in range(2)]
    threads = [threading.Thread(target=lambda a=a: outcomes.append(a.handle(raw))) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert run.count("scontrol", "requeue") == 1
    assert sorted(o is None for o in outcomes) == [False, True]
    final = row(ledger, "c-requeue-2")
    assert final["state"] == RESULT_DONE and final["attempt"] == 2
    assert states(wire.published(2), "c-requeue-2") == [RESULT_RUNNING, RESULT_DONE]


@pytest.mark.emulator
def test_transient_failure_runs_again_final_failure_is_replayed(wire: Wire) -> None:
    hiccups = [SOCKET_TIMEOUT]

    def flaky(argv: list[str]) -> str:
        if argv[:2] == ["scontrol", "requeue"] and hiccups:
            raise RuntimeError(hiccups.pop())
        return ""

    run = Script(flaky)
    agent = wire.agent(run)
    raw = command("c-requeue-3", "requeue", {"job": "88"})
    first = agent.handle(raw)
    assert (
        first is not None and first["state"] == "transient" and "Socket timed out" in (first["error"] or "")
    )
    second = agent.handle(raw)  # the retry runs a new attempt
    assert second is not None and second["state"] == RESULT_DONE and second["attempt"] == 2
    assert second["previous_error"] == first["error"]
    assert agent.handle(raw) is None
    assert run.count("scontrol", "requeue") == 2
    msgs = wire.published(5)
    assert states(msgs, "c-requeue-3") == ["running", "transient", "running", "done", "done"]
    assert [m[1]["attempt"] for m in msgs] == [1, 1, 2, 2, 2]

    def invalid(argv: list[str]) -> str:
        raise RuntimeError("scontrol exited 1: slurm_update error: Invalid node name specified")

    bad = Script(invalid)
    agent = wire.agent(bad)
    raw = command("c-drain-4", "drain", {"node": "gpu-9", "incident": INCIDENT, "action": "REBOOT_NODE"})
    failed = agent.handle(raw)
    assert failed is not None and failed["state"] == RESULT_FAILED and not failed["refused"]
    assert agent.handle(raw) is None  # final: replayed, never run again
    assert len(bad.argvs) == 1


@pytest.mark.emulator
def test_expired_command_is_refused_once_and_never_run(wire: Wire) -> None:
    run = Script()
    agent = wire.agent(run)
    refused = agent.handle(command("c-requeue-5", "requeue", {"job": "5"}, deadline_in=-10))
    assert refused is not None and refused["state"] == RESULT_FAILED and refused["refused"]
    # an old copy of a command whose last attempt failed transiently: left for the fresh copy
    transient: Result = {
        "id": "c-requeue-6",
        "state": "transient",
        "ok": False,
        "attempt": 1,
        "error": SOCKET_TIMEOUT,
    }
    agent.ledger.create("c-requeue-6", transient, time.time())
    assert agent.handle(command("c-requeue-6", "requeue", {"job": "6"}, deadline_in=-10)) is None
    assert row(agent.ledger, "c-requeue-6")["state"] == "transient"
    assert run.argvs == []
    fresh = agent.handle(command("c-requeue-6", "requeue", {"job": "6"}))
    assert fresh is not None and fresh["state"] == RESULT_DONE
    assert row(agent.ledger, "c-requeue-6")["previous_error"] == SOCKET_TIMEOUT
    assert states(wire.published(3), "c-requeue-5") == [RESULT_FAILED]


def test_ledger_is_wal_and_old_rows_are_pruned(tmp_path: Path) -> None:
    """The ledger stays bounded: rows older than KEEP_S go (every command expires long before)."""
    ledger = Ledger(tmp_path / "deep" / "ledger.sqlite")
    assert ledger._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    now = time.time()
    ledger.create("old", {"id": "old", "state": RESULT_DONE}, now - KEEP_S - 60)
    ledger.create("new", {"id": "new", "state": RESULT_DONE}, now - 60)
    agent = Agent(SlurmCommands(Script()), ledger, Sink(), clock=lambda: now)
    agent.prune()
    assert ledger.get("old") is None and ledger.get("new") is not None
    # a copy of the pruned command is past its deadline: refused, never run
    assert ledger.get("old") is None
    again = agent.handle(json.dumps({"id": "old", "op": "requeue", "deadline": now - KEEP_S}).encode())
    assert again is not None and again["refused"]


# An agent process that dies inside its command: the Slurm call was made (written to a file),
# nothing after it ran (no answer recorded, no release: os._exit skips every handler).
CRASHING_AGENT = """
import os, sys
from pitstop.agent.slurm import Agent, Ledger, SlurmCommands

def run(argv):
    if argv[0] == "sinfo":
        return "gpu-0\\n"
    with open(sys.argv[2], "a") as f:
        f.write(" ".join(argv) + "\\n")
    os._exit(9)

class Quiet:
    def send(self, doc):
        pass

Agent(SlurmCommands(run), Ledger(sys.argv[1]), Quiet(), owner="crashed").handle(sys.argv[3].encode())
"""


def test_a_crash_between_running_and_done_is_found_on_retry_and_not_repeated(tmp_path: Path) -> None:
    """The claim is recorded before the Slurm call, so a delivery after the agent died finds it:
    while the claim holds nothing runs again; past it, exactly one new attempt runs, and its answer
    is replayed from then on."""
    path, effects = tmp_path / "ledger.sqlite", tmp_path / "effects"
    raw = command("c-requeue-9", "requeue", {"job": "99"}, deadline_in=86400)
    env = {**os.environ, "PYTHONPATH": str(Path(pitstop.__file__).parents[1])}
    argv = [sys.executable, "-c", CRASHING_AGENT, str(path), str(effects), raw.decode()]
    assert subprocess.run(argv, env=env, timeout=120, check=False).returncode == 9
    assert effects.read_text().splitlines() == ["scontrol requeue 99"]
    ledger = Ledger(path)
    left = row(ledger, "c-requeue-9")
    assert (left["state"], left["owner"], left["attempt"]) == (RESULT_RUNNING, "crashed", 1)
    run, sink = Script(), Sink()
    assert Agent(SlurmCommands(run), ledger, sink).handle(raw) is None  # found in progress: left
    assert run.argvs == [] and sink.sent == []
    assert row(ledger, "c-requeue-9") == left
    later = float(left["claim_until"]) + 1  # the claim ran out: its agent is gone
    taker = Agent(SlurmCommands(run), ledger, sink, clock=lambda: later)
    done = taker.handle(raw)
    assert done is not None and (done["state"], done["attempt"]) == (RESULT_DONE, 2)
    assert done["previous_error"] is None and done["owner"] == taker.owner
    assert taker.handle(raw) is None and Agent(SlurmCommands(run), ledger, sink).handle(raw) is None
    assert run.count("scontrol", "requeue") == 1
    assert [d["state"] for d in sink.sent] == [RESULT_RUNNING, RESULT_DONE, RESULT_DONE, RESULT_DONE]
    assert sink.sent[1] == row(ledger, "c-requeue-9")


class Sink:
    """Records what the agent publishes; ``fail`` drops (raises) the next answer in that state."""

    def __init__(self, fail: str | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.fail = fail

    def send(self, doc: Mapping[str, Any]) -> None:
        if doc["state"] == self.fail:
            self.fail = None
            raise RuntimeError("503 publish failed")
        self.sent.append(dict(doc))


class Publisher:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, topic: str, data: bytes, **attrs: str) -> Future[str]:
        self.published.append(json.loads(data))
        done: Future[str] = Future()
        done.set_result("1")
        return done


@pytest.mark.emulator
def test_reader_retries_running_and_transient_and_stops_on_final(results: Any) -> None:
    pub = Publisher()
    sched = SlurmAgentClient(pub, "t", results, wait_s=0.3)

    def put(op: str, args: dict[str, Any], fields: dict[str, Any]) -> None:
        import hashlib

        digest = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:8]
        results.document(f"{CTX.key}-{op}-{digest}".lower()).set({"op": op, **fields})

    def status(fn: Callable[[], Any]) -> tuple[int, bool]:
        with pytest.raises(ActuatorError) as e:
            fn()
        return e.value.status, e.value.retryable

    put(
        "requeue",
        {"job": "1"},
        {"state": RESULT_FAILED, "ok": False, "refused": False, "error": "Invalid job id"},
    )
    assert status(lambda: sched.requeue("1", CTX)) == (409, False)  # final: the workflow stops
    put("requeue", {"job": "2"}, {"ok": False, "refused": False, "error": "from an agent of before"})
    assert status(lambda: sched.requeue("2", CTX)) == (409, False)
    assert pub.published == []
    put("requeue", {"job": "3"}, {"state": RESULT_RUNNING, "attempt": 1, "claim_until": time.time() + 60})
    assert status(lambda: sched.requeue("3", CTX)) == (503, True)
    assert pub.published == []  # running: wait, do not ask again
    put("requeue", {"job": "4"}, {"state": RESULT_RUNNING, "attempt": 1, "claim_until": time.time() - 1})
    assert status(lambda: sched.requeue("4", CTX)) == (503, True)
    put("requeue", {"job": "5"}, {"state": "transient", "ok": False, "error": SOCKET_TIMEOUT})
    assert status(lambda: sched.requeue("5", CTX)) == (503, True)
    assert [p["args"]["job"] for p in pub.published] == ["4", "5"]  # a new attempt asked for each
    put("requeue", {"job": "6"}, {"state": RESULT_DONE, "ok": True, "result": {"job": "6"}})
    sched.requeue("6", CTX)


@pytest.mark.emulator
def test_scheduler_sees_a_hiccup_as_retryable_and_the_retry_runs_it(wire: Wire) -> None:
    hiccups = [SOCKET_TIMEOUT]

    def flaky(argv: list[str]) -> str:
        if argv[:2] == ["scontrol", "requeue"] and hiccups:
            raise RuntimeError(hiccups.pop())
        return ""

    run = Script(flaky)
    sched, pub = wire.scheduler(wire.agent(run), wait_s=10)
    with pytest.raises(ActuatorError) as e:
        sched.requeue("123_4", CTX)
    assert (e.value.status, e.value.retryable) == (503, True)  # actuate answers 503; the workflow retries
    sched.requeue("123_4", CTX)  # the workflow's retry: same command id, a new attempt
    sched.requeue("123_4", CTX)  # a later replay: answered from the record
    assert run.count("scontrol", "requeue", "123_4") == 2
    assert len(pub.published) == 2


# -- results over Pub/Sub: merged forward only, a lost one recovered -------------------------


def test_a_result_only_ever_moves_forward() -> None:
    def r(state: str, attempt: int) -> dict[str, Any]:
        return {"state": state, "attempt": attempt}

    assert supersedes(r("running", 1), None)
    assert not supersedes(r("running", 1), r("done", 1))  # a late claim never hides the answer
    assert not supersedes(r("failed", 3), r("done", 1))  # nothing replaces a final state
    assert supersedes(r("done", 1), r("running", 2))
    assert not supersedes(r("running", 1), r("transient", 1))  # its own attempt's later state
    assert supersedes(r("running", 2), r("transient", 1))  # a new attempt
    assert not supersedes(r("transient", 1), r("running", 2))
    assert not supersedes(r("running", 1), r("running", 1))


def take(merger: ResultsMerger, n: int) -> None:
    """Pull until ``n`` result messages have been merged (or dropped) and acknowledged."""
    got, deadline = 0, time.monotonic() + 20
    while got < n and time.monotonic() < deadline:
        got += merger.pull()
    assert got == n


@pytest.mark.emulator
def test_scheduler_merges_results_forward_only(wire: Wire) -> None:
    import hashlib

    cid = f"{CTX.key}-requeue-{hashlib.sha256(json.dumps({'job': '9'}).encode()).hexdigest()[:8]}".lower()
    merger = wire.merger()
    done = {
        "id": cid,
        "op": "requeue",
        "state": RESULT_DONE,
        "ok": True,
        "attempt": 1,
        "result": {"job": "9"},
    }
    wire.send(done)
    # a claim message that arrives late (an earlier publish, a redelivery) must not undo the answer
    wire.send({"id": cid, "op": "requeue", "state": RESULT_RUNNING, "attempt": 1, "claim_until": 1e12})
    wire.send({"id": "other-cmd", "state": RESULT_TRANSIENT, "attempt": 1})  # another command's
    wire.send({"id": "x-1", "state": RESULT_DONE}, attrs={"id": "x-2", "state": "done"})  # mismatched
    wire.send({"id": "x-3", "state": "exploded"})  # no such state
    take(merger, 5)
    stored = doc(wire.results, cid)
    assert stored == {**done, "source": wire.subscription}
    pub = Publisher()
    sched = SlurmAgentClient(pub, "t", wire.results, wait_s=5, merger=merger)
    sched.requeue("9", CTX)
    assert pub.published == []  # answered from the merged record: not asked again
    assert doc(wire.results, "other-cmd")["state"] == RESULT_TRANSIENT  # merged for other instances
    assert not wire.results.document("x-1").get().exists and not wire.results.document("x-3").get().exists
    # within an attempt: running never hides the transient answer; a new attempt does move on
    wire.send({"id": "other-cmd", "state": RESULT_RUNNING, "attempt": 1})
    take(merger, 1)
    assert doc(wire.results, "other-cmd")["state"] == RESULT_TRANSIENT
    wire.send({"id": "other-cmd", "state": RESULT_RUNNING, "attempt": 2})
    take(merger, 1)
    assert doc(wire.results, "other-cmd") == {
        "id": "other-cmd",
        "state": RESULT_RUNNING,
        "attempt": 2,
        "source": wire.subscription,
    }
    # a record another cluster's agent put there is not taken as this cluster's answer
    infer = "projects/p/subscriptions/pitstop-slurm-infer-results-actuate"
    wire.results.document(cid).update({"source": infer})
    with pytest.raises(ActuatorError) as e:
        sched.requeue("9", CTX)
    assert (e.value.status, e.value.retryable) == (409, False) and "another cluster" in str(e.value)


class Lossy:
    """The results topic, except that the first final answer is lost without a trace."""

    def __init__(self, out: ResultsTopic) -> None:
        self.out, self.lost = out, 0

    def send(self, doc: Result) -> None:
        if doc["state"] in (RESULT_DONE, RESULT_FAILED) and not self.lost:
            self.lost += 1
            return
        self.out.send(doc)


@pytest.mark.emulator
def test_a_lost_result_is_recovered_by_the_commands_redelivery(wire: Wire) -> None:
    run = Script()
    # the answer's publish fails: the delivery raises (serve nacks it), the ledger keeps the answer
    sink = Sink(fail=RESULT_DONE)
    agent = wire.agent(run, sink=sink)
    raw = command("c-requeue-8", "requeue", {"job": "8"})
    with pytest.raises(RuntimeError, match="publish failed"):
        agent.handle(raw)
    assert row(agent.ledger, "c-requeue-8")["state"] == RESULT_DONE
    assert [d["state"] for d in sink.sent] == [RESULT_RUNNING]
    assert agent.handle(raw) is None  # Pub/Sub's redelivery: not run again, the answer published
    assert [d["state"] for d in sink.sent] == [RESULT_RUNNING, RESULT_DONE]
    assert sink.sent[1] == row(agent.ledger, "c-requeue-8")
    assert run.count("scontrol", "requeue") == 1

    # end to end: the answer's message is lost without a trace (the command was acknowledged);
    # actuate asks again once the claim has lapsed, and that delivery publishes the answer again
    lossy = Lossy(wire.out)
    later = [0.0]
    sched, pub = wire.scheduler(
        wire.agent(run, sink=lossy, claim_s=60), wait_s=3, clock=lambda: time.time() + later[0]
    )
    with pytest.raises(ActuatorError) as e:
        sched.requeue("31", CTX)
    assert (e.value.status, e.value.retryable) == (503, True)
    assert lossy.lost == 1 and len(pub.published) == 1 and run.count("scontrol", "requeue", "31") == 1
    later[0] = 120.0  # past the claim: actuate asks again (same id), the agent replays its ledger
    sched.requeue("31", CTX)
    assert len(pub.published) == 2 and run.count("scontrol", "requeue", "31") == 1


# -- the real Slurm ------------------------------------------------------------------------

NODES = ["pa-0", "pa-1", "pa-2"]


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="pitstop-agent-slurm-")), NODES).start()
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before


@pytest.fixture
def real(slurm: SlurmCluster, wire: Wire) -> Iterator[tuple[SlurmCluster, SlurmAgentClient]]:
    agent = Agent(SlurmCommands(release_requeued=False), Ledger(wire.ledger_path), wire.out)
    yield slurm, wire.scheduler(agent, wait_s=30)[0]
    slurm._out(["scancel", "--full", "--quiet", "-u", "root"])
    for n in NODES:
        slurm._out(["scontrol", "update", f"NodeName={n}", "State=RESUME"])
    slurm.wait_idle(len(NODES))


def _reason(slurm: SlurmCluster, node: str) -> tuple[str, str]:
    info = parse_node(slurm._out(["scontrol", "show", "node", "-o", node]), node)
    return info.state, info.reason


def _wait(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.3)
    raise TimeoutError(what)


def _restarts(slurm: SlurmCluster, job: str) -> int:
    out = slurm._out(["scontrol", "show", "job", "-o", job]).splitlines()[0]
    return int(next(t for t in out.split() if t.startswith("Restarts=")).split("=", 1)[1])


def _sbatch(slurm: SlurmCluster, *args: str) -> str:
    import subprocess

    out = subprocess.run(
        ["sbatch", "--parsable", "--requeue", "-o", "/dev/null", *args],
        env=slurm.env,
        capture_output=True,
        text=True,
        check=True,
        cwd=slurm.workdir,
    ).stdout
    return out.strip().split(";")[0]


@pytest.mark.emulator
def test_array_task_and_het_job_component_are_requeued(real: tuple[SlurmCluster, SlurmAgentClient]) -> None:
    slurm, sched = real
    array = _sbatch(slurm, "-a", "0-1", "-N", "1", "--wrap", "sleep 600")
    _wait(lambda: sum(j["state"] == "RUNNING" for j in slurm.jobs()) == 2, "array tasks running")
    task = next(j for j in slurm.jobs() if j["id"] == f"{array}_0")
    assert [j["id"] for j in sched.jobs_on(task["nodes"], CTX)] == [f"{array}_0"]
    sched.requeue(f"{array}_0", CTX)
    assert _restarts(slurm, f"{array}_0") == 1 and _restarts(slurm, f"{array}_1") == 0
    slurm._out(["scancel", "--full", "--quiet", array])
    _wait(lambda: not slurm.jobs(), "array cancelled")

    het = _sbatch(slurm, "-N", "1", "--wrap", "sleep 600", ":", "-N", "1", "--wrap", "sleep 600")
    _wait(lambda: sum(j["state"] == "RUNNING" for j in slurm.jobs()) == 2, "het job running")
    comp = next(j for j in slurm.jobs() if j["id"] == f"{het}+1")
    assert [j["id"] for j in sched.jobs_on(comp["nodes"], CTX)] == [f"{het}+1"]
    sched.requeue(f"{het}+1", CTX)
    assert _restarts(slurm, het) == 1  # the whole heterogeneous job went back to the queue
    assert sched.job_state(f"{het}+1", CTX) in ("PENDING", "COMPLETING", "REQUEUED")


@pytest.mark.emulator
def test_a_requeue_starts_a_new_run_of_the_job(real: tuple[SlurmCluster, SlurmAgentClient]) -> None:
    slurm, sched = real
    job = _sbatch(slurm, "-N", "1", "--wrap", "sleep 600")
    _wait(lambda: any(j["id"] == job and j["state"] == "RUNNING" for j in slurm.jobs()), "job running")
    node = next(j for j in slurm.jobs() if j["id"] == job)["nodes"]
    (fenced,) = sched.jobs_on(node, CTX)
    assert fenced["id"] == job and fenced["restarts"] == 0 and fenced["start_time"]
    now = sched.job_info(job, CTX)
    assert (now["restarts"], now["start_time"]) == (fenced["restarts"], fenced["start_time"])  # same run
    sched.requeue(job, CTX)
    # another run, whatever its start time reads while it waits (probes are answered per 2 s bucket)
    _wait(lambda: sched.job_info(job, CTX)["restarts"] == 1, "the requeue counted")


@pytest.mark.emulator
def test_admin_drain_before_the_fault_stays_after_the_incident(
    real: tuple[SlurmCluster, SlurmAgentClient],
) -> None:
    slurm, sched = real
    slurm._out(["scontrol", "update", "NodeName=pa-1", "State=DRAIN", "Reason=admin: bad DIMM, ticket 42"])
    fenced = sched.fence("pa-1", CTX, "REBOOT_NODE")
    assert fenced is not None
    assert fenced["already_drained_by_other"] is True
    assert (fenced["previous_state"], fenced["previous_reason"]) == (
        "IDLE+DRAIN",
        "admin: bad DIMM, ticket 42",
    )
    assert _reason(slurm, "pa-1") == ("IDLE+DRAIN", "admin: bad DIMM, ticket 42")
    unfenced = sched.unfence("pa-1", CTX)
    assert unfenced is not None and unfenced["left_drained"] == "admin: bad DIMM, ticket 42"
    assert _reason(slurm, "pa-1") == ("IDLE+DRAIN", "admin: bad DIMM, ticket 42")


@pytest.mark.emulator
def test_own_drain_is_lifted_only_for_its_incident(real: tuple[SlurmCluster, SlurmAgentClient]) -> None:
    slurm, sched = real
    fenced = sched.fence("pa-2", CTX, "REBOOT_NODE")
    assert fenced is not None and fenced["already_drained_by_other"] is False
    assert fenced["previous_state"] == "IDLE" and fenced["reason"] == f"pitstop {INCIDENT} REBOOT_NODE"
    assert _reason(slurm, "pa-2") == ("IDLE+DRAIN", f"pitstop {INCIDENT} REBOOT_NODE")
    # another incident (or a later one on the same node) does not lift this incident's drain
    other = sched.unfence("pa-2", StepRef(OTHER_INCIDENT, 1))
    assert other is not None and other["left_drained"] == f"pitstop {INCIDENT} REBOOT_NODE"
    assert "DRAIN" in _reason(slurm, "pa-2")[0]
    own = sched.unfence("pa-2", CTX)
    assert own is not None and own["resumed"] is True
    _wait(lambda: _reason(slurm, "pa-2")[0] == "IDLE", "pa-2 back in service")


@pytest.mark.emulator
@pytest.mark.parametrize(
    ("reason", "theirs"),
    [("bad fan, RMA 1234", True), ("Not responding", False)],
    ids=["person", "slurmctld"],
)
def test_down_node_gets_pitstops_drain_keeping_the_old_reason(
    real: tuple[SlurmCluster, SlurmAgentClient], reason: str, theirs: bool
) -> None:
    # DOWN alone is no fence: with ReturnToService=2 Slurm returns the node as soon as its slurmd
    # registers again, i.e. right after Pitstop's reboot, before it is validated. Issue 21 (9): a DOWN
    # a person set ("bad fan, RMA 1234") is theirs: unfence leaves it out of service with their reason.
    slurm, sched = real
    slurm._out(["scontrol", "update", "NodeName=pa-0", "State=DOWN", f"Reason={reason}"])
    fenced = sched.fence("pa-0", CTX, "REBOOT_NODE")
    assert fenced is not None and fenced["already_drained_by_other"] is False
    assert (fenced["previous_state"], fenced["previous_reason"]) == ("DOWN", reason)
    want = f"pitstop {INCIDENT} REBOOT_NODE (was DOWN: {reason})"
    assert _reason(slurm, "pa-0") == ("DOWN+DRAIN", want)
    own = sched.unfence("pa-0", CTX)
    assert own is not None and own["resumed"] is not theirs
    if theirs:
        assert own["left_drained"].startswith(f"DOWN: {reason}")
        state, kept = _reason(slurm, "pa-0")
        assert "DRAIN" in state and kept == reason, (state, kept)  # out of service, with their reason
        slurm._out(["scontrol", "update", "NodeName=pa-0", "State=RESUME"])


@pytest.mark.emulator
def test_unreachable_controller_is_a_transient_failure_then_the_retry_runs(
    real: tuple[SlurmCluster, SlurmAgentClient], wire: Wire
) -> None:
    slurm, _ = real
    dead = slurm.workdir / "dead.conf"
    dead.write_text(
        "\n".join(
            "SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line
            for line in slurm.conf.read_text().splitlines()
        )
        + "\n"
    )

    def via(conf: Path) -> Callable[[list[str]], str]:
        import subprocess

        def run(argv: list[str]) -> str:
            env = {**os.environ, "SLURM_CONF": str(conf), "SLURM_TIME_FORMAT": "standard"}
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
            return proc.stdout

        return run

    raw = command("c-drain-7", "drain", {"node": "pa-1", "incident": INCIDENT, "action": "RESET_GPU"})
    first = wire.agent(via(dead)).handle(raw)
    assert first is not None and first["state"] == "transient"
    assert "Unable to contact slurm controller" in (first["error"] or "")
    second = wire.agent(via(slurm.conf)).handle(raw)
    assert second is not None and second["state"] == RESULT_DONE and second["attempt"] == 2
    assert _reason(slurm, "pa-1") == ("IDLE+DRAIN", f"pitstop {INCIDENT} RESET_GPU")


def test_only_nodes_slurm_lists_are_acted_on() -> None:
    """A command naming a host that is not one of this cluster's Slurm nodes runs nothing."""
    run = Script(nodes=("gpu-0", "gpu-1"))
    cmds = SlurmCommands(run)
    for op, args in (
        ("drain", {"node": "gpu-7", "incident": INCIDENT, "action": "REBOOT_NODE"}),
        ("resume", {"node": "gpu-7", "incident": INCIDENT}),
        ("jobs_on_node", {"node": "other-cluster-vm"}),
        ("node_state", {"node": "gpu-7"}),
    ):
        with pytest.raises(CommandRefusedError, match="not a node of this Slurm cluster"):
            cmds.execute(op, args)
    assert run.argvs == []  # not one scontrol or squeue
    assert cmds.execute("jobs_on_node", {"node": "gpu-1"}) == []
    assert run.argvs == [["squeue", "-h", "-w", "gpu-1", "-o", "%i|%T|%u|%D|%N|%j"]]


def test_a_node_added_to_slurm_is_accepted_once_the_list_is_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = Script(nodes=("gpu-0",))
    cmds = SlurmCommands(run)
    assert cmds.execute("jobs_on_node", {"node": "gpu-0"}) == []
    run.nodes = ("gpu-0", "gpu-1")
    clock = [time.monotonic() + 10]  # past MEMBERS_REFRESH_S
    monkeypatch.setattr("pitstop.agent.slurm.time.monotonic", lambda: clock[0])
    assert cmds.execute("jobs_on_node", {"node": "gpu-1"}) == []


def test_requeued_jobs_are_released_at_once_unless_the_hold_is_kept() -> None:
    """scontrol requeue holds a job until BeginTime (~2 min on); the agent lifts it by default."""
    base = ["--subscription", "s", "--results-topic", "r"]
    assert commands_for(parse_args(base)).jobs.release_requeued is True
    assert commands_for(parse_args([*base, "--keep-requeue-hold"])).jobs.release_requeued is False
    assert commands_for(parse_args([*base, "--release-requeued"])).jobs.release_requeued is True


def test_results_topic_and_ledger_arguments() -> None:
    """The unit passes a topic id (``pitstop-slurm-<c>-results``); a full path works too. No
    Firestore option is left: the agent answers only over its results topic."""
    args = parse_args(
        ["--project", "p", "--subscription", "s", "--results-topic", "pitstop-slurm-a3-results"]
    )
    assert results_topic(args) == "projects/p/topics/pitstop-slurm-a3-results"
    assert args.ledger == DEFAULT_LEDGER == "/var/lib/pitstop/agent-ledger.sqlite"
    full = parse_args(["--subscription", "s", "--results-topic", "projects/q/topics/t", "--ledger", "/x.db"])
    assert results_topic(full) == "projects/q/topics/t" and full.ledger == "/x.db"
    with pytest.raises(SystemExit):
        parse_args(["--subscription", "s"])  # without a results topic the agent could answer nothing
    import pitstop.agent.slurm as agent_mod

    package = Path(agent_mod.__file__).parent
    for module in sorted(package.glob("*.py")):  # the code of every module, past its docstring
        assert "firestore" not in module.read_text().split('"""', 2)[2].lower(), module.name


def test_stopping_a_cluster_ends_its_job_processes_and_nothing_that_only_inherited_its_conf(
    tmp_path: Path,
) -> None:
    """A job step can outlive slurmd, so stop() ends it; an emulator a test started while SLURM_CONF
    was set (seen in CI: the session's Pub/Sub emulator killed, every later test hanging) is not
    a job's, and lives on."""
    import shutil
    import subprocess

    cluster = SlurmCluster(tmp_path, ["n1"])
    stepd = tmp_path / "slurmstepd"  # /proc/PID/comm is the executable's name
    shutil.copy("/bin/sleep", stepd)
    conf = {**os.environ, "SLURM_CONF": str(cluster.conf)}
    job = subprocess.Popen(["sleep", "300"], env={**conf, "SLURM_JOB_ID": "7"})
    step = subprocess.Popen([str(stepd), "300"], env=conf)
    bystander = subprocess.Popen(["sleep", "300"], env=conf)
    other = subprocess.Popen(
        ["sleep", "300"], env={**conf, "SLURM_CONF": "/elsewhere/slurm.conf", "SLURM_JOB_ID": "7"}
    )
    try:
        time.sleep(0.2)  # exec done: /proc shows the new image's name
        cluster._end_strays()
        assert job.wait(10) == -9 and step.wait(10) == -9
        assert bystander.poll() is None and other.poll() is None
    finally:
        for p in (job, step, bystander, other):
            p.kill()
            p.wait()
