"""`pitstop pause`, `resume`, `mode` and `silence` on the Firestore emulator: each change audited (who,
when, why) and shown by `pitstop incidents`; the control's store port alike in memory and Firestore."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import firestore

from pitstop.adapters.firestore_control import FirestoreControl
from pitstop.adapters.memory_control import MemoryControl
from pitstop.core import control
from pitstop.core.control import Control, ControlStore
from pitstop.tools import cli, control_ops

pytestmark = pytest.mark.emulator
T0 = 1_800_000_000.0


@pytest.fixture(params=["memory", "firestore"])
def store(request: pytest.FixtureRequest) -> Iterator[ControlStore]:
    if request.param == "memory":
        yield MemoryControl()
        return
    request.getfixturevalue("firestore_host")
    yield FirestoreControl(firestore.Client(project=f"t-{uuid.uuid4().hex[:12]}"))


def test_changes_are_kept_with_their_audit_records_in_order(store: ControlStore) -> None:
    assert store.read_control() is None
    store.change_control(lambda d: control.pause(d, "train", {"by": "a", "at": T0, "reason": "r1"}))
    store.change_control(
        lambda d: control.silence(d, "node", "a3-node-001", 60, {"by": "b", "at": T0 + 1, "reason": "r2"})
    )
    got = Control.of(store.read_control())
    assert got.version == 2 and got.pause("train") is not None and got.silences(T0 + 2)
    assert [(c["verb"], c["by"]) for c in store.control_changes(T0)] == [("pause", "a"), ("silence", "b")]
    assert [c["verb"] for c in store.control_changes(T0 + 1)] == ["silence"]


def test_two_people_changing_at_once_both_count(store: ControlStore) -> None:
    """Each change reads, decides and writes in one transaction: neither overwrites the other."""

    def silence(node: str) -> None:
        store.change_control(
            lambda d: control.silence(d, "node", node, 600, {"by": node, "at": T0, "reason": ""})
        )

    threads = [threading.Thread(target=silence, args=(f"a3-node-{i:03d}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = Control.of(store.read_control())
    assert got.version == 4 and len(got.silences(T0 + 1)) == 4
    assert sorted(c["version"] for c in store.control_changes(T0)) == [1, 2, 3, 4]


def test_a_change_that_loses_every_commit_race_of_one_transaction_is_run_again(
    firestore_host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load the emulator answers a contended commit "Transaction lock timeout" (Aborted); the
    client retries it at once five times, then raises ValueError (a fresh-clone CI run lost a
    person's silence so). The change is run again after a wait and lands once."""
    from google.api_core import exceptions as gexc
    from google.cloud.firestore_v1 import transaction as fs_transaction

    real = fs_transaction.Transaction._commit
    lost = {"n": 0}

    def commit(self: fs_transaction.Transaction) -> object:
        if lost["n"] < 6:  # more than one transaction's own attempts
            lost["n"] += 1
            raise gexc.Aborted("Transaction lock timeout.")  # type: ignore[no-untyped-call]
        return real(self)

    monkeypatch.setattr(fs_transaction.Transaction, "_commit", commit)
    store = FirestoreControl(firestore.Client(project=f"t-{uuid.uuid4().hex[:12]}"))
    store.change_control(lambda d: control.pause(d, "train", {"by": "a", "at": T0, "reason": "r"}))
    got = Control.of(store.read_control())
    assert lost["n"] == 6 and got.version == 1 and got.pause("train") is not None
    assert [c["version"] for c in store.control_changes(T0)] == [1]


@pytest.fixture
def project(firestore_host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A project of its own on the emulator, and a policy that configures cluster train."""
    pol = tmp_path / "policy.yaml"
    cluster = {"name": "train", "scheduler": "slurm", "match": {"name_pattern": "a3-*"}}
    pol.write_text(json.dumps({"mode": "observe", "clusters": [cluster]}))
    monkeypatch.setenv("PITSTOP_POLICY", str(pol))
    monkeypatch.delenv("PITSTOP_FIRESTORE_DATABASE", raising=False)
    return f"t-{uuid.uuid4().hex[:12]}"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    got = capsys.readouterr()
    return rc, got.out + got.err


def test_pause_silence_mode_and_resume_from_the_command_line(
    project: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = ("--project", project)
    rc, out = run(capsys, "pause", "--reason", "bad reset storm", "--by", "alice", *p)
    assert rc == 0 and "pause   everything" in out and "by alice: bad reset storm" in out
    assert "PAUSED: everything, by alice" in out  # what is in force now
    rc, out = run(capsys, "pause", "--reason", "again", "--by", "bob", *p)
    assert rc == 2 and "already paused (everything) by alice" in out
    rc, out = run(
        capsys, "silence", "--node", "a3-node-007", "--for", "4h", "--reason", "rack 7", "--by", "carol", *p
    )
    assert rc == 0 and "silence node a3-node-007" in out
    sid = next(w for w in out.split() if w.startswith("(s")).strip("(")
    rc, out = run(capsys, "silence", "--list", *p)
    assert rc == 0 and sid in out and "a3-node-007" in out and "active" in out
    rc, out = run(
        capsys, "mode", "enforce", "--cluster", "train", "--reason", "train first", "--by", "dan", *p
    )
    assert rc == 0 and "mode enforce: cluster train, by dan" in out
    rc, out = run(capsys, "mode", "enforce", "--cluster", "nope", "--reason", "x", "--by", "dan", *p)
    assert rc == 2 and "the policy has no cluster 'nope'" in out
    rc, out = run(capsys, "silence", "--expire", sid, "--by", "carol", "--reason", "rack fixed", *p)
    assert rc == 0 and f"({sid})" in out
    rc, out = run(capsys, "resume", "--by", "alice", "--reason", "storm understood", *p)
    assert rc == 0 and "lifted: everything" in out
    rc, out = run(capsys, "incidents", *p)  # every change of the week, with who and why
    assert rc == 0 and "runtime control changes in the last 7 days" in out
    assert [v for v in ("pause ", "silence", "mode ", "expire", "resume") if v not in out] == []
    assert "by carol: rack fixed" in out and "mode enforce: cluster train" in out  # still in force


def test_who_is_gclouds_account_unless_by_names_someone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "gcloud"
    fake.write_text("#!/bin/sh\n[ \"$*\" = 'config get-value account' ] && echo erin@example.com\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert control_ops.who(None) == "erin@example.com"
    assert control_ops.who("frank") == "frank"
    fake.write_text("#!/bin/sh\necho '(unset)'\n")
    with pytest.raises(control.ControlError, match="--by NAME"):
        control_ops.who(None)
