"""The CLI as an operator meets it: a message naming the fix instead of a traceback, help for every
flag, the version, the chaos kinds, standard input announced, progress on stderr, --config."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pitstop.tools import cli
from pitstop.tools.cli import errors
from pitstop.tools.progress import Progress
from tests.helpers import ops_agent_entry

ROOT = Path(__file__).resolve().parents[2]
PITSTOP = [sys.executable, "-m", "pitstop.tools.cli"]


def _bare_env(home: Path) -> dict[str, str]:
    """No Google credentials, no emulators, no kubeconfig, no Pitstop settings; HOME empty. The
    metadata server (how google-auth finds credentials on a VM) is never asked: NO_GCE_CHECK."""
    keep = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT / "functions"), "LANG": "C.UTF-8"}
    return keep | {
        "HOME": str(home),
        "NO_GCE_CHECK": "True",
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9",
        "CLOUDSDK_CONFIG": str(home / "gcloud"),
        "PITSTOP_LOCAL_DIR": str(home / "local"),
    }


# Each verb run the way an operator without credentials, files or a cluster would run it, and
# what its one line must name (the fix). Every verb of the CLI is here (the test below checks).
WITHOUT = {
    "classify": (["classify", "missing.jsonl"], "No such file"),
    "bench": (["bench", "nothing"], "invalid choice"),
    "incidents": (["incidents", "--project", "my-proj"], "gcloud auth application-default login"),
    "pause": (["pause", "--reason", "r", "--by", "me", "--project", "my-proj"], "application-default login"),
    "resume": (["resume", "--by", "me", "--project", "my-proj"], "application-default login"),
    "mode": (["mode", "enforce", "--cluster", "train", "--reason", "r", "--project", "my-proj"], "login"),
    "silence": (["silence", "--list", "--project", "my-proj"], "gcloud auth application-default login"),
    "replay": (["replay", "--since", "6h", "--project", "my-proj"], "gcloud auth application-default login"),
    "local": (["local", "status"], "pitstop local up"),
    "deploy": (["deploy", "--project", "my-proj", "--config", "missing.yaml"], "--config missing.yaml"),
    "teardown": (["teardown", "--project", "my-proj"], "--yes"),
    "demo": (["demo", "--only", "no_such_scenario"], "one of: xid79"),
    "doctor": (["doctor"], "--kubeconfig"),
    "simulate": (["simulate", "--scenario", "missing.yaml"], "No such file"),
    "report": (["report", "--out", "week.html"], "gcloud auth application-default login"),
}


def test_every_verb_is_run_without_credentials() -> None:
    verbs = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(WITHOUT) == set(verbs.choices or {})


@pytest.mark.parametrize("verb", sorted(WITHOUT))
def test_a_verb_without_credentials_or_files_says_what_to_do_without_a_traceback(
    verb: str, tmp_path: Path
) -> None:
    argv, fix = WITHOUT[verb]
    proc = subprocess.run(
        [*PITSTOP, *argv],
        capture_output=True,
        text=True,
        env=_bare_env(tmp_path),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert fix in proc.stderr, proc.stderr
    assert not (tmp_path / "week.html").exists()


def test_known_failures_are_explained_and_bugs_are_not() -> None:
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import DefaultCredentialsError

    no_credentials = DefaultCredentialsError("none")  # type: ignore[no-untyped-call]
    assert "application-default login" in (errors.explain(no_credentials) or "")
    denied = gexc.PermissionDenied("no")  # type: ignore[no-untyped-call]
    assert "datastore.viewer" in (errors.explain(denied) or "")
    no_project = OSError("Project was not passed and could not be determined from the environment.")
    assert "--project" in (errors.explain(no_project) or "")
    assert errors.explain(KeyError("a bug")) is None
    assert errors.explain(OSError("disk on fire")) is None


def _parsers(p: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, p)]
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in (a.choices or {}).items():
                out += _parsers(sub, f"{path} {name}")
    return out


def test_every_verb_and_every_flag_has_help() -> None:
    missing = []
    for path, p in _parsers(cli.build_parser(), "pitstop"):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                helped = {c.dest for c in a._choices_actions if c.help}
                missing += [f"{path} {name}" for name in a.choices or {} if name not in helped]
            elif not isinstance(a, argparse._HelpAction) and not a.help:
                missing.append(f"{path} {'/'.join(a.option_strings) or a.dest}")
    assert not missing, missing


def test_version_is_the_installed_packages_which_is_pyprojects(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"pitstop {want}"


def test_local_chaos_lists_its_kinds_in_help_and_on_a_bad_kind(capsys: pytest.CaptureFixture[str]) -> None:
    from pitstop.local.chaos import KINDS

    with pytest.raises(SystemExit):
        cli.main(["local", "chaos", "-h"])
    helped = " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as bad:
        cli.main(["local", "chaos", "meteor"])
    said = capsys.readouterr().err
    assert bad.value.code == 2 and "meteor" in said
    assert all(kind in helped and kind in said for kind in KINDS)


class _Terminal(io.TextIOWrapper):
    def isatty(self) -> bool:
        return True


def test_classify_with_no_path_at_a_terminal_says_it_reads_standard_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    line = json.dumps(ops_agent_entry("NVRM: Xid (PCI:0000:a1:00): 79, pid=1, name=x, fallen off the bus"))
    monkeypatch.setattr(sys, "stdin", _Terminal(io.BytesIO(f"{line}\n".encode())))
    assert cli.main(["classify"]) == 0
    out = capsys.readouterr()
    assert "reading JSON Lines from standard input" in out.err
    assert json.loads(out.out)["xid"] == 79
    monkeypatch.setattr(sys, "stdin", _Terminal(io.BytesIO(f"{line}\n".encode())))
    assert cli.main(["classify", "-"]) == 0  # asked for by name: no note
    assert capsys.readouterr().err == ""


def test_progress_prints_at_most_every_interval_unless_forced() -> None:
    now = [0.0]
    out = io.StringIO()
    p = Progress("replay", every_s=2.0, stream=out, clock=lambda: now[0])
    made: list[int] = []

    def text() -> str:
        made.append(1)
        return "working"

    for t in (0.0, 0.5, 1.9, 2.0, 2.1, 4.5):
        now[0] = t
        p.note(text)
    p.note("done", force=True)
    assert out.getvalue().splitlines() == ["pitstop replay: working"] * 3 + ["pitstop replay: done"]
    assert len(made) == 3  # the text is made only when printed


def test_replay_shows_its_progress_on_stderr_and_its_answer_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "export.jsonl"
    lines = [
        ops_agent_entry(f"NVRM: Xid (PCI:0000:a1:00): 79, pid={i}, name=x, off the bus") for i in range(3)
    ]
    export.write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert cli.main(["replay", str(export), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["entries"] == 3
    said = out.err.splitlines()
    assert said[0] == "pitstop replay: 1 entries read"  # reading (the first note is printed at once)
    assert "pitstop replay: 3 entries read, 3 events for the engine" in said


def test_simulate_shows_each_strategy_and_sweep_value_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--nodes", "16", "--days", "1", "--sweep", "nodes=8,16", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["sweep"]["field"] == "nodes"
    assert "pitstop simulate: --sweep nodes=8 (1 of 2)" in out.err
    assert "pitstop simulate: --sweep nodes=16 (2 of 2)" in out.err


def test_incidents_and_report_read_the_store_deploy_yaml_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--config: deploy.yaml's firestore_database and its policy's store.collection_prefix."""
    from pitstop.tools import common

    policy = tmp_path / "policy.yaml"
    policy.write_text("store: {collection_prefix: team_a}\n")
    config = tmp_path / "deploy.yaml"
    config.write_text(f"firestore_database: team-a-db\nnotify_database: team-a-notify\npolicy: {policy}\n")
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:9")  # a client, never a call
    monkeypatch.setenv("PITSTOP_FIRESTORE_DATABASE", "not-this-one")
    store, pol = common.store_and_policy("my-proj", str(config))
    assert store.db._database == "team-a-db" and store.collections.incidents.id == "team_a_incidents"
    assert pol.doc["store"]["collection_prefix"] == "team_a"
    for verb in (["incidents"], ["report", "--out", "x.html"]):
        args = cli.build_parser().parse_args([*verb, "--config", str(config)])
        assert args.config == str(config)
