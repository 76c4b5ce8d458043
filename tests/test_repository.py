"""Repository invariants: what is deployed matches what is tested."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r.strip(), maxsplit=1)[0].lower() for r in reqs if r.strip()}


def test_function_requirements_match_pyproject() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime = _names(pyproject["project"]["dependencies"])
    lines = [
        ln
        for ln in (ROOT / "functions/requirements.txt").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert _names(lines) == runtime
    # Same version floors too: a function must not deploy with older libraries than we test.
    assert sorted(ln.replace(" ", "") for ln in lines) == sorted(
        d.replace(" ", "") for d in pyproject["project"]["dependencies"]
    )


def test_layout_from_the_brief() -> None:
    for d in ("functions", "workflows", "schemas", "infra", "tests"):
        assert (ROOT / d).is_dir(), d
    assert (ROOT / "functions/main.py").is_file()
    assert (ROOT / "functions/pitstop/__init__.py").is_file()
