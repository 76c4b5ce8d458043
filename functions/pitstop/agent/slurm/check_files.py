"""A check's records on the controller: its directory, its lock, ``state.json`` and ``result.json``.

A part of the agent's checks by responsibility (fenced.py, gang.py and runner.py hold one): only
the files, no Slurm. One directory per check name under ``CheckTools.directory`` (0o700); starts,
results and the runner's finish take turns on its lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from pitstop.agent.slurm.records import CheckState, RunOutcome


class CheckFiles:
    """The checks' directory (``directory``): one locked directory per check."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def path(self, name: str) -> Path:
        return Path(self.directory) / name  # a CHECK_NAME: no separators, no dots

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[Path]:
        """The check's directory, held exclusively (starts, results and the runner's finish take turns)."""
        Path(self.directory).mkdir(parents=True, exist_ok=True, mode=0o700)
        d = self.path(name)
        d.mkdir(exist_ok=True, mode=0o700)
        fd = os.open(d / "state.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield d
        finally:
            os.close(fd)

    @staticmethod
    def load(d: Path) -> CheckState | None:
        try:
            st: CheckState = json.loads((d / "state.json").read_text())
        except FileNotFoundError:
            return None
        return st

    @staticmethod
    def save(d: Path, st: CheckState) -> None:
        tmp = d / "state.json.tmp"
        tmp.write_text(json.dumps(st, indent=1))
        os.replace(tmp, d / "state.json")


def write_result(d: Path, doc: RunOutcome) -> None:
    """``result.json`` of the check in ``d``, replaced whole (a reader never sees half of it)."""
    path = d / "result.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
